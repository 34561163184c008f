// The page at `/` of `specgguf serve`: a chat over the server's own /v1/chat/completions
// (stream: true), with the text that accepted drafts wrote coloured as the terminal colours it, the
// step statistics after each answer, and /metrics at a glance. It asks for the `specgguf` marks
// ("speculative": {"mark_drafts": true}): each chunk's text split by who wrote it. Model text is only
// ever set as textContent, never parsed as HTML.
"use strict";

const KEY_STORE = "specgguf-api-key"; // this tab only (sessionStorage)
const WRITERS = new Set(["model", "ngram", "grammar", "verifier"]);
const METRICS_EVERY_MS = 10000;
const $ = (id) => document.getElementById(id);
const conversation = []; // {role, content}, sent whole with every turn
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

function askForKey(message) {
  notice(`${message} (enter the server's API key above)`, true);
  $("key").focus();
}

async function loadModel() {
  const response = await fetch("v1/models", { headers: requestHeaders(false) });
  if (!response.ok) {
    const message = await errorMessage(response);
    return response.status === 401 ? askForKey(message) : notice(message, true);
  }
  const body = await response.json();
  $("model").textContent = "· " + body.data.map((model) => model.id).join(", ");
  notice("", false);
}

// --- the chat ---

function addMessage(role, text) {
  const item = document.createElement("li");
  item.className = role;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  item.append(body);
  $("messages").append(item);
  item.scrollIntoView({ block: "end" });
  return body;
}

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
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") return;
        yield JSON.parse(line.slice(6));
      }
    }
  }
}

function appendPiece(body, text, writer) {
  const last = body.lastElementChild;
  if (last && last.dataset.writer === writer && last === body.lastChild) {
    last.textContent += text; // the same writer goes on: one span
    return;
  }
  const piece = document.createElement("span");
  piece.className = "w-" + writer;
  piece.dataset.writer = writer;
  piece.textContent = text;
  body.append(piece);
}

// A chunk's text, appended by writer (the marks), or plain when a chunk has none; returns the text.
function appendChunk(body, chunk) {
  const choice = (chunk.choices && chunk.choices[0]) || {};
  const content = (choice.delta && choice.delta.content) || "";
  const spans = (chunk.specgguf && chunk.specgguf.spans) || [];
  if (spans.length) {
    for (const span of spans) appendPiece(body, span.text, WRITERS.has(span.source) ? span.source : "verifier");
  } else if (content) {
    body.append(document.createTextNode(content));
  }
  return content;
}

function statsLine(stats, timings, finishReason) {
  const acceptance =
    stats.acceptance_rate === null
      ? "plain decoding"
      : `acceptance ${Math.round(stats.acceptance_rate * 100)}% (${stats.n_accepted}/${stats.n_drafted})`;
  const parts = [
    `${stats.n_tokens} tokens in ${stats.seconds.generation.toFixed(2)} s`,
    `${stats.tokens_per_second.toFixed(1)} tok/s`,
    acceptance,
    `${stats.tokens_per_step.toFixed(2)} tokens/step`,
  ];
  if (timings) parts.push(`prompt ${timings.prompt_n} tokens read, ${timings.cache_n} cached`);
  if (finishReason === "length") parts.push("cut at max tokens");
  return parts.join(" · ");
}

function showLine(item, className, text) {
  const line = document.createElement("div");
  line.className = className;
  line.textContent = text;
  item.append(line);
  item.scrollIntoView({ block: "end" });
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function requestBody() {
  const body = { messages: conversation, stream: true, speculative: { mark_drafts: true } };
  const temperature = $("temperature").value;
  const maxTokens = $("max-tokens").value;
  if (temperature !== "") body.temperature = Number(temperature);
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  return JSON.stringify(body);
}

async function send(text) {
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
  const body = addMessage("assistant", "");
  const item = body.parentElement;
  running = new AbortController();
  setBusy(true);
  let answer = "";
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST",
      headers: requestHeaders(true),
      body: requestBody(),
      signal: running.signal,
    });
    if (!response.ok) {
      const message = await errorMessage(response);
      if (response.status === 401) askForKey(message);
      throw new Error(message);
    }
    for await (const chunk of streamedChunks(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      answer += appendChunk(body, chunk);
      if (chunk.specgguf && chunk.specgguf.stats) {
        showLine(item, "stats", statsLine(chunk.specgguf.stats, chunk.timings, chunk.choices[0].finish_reason));
      }
    }
    conversation.push({ role: "assistant", content: answer });
  } catch (error) {
    if (error.name === "AbortError") {
      conversation.push({ role: "assistant", content: answer }); // what was shown stays in the chat
      showLine(item, "stats", "stopped");
    } else {
      conversation.pop(); // the question was not answered: the next turn does not carry it
      showLine(item, "error", error.message);
    }
  } finally {
    running = null;
    setBusy(false);
    refreshMetrics();
  }
}

// --- /metrics at a glance ---

// Prometheus text -> {name: value}, summed over each sample's labels.
function parseMetrics(text) {
  const values = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const space = line.lastIndexOf(" ");
    const sample = line.slice(0, space);
    const name = sample.includes("{") ? sample.slice(0, sample.indexOf("{")) : sample;
    values[name] = (values[name] || 0) + Number(line.slice(space + 1));
  }
  return values;
}

function ratio(numerator, denominator) {
  return denominator ? numerator / denominator : null;
}

function figures(values) {
  const get = (name) => values["specgguf_" + name] || 0;
  const acceptance = ratio(get("tokens_accepted_total"), get("tokens_drafted_total"));
  const speed = ratio(get("tokens_per_second_sum"), get("tokens_per_second_count"));
  const firstToken = ratio(get("time_to_first_token_seconds_sum"), get("time_to_first_token_seconds_count"));
  const cached = ratio(get("prompt_tokens_cached_total"), get("prompt_tokens_total"));
  const percent = (value) => (value === null ? "–" : `${Math.round(value * 100)}%`);
  return [
    ["requests", String(get("requests_total"))],
    ["waiting", String(get("queue_length"))],
    ["tokens generated", String(get("tokens_generated_total"))],
    ["draft acceptance", percent(acceptance)],
    ["mean tok/s", speed === null ? "–" : speed.toFixed(1)],
    ["mean first token", firstToken === null ? "–" : `${Math.round(firstToken * 1000)} ms`],
    ["prompt cached", percent(cached)],
  ];
}

async function refreshMetrics() {
  let response;
  try {
    response = await fetch("metrics", { headers: requestHeaders(false) });
  } catch (error) {
    $("metrics-note").textContent = "the server does not answer";
    return;
  }
  if (!response.ok) {
    $("metrics-note").textContent = await errorMessage(response);
    return;
  }
  const list = $("figures");
  list.replaceChildren();
  for (const [label, value] of figures(parseMetrics(await response.text()))) {
    const term = document.createElement("dt");
    const detail = document.createElement("dd");
    term.textContent = label;
    detail.textContent = value;
    list.append(term, detail);
  }
  $("metrics-note").textContent = "since the server started · GET /metrics";
}

// --- wiring ---

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
$("new-chat").addEventListener("click", () => {
  if (running) running.abort();
  conversation.length = 0;
  $("messages").replaceChildren();
});
$("refresh").addEventListener("click", refreshMetrics);
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
setInterval(() => document.hidden || refreshMetrics(), METRICS_EVERY_MS);
loadModel();
refreshMetrics();
