// The page at `/` of `specgguf serve`: a chat over the server's own /v1/chat/completions (stream:
// true). Answers are rendered as markdown (render.js: sanitised by DOMPurify, code highlighted, a
// copy button per block) or, with "show who wrote each piece", as raw text coloured by who wrote it:
// the page asks for the `specgguf` marks ("speculative": {"mark_drafts": true}). Conversations,
// settings (system prompt, temperature, top-p, max tokens) and the theme live in localStorage
// (store.js); each answer can be regenerated and each question edited and sent again.
"use strict";

const KEY_STORE = "specgguf-api-key"; // this tab only (sessionStorage)
const METRICS_EVERY_MS = 10000;
const $ = (id) => document.getElementById(id);
let current = null; // the conversation shown: {id, title, updated, messages}
let running = null; // the AbortController of the answer being streamed

function requestHeaders(json) {
  const headers = json ? { "Content-Type": "application/json" } : {};
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = "Bearer " + key;
  return headers;
}

function notice(text, isError) {
  $("notice").textContent = text;
  $("notice").className = isError ? "error" : "";
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// A refused question moves the cursor to the key; a refused page load only when nothing else has it,
// so what someone types into another field while the page loads stays in that field.
function askForKey(message, { always = true } = {}) {
  notice(`${message} (enter the server's API key above)`, true);
  if (always || document.activeElement === document.body) $("key").focus();
}

async function loadModel() {
  const response = await fetch("v1/models", { headers: requestHeaders(false) });
  if (!response.ok) {
    const message = await errorMessage(response);
    return response.status === 401 ? askForKey(message, { always: false }) : notice(message, true);
  }
  const body = await response.json();
  $("model").textContent = "· " + body.data.map((model) => model.id).join(", ");
  notice("", false);
}

// --- the conversation on the page ---

function showConversation() {
  $("messages").replaceChildren(...current.messages.map(messageView));
  const last = $("messages").lastElementChild;
  if (last) last.scrollIntoView({ block: "end" });
  showConversationList();
}

function showConversationList() {
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of store.conversations()) {
    const item = document.createElement("li");
    item.dataset.id = conversation.id;
    if (conversation.id === current.id) item.className = "current";
    const open = button(conversation.title || "(empty)", "open");
    open.className = "open";
    item.append(open, button("×", "delete", "delete this conversation"));
    list.append(item);
  }
}

function openConversation(conversation) {
  if (running) running.abort();
  current = conversation;
  store.setCurrent(current.id);
  showConversation();
}

function save(conversation = current) {
  if (!conversation.title) {
    const first = conversation.messages.find((message) => message.role === "user");
    if (first) conversation.title = first.content.slice(0, 60);
  }
  if (conversation.messages.length && !store.save(conversation)) notice("this browser's storage is full or off", true);
  showConversationList();
}

// --- asking ---

// Server-sent events from a fetch body: each `data:` line parsed, up to `data: [DONE]`.
async function* streamedChunks(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const dataLine of event.split("\n")) {
        if (!dataLine.startsWith("data: ")) continue;
        if (dataLine === "data: [DONE]") return;
        yield JSON.parse(dataLine.slice(6));
      }
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.classList.toggle("busy", busy);
}

function requestBody() {
  const settings = store.settings();
  const messages = [];
  for (const message of current.messages) {
    if (message.error) messages.pop(); // a question that was not answered is not sent again
    else messages.push({ role: message.role, content: message.content });
  }
  if (settings.system.trim()) messages.unshift({ role: "system", content: settings.system });
  const body = { messages, stream: true, speculative: { mark_drafts: true } };
  for (const name of ["temperature", "top_p", "max_tokens"]) {
    if (settings[name] !== "") body[name] = Number(settings[name]);
  }
  return JSON.stringify(body);
}

