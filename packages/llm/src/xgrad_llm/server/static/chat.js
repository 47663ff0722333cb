// The chat page: conversations kept in localStorage, replies streamed from /v1/chat/completions (server-sent events)
// and rendered as markdown as they arrive, reasoning shown collapsed, a stop button (aborts the request: the server
// frees the slot), settings, and tokens/s per reply. Talks only to the server that served it.
"use strict";

const STORE = "xgrad-llm-chat-v1";
const SETTINGS = "xgrad-llm-settings-v1";
const DEFAULTS = { system: "", temperature: 0.7, top_p: 0.95, max_tokens: 512, api_key: "" };
const $ = (id) => document.getElementById(id);

const state = {
  conversations: [],  // [{id, title, messages: [{role, content, reasoning?, stats?, error?}]}]
  current: null,
  settings: { ...DEFAULTS },
  controller: null,
};

function load() {
  try { state.conversations = JSON.parse(localStorage.getItem(STORE) || "[]"); } catch { state.conversations = []; }
  try { state.settings = { ...DEFAULTS, ...JSON.parse(localStorage.getItem(SETTINGS) || "{}") }; } catch { /* defaults */ }
  state.current = state.conversations.length ? state.conversations[0].id : null;
}

function save() {
  localStorage.setItem(STORE, JSON.stringify(state.conversations));
  localStorage.setItem(SETTINGS, JSON.stringify(state.settings));
}

const conversation = () => state.conversations.find((c) => c.id === state.current) || null;

function newChat() {
  const c = { id: `${Date.now()}-${Math.random().toString(36).slice(2, 8)}`, title: "New chat", messages: [] };
  state.conversations.unshift(c);
  state.current = c.id;
  save();
  renderAll();
  $("input").focus();
}

// ---- rendering ----
function renderList() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of state.conversations) {
    const li = document.createElement("li");
    li.className = c.id === state.current ? "active" : "";
    const title = document.createElement("span");
    title.textContent = c.title;
    const del = document.createElement("button");
    del.textContent = "\u00d7";
    del.title = "Delete this chat";
    del.onclick = (e) => {
      e.stopPropagation();
      state.conversations = state.conversations.filter((x) => x.id !== c.id);
      if (state.current === c.id) state.current = state.conversations.length ? state.conversations[0].id : null;
      save();
      renderAll();
    };
    li.onclick = () => { if (!state.controller) { state.current = c.id; renderAll(); } };
    li.append(title, del);
    ul.append(li);
  }
}

function messageNode(m) {
  const div = document.createElement("div");
  div.className = `msg ${m.role}`;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = m.role === "user" ? "You" : "Assistant";
  div.append(who);
  if (m.reasoning) {
    const d = document.createElement("details");
    d.className = "reasoning";
    const s = document.createElement("summary");
    s.textContent = "Reasoning";
    const body = document.createElement("div");
    body.textContent = m.reasoning;
    d.append(s, body);
    div.append(d);
  }
  const body = document.createElement("div");
  body.className = "body";
  if (m.role === "user") body.textContent = m.content;
  else body.innerHTML = Markdown.render(m.content || "");
  div.append(body);
  if (m.error) {
    const e = document.createElement("div");
    e.className = "error";
    e.textContent = m.error;
    div.append(e);
  }
  if (m.stats) {
    const s = document.createElement("div");
    s.className = "stats";
    s.textContent = m.stats;
    div.append(s);
  }
  return div;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren(...(conversation()?.messages || []).map(messageNode));
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderList();
  renderMessages();
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
}

// ---- talking to the server ----
function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.settings.api_key) h.Authorization = `Bearer ${state.settings.api_key}`;
  return h;
}

async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function send(text) {
  let c = conversation();
  if (!c) { newChat(); c = conversation(); }
  if (!c.messages.length) c.title = text.slice(0, 40);
  c.messages.push({ role: "user", content: text });
  const reply = { role: "assistant", content: "", reasoning: "" };
  c.messages.push(reply);
  save();
  renderAll();
  const node = $("messages").lastChild;
  const s = state.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of c.messages.slice(0, -1)) messages.push({ role: m.role, content: m.content });
  const controller = new AbortController();
  state.controller = controller;
  busy(true);
  const started = performance.now();
  let first = null, usage = null, pieces = 0;
  let current = node;
  let said = "";
  const calls = [];
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({
        messages, stream: true, stream_options: { include_usage: true },
        temperature: +s.temperature, top_p: +s.top_p, max_tokens: +s.max_tokens,
      }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.error?.message || `HTTP ${response.status}`);
    }
    for await (const chunk of sse(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices?.[0]?.delta;
      if (!delta) continue;
      if (delta.content || delta.reasoning_content) {
        first = first ?? performance.now();
        pieces++;
      }
      said += delta.content || "";
      reply.reasoning += delta.reasoning_content || "";
      for (const call of delta.tool_calls || []) {  // a call's first delta names it, the next ones add arguments
        calls[call.index] ??= { name: call.function?.name || "", args: "" };
        calls[call.index].args += call.function?.arguments || "";
      }
      reply.content = said + calls.map((c) => `\n\`${c.name}(${c.args})\``).join("");
      const fresh = messageNode(reply);
      current.replaceWith(fresh);
      current = fresh;
      $("messages").scrollTop = $("messages").scrollHeight;
    }
  } catch (e) {
    if (e.name === "AbortError") reply.stats = "[stopped]";
    else reply.error = `Error: ${e.message}`;
  } finally {
    const end = performance.now();
    const n = usage?.completion_tokens ?? pieces;
    if (first !== null && n > 0) {
      const secs = Math.max((end - first) / 1000, 1e-3);
      const note = `${n} tokens, ${(n / secs).toFixed(1)} tokens/s, first token after ${((first - started) / 1000).toFixed(2)} s`;
      reply.stats = reply.stats ? `${reply.stats} ${note}` : note;
    }
    state.controller = null;
    busy(false);
    save();
    current.replaceWith(messageNode(reply));
    renderList();
  }
}

// ---- wiring ----
function bindSettings() {
  const fields = { system: "set-system", temperature: "set-temperature", top_p: "set-top-p", max_tokens: "set-max-tokens", api_key: "set-api-key" };
  for (const [key, id] of Object.entries(fields)) {
    const el = $(id);
    el.value = state.settings[key];
    el.addEventListener("change", () => { state.settings[key] = el.value; save(); });
  }
}

async function showModel() {
  try {
    const r = await fetch("v1/models", { headers: headers() });
    const body = await r.json();
    $("model-name").textContent = body.data ? `model: ${body.data[0].id}` : "";
  } catch { /* the page still works */ }
}

document.addEventListener("DOMContentLoaded", () => {
  load();
  bindSettings();
  renderAll();
  showModel();
  $("new-chat").onclick = () => { if (!state.controller) newChat(); };
  $("stop").onclick = () => state.controller?.abort();
  $("composer").onsubmit = (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || state.controller) return;
    $("input").value = "";
    send(text);
  };
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
  });
});
