// What the page keeps in this browser's localStorage: the conversations (each with its messages,
// their draft marks and statistics), the settings sent with each request, and the theme. The API
// key is not here: it stays in sessionStorage, for the tab only (page.js).
"use strict";

const STORE = {
  conversations: "specgguf-conversations", // [{id, title, updated, messages: [...]}], newest first
  current: "specgguf-current",
  settings: "specgguf-settings",
  theme: "specgguf-theme",
};
const SETTINGS = ["system", "temperature", "top_p", "max_tokens", "drafts"]; // empty: the server's default

function readJson(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value === null ? fallback : value;
  } catch {
    return fallback; // written by something else, or storage refused: start afresh
  }
}

function writeJson(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false; // full, or storage off (private mode): the page still works, it forgets
  }
}

// A message: {role: "user" | "assistant", content, pieces?: [[writer, text], ...], stats?, error?}.
const store = {
  conversations() {
    const list = readJson(STORE.conversations, []);
    return Array.isArray(list) ? list.filter(wellFormed) : [];
  },
  conversation(id) {
    return this.conversations().find((item) => item.id === id) || null;
  },
  save(conversation) {
    conversation.updated = Date.now();
    const others = this.conversations().filter((item) => item.id !== conversation.id);
    return writeJson(STORE.conversations, [conversation, ...others]);
  },
  remove(id) {
    writeJson(STORE.conversations, this.conversations().filter((item) => item.id !== id));
  },
  currentId() {
    return readJson(STORE.current, null);
  },
  setCurrent(id) {
    writeJson(STORE.current, id);
  },
  settings() {
    const saved = readJson(STORE.settings, {});
    return Object.fromEntries(SETTINGS.map((name) => [name, typeof saved[name] === "string" ? saved[name] : ""]));
  },
  saveSettings(settings) {
    writeJson(STORE.settings, settings);
  },
  theme() {
    return readJson(STORE.theme, "");
  },
  saveTheme(theme) {
    writeJson(STORE.theme, theme);
  },
};

// What another version of the page (or anything else on this origin) stored is checked, not trusted.
function wellFormed(conversation) {
  return (
    conversation &&
    typeof conversation.id === "string" &&
    Array.isArray(conversation.messages) &&
    conversation.messages.every(
      (message) => message && ["user", "assistant"].includes(message.role) && typeof message.content === "string"
    )
  );
}

function newConversation() {
  const id = Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  return { id, title: "", updated: Date.now(), messages: [] };
}

// The theme: "light" or "dark" as chosen, else the system's (prefers-color-scheme, page.css).
function applyTheme(theme) {
  if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}

function shownTheme() {
  const chosen = document.documentElement.dataset.theme;
  if (chosen) return chosen;
  return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}