// Answer the conversation as it stands (its last message is a question).
async function answer() {
  const body = requestBody();
  const conversation = current; // where the answer goes, even if another is opened meanwhile
  const message = { role: "assistant", content: "", pieces: [] };
  conversation.messages.push(message);
  const index = conversation.messages.length - 1;
  const item = messageView(message, index);
  $("messages").append(item);
  item.scrollIntoView({ block: "end" });
  const rendered = item.querySelector(".md");
  const text = item.querySelector(".text");
  let pending = false; // one markdown render per frame, however many chunks came
  const render = () => {
    pending = false;
    renderMarkdown(rendered, message.content);
  };
  running = new AbortController();
  setBusy(true);
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST",
      headers: requestHeaders(true),
      body,
      signal: running.signal,
    });
    if (!response.ok) {
      const error = await errorMessage(response);
      if (response.status === 401) askForKey(error);
      throw new Error(error);
    }
    for await (const chunk of streamedChunks(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      for (const [writer, piece] of chunkPieces(chunk)) {
        message.pieces.push([writer, piece]);
        message.content += piece;
        appendPiece(text, piece, writer);
      }
      if (!pending) (pending = true), requestAnimationFrame(render);
      if (chunk.specgguf && chunk.specgguf.stats) {
        message.stats = statsLine(chunk.specgguf.stats, chunk.timings, chunk.choices[0].finish_reason);
      }
    }
  } catch (error) {
    if (error.name === "AbortError") message.stats = "stopped"; // what was shown stays in the chat
    else message.error = error.message; // not sent with the next turn
  } finally {
    running = null;
    setBusy(false);
    if (item.isConnected) {
      item.replaceWith(messageView(message, index));
      $("messages").lastElementChild.scrollIntoView({ block: "end" });
    }
    save(conversation);
    refreshMetrics();
  }
}

function send(text) {
  current.messages.push({ role: "user", content: text });
  $("messages").append(messageView(current.messages.at(-1), current.messages.length - 1));
  save();
  answer();
}

function regenerate(index) {
  current.messages.splice(index); // this answer and anything after it
  showConversation();
  answer();
}

function edit(item, index) {
  const editor = document.createElement("textarea");
  editor.className = "editor";
  editor.value = current.messages[index].content;
  const row = document.createElement("div");
  row.className = "row";
  row.append(button("send", "resend"), button("cancel", "cancel"));
  item.replaceChildren(editor, row);
  editor.focus();
}

// --- wiring ---

$("messages").addEventListener("click", (event) => {
  const target = event.target;
  if (target.matches("button.copy")) return copyCode(target);
  const item = target.closest("li");
  const action = target.dataset && target.dataset.action;
  if (!item || !action || running) return;
  const index = Number(item.dataset.index);
  if (action === "regenerate") regenerate(index);
  else if (action === "edit") edit(item, index);
  else if (action === "cancel") showConversation();
  else if (action === "resend") {
    const text = item.querySelector(".editor").value.trim();
    if (!text) return;
    current.messages.splice(index); // the question edited, and everything after it, goes
    showConversation();
    send(text);
  }
});
$("conversations").addEventListener("click", (event) => {
  const item = event.target.closest("li");
  if (!item) return;
  if (event.target.dataset.action === "delete") {
    if (running) return; // the answer being written would save its conversation again
    store.remove(item.dataset.id);
    if (item.dataset.id === current.id) openConversation(store.conversations()[0] || newConversation());
    else showConversationList();
  } else if (event.target.dataset.action === "open") {
    openConversation(store.conversation(item.dataset.id) || newConversation());
  }
});
$("new-chat").addEventListener("click", () => openConversation(newConversation()));
$("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || running) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("ask").requestSubmit();
  }
});
$("stop").addEventListener("click", () => running && running.abort());
$("refresh").addEventListener("click", refreshMetrics);
const FIELDS = { system: "system", temperature: "temperature", top_p: "top-p", max_tokens: "max-tokens" };
function saveSettings() {
  const settings = Object.fromEntries(Object.entries(FIELDS).map(([name, id]) => [name, $(id).value]));
  settings.drafts = $("drafts").checked ? "on" : "";
  document.body.classList.toggle("show-drafts", $("drafts").checked);
  store.saveSettings(settings);
}
for (const id of [...Object.values(FIELDS), "drafts"]) $(id).addEventListener("input", saveSettings);
$("theme").addEventListener("click", () => {
  const theme = shownTheme() === "dark" ? "light" : "dark";
  applyTheme(theme);
  store.saveTheme(theme);
  $("theme-name").textContent = theme;
});
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("key").value.trim();
  if (key) sessionStorage.setItem(KEY_STORE, key);
  else sessionStorage.removeItem(KEY_STORE);
  $("key").value = "";
  $("key").placeholder = key ? "key set for this tab" : "only if the server has --api-key";
  loadModel();
  refreshMetrics();
});

const settings = store.settings();
for (const [name, id] of Object.entries(FIELDS)) $(id).value = settings[name];
$("drafts").checked = settings.drafts === "on";
document.body.classList.toggle("show-drafts", $("drafts").checked);
applyTheme(store.theme());
$("theme-name").textContent = shownTheme();
openConversation(store.conversation(store.currentId()) || newConversation());
setInterval(() => document.hidden || refreshMetrics(), METRICS_EVERY_MS);
loadModel();
refreshMetrics();
