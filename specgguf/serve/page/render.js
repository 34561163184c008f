// Model text on the page, two ways. Rendered: markdown through marked (vendor/), whose HTML is
// sanitised by DOMPurify before it reaches the document (no model text becomes HTML any other way),
// code blocks highlighted by highlight.js (its HTML sanitised too) with a copy button each. Drafts:
// the raw text, each piece coloured by who wrote it (an accepted draft or the verifier), as
// `specgguf run` colours it in a terminal. The step statistics in words, plain decoding explained;
// and each message's view (`messageView`), its actions (edit, regenerate) as buttons page.js answers.
"use strict";

const WRITERS = new Set(["model", "ngram", "grammar", "verifier"]);
const PURIFY = { FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "img"], FORBID_ATTR: ["style"] };

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank"); // a link leaves the chat alone...
    node.setAttribute("rel", "noopener noreferrer"); // ...and tells the other site nothing
  }
});

function sanitised(html) {
  return DOMPurify.sanitize(html, { ...PURIFY, RETURN_DOM_FRAGMENT: true });
}

function renderMarkdown(target, text) {
  const fragment = sanitised(marked.parse(text, { async: false, gfm: true }));
  for (const code of fragment.querySelectorAll("pre > code")) decorateCode(code);
  target.replaceChildren(fragment);
}

// A code block: highlighted where its language is known, under a bar with the language and a copy button.
function decorateCode(code) {
  const language = ((code.className.match(/\blanguage-([\w+#.-]+)/) || [])[1] || "").toLowerCase();
  const source = code.textContent;
  if (language && hljs.getLanguage(language)) {
    const html = hljs.highlight(source, { language, ignoreIllegals: true }).value;
    code.replaceChildren(sanitised(html));
    code.classList.add("hljs");
  }
  const pre = code.parentElement;
  const block = document.createElement("div");
  block.className = "code";
  const bar = document.createElement("div");
  bar.className = "code-bar";
  const label = document.createElement("span");
  label.textContent = language || "code";
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "copy";
  bar.append(label, copy);
  pre.replaceWith(block);
  block.append(bar, pre);
}

async function copyCode(button) {
  const text = button.closest(".code").querySelector("code").textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = document.createElement("textarea"); // no clipboard API (not a secure context)
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  button.textContent = "copied";
  setTimeout(() => (button.textContent = "copy"), 1500);
}

// The drafts view: pieces [[writer, text], ...] as spans, one per run of one writer.
function appendPiece(body, text, writer) {
  writer = WRITERS.has(writer) ? writer : "verifier";
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

function renderPieces(body, pieces, content) {
  body.replaceChildren();
  const hasMarks = Array.isArray(pieces) && pieces.length && pieces.every((p) => Array.isArray(p) && typeof p[1] === "string");
  if (!hasMarks) body.textContent = content || "";
  else for (const [writer, text] of pieces) appendPiece(body, text, writer);
}

// A chunk's new pieces: its marks, or one verifier piece when it has none.
function chunkPieces(chunk) {
  const choice = (chunk.choices && chunk.choices[0]) || {};
  const content = (choice.delta && choice.delta.content) || "";
  const spans = (chunk.specgguf && chunk.specgguf.spans) || [];
  if (spans.length) return spans.map((span) => [WRITERS.has(span.source) ? span.source : "verifier", span.text]);
  return content ? [["verifier", content]] : [];
}

// Why an answer had no drafts, from what its stats say (the server's K policy decides per step).
function plainReason(stats) {
  if (!stats.n_steps) return "nothing was generated";
  return (
    `the server drafted in none of its ${stats.n_steps} steps: its K policy drafts only where a draft` +
    " is expected to pay (no drafter for this request, a draft token too slow next to the verifier's" +
    " on this machine, or other requests sharing each pass), so the verifier decoded alone"
  );
}

function statsLine(stats, timings, finishReason) {
  const speculation =
    stats.acceptance_rate === null
      ? `plain decoding (${plainReason(stats)})`
      : `acceptance ${Math.round(stats.acceptance_rate * 100)}% (${stats.n_accepted}/${stats.n_drafted})`;
  const parts = [
    `${stats.n_tokens} tokens in ${stats.seconds.generation.toFixed(2)} s`,
    `${stats.tokens_per_second.toFixed(1)} tok/s`,
    speculation,
    `${stats.tokens_per_step.toFixed(2)} tokens/step`,
  ];
  if (timings) parts.push(`prompt ${timings.prompt_n} tokens read, ${timings.cache_n} cached`);
  if (stats.acceptance_rate !== null && stats.n_plain_steps) {
    parts.push(`${stats.n_plain_steps} of ${stats.n_steps} steps plain (no draft was worth it there)`);
  }
  if (finishReason === "length") parts.push("cut at max tokens");
  return parts.join(" · ");
}

// --- a message on the page: the question as typed, or the answer both ways, with its actions ---

function button(label, action, title) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = label;
  element.dataset.action = action;
  if (title) element.title = title;
  return element;
}

function messageView(message, index) {
  const item = document.createElement("li");
  item.className = message.role;
  item.dataset.index = String(index);
  const text = document.createElement("div");
  text.className = "text";
  if (message.role === "user") {
    text.textContent = message.content; // a question is shown as typed
    item.append(text);
  } else {
    const rendered = document.createElement("div");
    rendered.className = "md";
    renderMarkdown(rendered, message.content);
    renderPieces(text, message.pieces, message.content);
    item.append(rendered, text);
  }
  for (const [name, className] of [["stats", "stats"], ["error", "error"]]) {
    if (message[name]) item.append(line(className, message[name]));
  }
  const actions = document.createElement("div");
  actions.className = "actions";
  if (message.role === "user") actions.append(button("edit", "edit", "edit this question and send it again"));
  else actions.append(button("regenerate", "regenerate", "answer this question again"));
  item.append(actions);
  return item;
}

function line(className, text) {
  const element = document.createElement("div");
  element.className = className;
  element.textContent = text;
  return element;
}
