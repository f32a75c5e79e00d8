// The chat page: streams /v1/chat/completions, shows each reply's speed and token hash, and
// replays a request to show that the same request gives the same tokens.
"use strict";

const STORE = { chat: "tensorfold.chat.v1", settings: "tensorfold.settings.v1" };
const KEY_STORE = "tensorfold.apiKey";
const $ = (id) => document.getElementById(id);

const page = {
  model: null,
  messages: [],        // {role, content, reasoning?, tools?, stats?, request?, sha?, error?}
  abort: null,         // the AbortController of the reply being streamed
  keyWaiters: null,    // callers waiting for the key dialog
};

// -- storage ------------------------------------------------------------------------------------

function load(name, fallback) {
  try {
    return JSON.parse(localStorage.getItem(name)) ?? fallback;
  } catch {
    return fallback;
  }
}

function saveChat() {
  localStorage.setItem(STORE.chat, JSON.stringify(page.messages));
}

const SETTING_IDS = ["thinking", "context", "temperature", "seed", "max-tokens", "system"];
const SINGLE_TURN_MODELS = ["tensorfold-demo"];   // trained on single questions only

function saveSettings() {
  const values = {};
  for (const id of SETTING_IDS) {
    const el = $(id);
    values[id] = el.type === "checkbox" ? el.checked : el.value;
  }
  localStorage.setItem(STORE.settings, JSON.stringify(values));
}

function restoreSettings() {
  const values = load(STORE.settings, {});
  for (const id of SETTING_IDS) {
    if (!(id in values)) continue;
    const el = $(id);
    if (el.type === "checkbox") el.checked = values[id];
    else el.value = values[id];
  }
}

// -- the API, with the key when the server wants one -------------------------------------------

function askKey(refused) {
  $("key-error").hidden = !refused;
  $("key-input").value = "";
  if (!$("key-dialog").open) $("key-dialog").showModal();
  return new Promise((resolve) => {
    (page.keyWaiters ??= []).push(resolve);
  });
}

function keyEntered(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORE, key);
  $("key-dialog").close();
  const waiters = page.keyWaiters || [];
  page.keyWaiters = null;
  waiters.forEach((resolve) => resolve());
}

async function api(path, options = {}) {
  for (let refused = false; ; refused = true) {
    const headers = { "Content-Type": "application/json", ...(options.headers || {}) };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = `Bearer ${key}`;
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401) return response;
    sessionStorage.removeItem(KEY_STORE);
    await askKey(refused || Boolean(key));
  }
}

async function errorText(response) {
  try {
    const body = await response.json();
    return body.error?.message || JSON.stringify(body);
  } catch {
    return `HTTP ${response.status}`;
  }
}

// -- one streamed reply -------------------------------------------------------------------------

function newReply() {
  return { raw: "", reasoning: "", ids: [], tools: [], usage: null, fingerprint: null,
           finish: null, sent: performance.now(), first: null, last: null, firstCount: 0,
           chunks: 0 };
}

function readChoice(reply, choice) {
  const delta = choice.delta || {};
  const thought = delta.reasoning_content || delta.reasoning || "";
  reply.reasoning += thought;
  reply.raw += delta.content || "";
  for (const call of delta.tool_calls || []) {
    const slot = (reply.tools[call.index ?? reply.tools.length] ??= { name: "", arguments: "" });
    slot.name += call.function?.name || "";
    slot.arguments += call.function?.arguments || "";
  }
  const ids = choice.token_ids || [];
  reply.ids.push(...ids);
  if (choice.finish_reason) reply.finish = choice.finish_reason;
  return ids.length || (delta.content || thought ? 1 : 0);
}

function readChunk(reply, chunk) {
  if (chunk.error) throw new Error(chunk.error.message || "the server failed");
  if (chunk.system_fingerprint) reply.fingerprint = chunk.system_fingerprint;
  if (chunk.usage) reply.usage = chunk.usage;
  let tokens = 0;
  for (const choice of chunk.choices || []) {
    if (choice.index === 0) tokens += readChoice(reply, choice);
  }
  if (tokens) {
    const now = performance.now();
    if (reply.first === null) {
      reply.first = now;
      reply.firstCount = tokens;
    }
    reply.last = now;
    reply.chunks += tokens;
  }
}

async function stream(body, signal, onChunk) {
  const response = await api("/v1/chat/completions", {
    method: "POST", body: JSON.stringify(body), signal });
  if (!response.ok) throw new Error(await errorText(response));
  const reply = newReply();
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split("\n\n");
    buffer = events.pop();
    for (const event of events) {
      const data = event.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trim()).join("");
      if (!data || data === "[DONE]") continue;
      readChunk(reply, JSON.parse(data));
      onChunk(reply);
    }
  }
  return reply;
}

// Thinking: a reasoning field when the server sends one, else the text before </think>.
function split(reply, thinking) {
  if (reply.reasoning) return { reasoning: reply.reasoning, answer: reply.raw };
  const raw = reply.raw.replace(/^\s*<think>/, "");
  const end = raw.indexOf("</think>");
  if (end >= 0) return { reasoning: raw.slice(0, end).trim(), answer: raw.slice(end + 8).trim() };
  if (!thinking) return { reasoning: "", answer: raw };
  return { reasoning: raw.trim(), answer: "", thinking: true };      // no </think> yet
}

function stats(reply) {
  const done = reply.usage?.completion_tokens ?? (reply.ids.length || reply.chunks);
  const span = (reply.last - reply.first) / 1000;
  return {
    tokens: done,
    tok_s: span > 0 ? (done - reply.firstCount) / span : null,
    ttft_ms: reply.first === null ? null : reply.first - reply.sent,
    cached: reply.usage?.prompt_tokens_details?.cached_tokens ?? null,
    fingerprint: reply.fingerprint,
    finish: reply.finish,
  };
}

// -- requests -----------------------------------------------------------------------------------

function number(id) {
  const text = $(id).value.trim();
  return text === "" ? null : Number(text);
}

function requestFor(history) {
  const system = $("system").value.trim();
  const turns = $("context").checked ? history : history.slice(-1);
  const messages = turns.filter((m) => !m.error || m.content)
    // the trace goes back as reasoning_content: the template re-renders the turn as generated
    .map((m) => (m.role === "assistant" && m.reasoning
      ? { role: m.role, content: m.content, reasoning_content: m.reasoning }
      : { role: m.role, content: m.content }));
  const seed = number("seed") ?? Math.floor(Math.random() * 2 ** 31);
  const body = {
    model: page.model,
    messages: system ? [{ role: "system", content: system }, ...messages] : messages,
    stream: true, stream_options: { include_usage: true }, return_token_ids: true, seed,
    chat_template_kwargs: { enable_thinking: $("thinking").checked },
  };
  const maxTokens = number("max-tokens");
  if (maxTokens !== null) body.max_tokens = maxTokens;
  const temperature = number("temperature");
  if (temperature !== null) body.temperature = temperature;
  return body;
}

async function generate() {
  const history = page.messages.slice();
  const body = requestFor(history);
  const msg = { role: "assistant", content: "", request: body };
  page.messages.push(msg);
  const view = renderMessage(msg, page.messages.length - 1);
  const thinking = body.chat_template_kwargs.enable_thinking;
  busy(true);
  let reply = newReply();
  try {
    reply = await stream(body, page.abort.signal, (r) => {
      reply = r;
      fill(view, msg, r, thinking);
    });
    msg.sha = reply.ids.length ? await tokenSha(reply.ids) : null;
  } catch (err) {
    msg.error = err.name === "AbortError" ? "stopped" : err.message;
  } finally {
    fill(view, msg, reply, thinking, false);
    // a reply that ended while thinking (max tokens) keeps its trace in view
    view.querySelector(".thinking").open = Boolean(msg.reasoning && !msg.content);
    msg.stats = stats(reply);
    showStats(view, msg);
    busy(false);
    saveChat();
  }
}

function fill(view, msg, reply, thinking, live = true) {
  const parts = split(reply, thinking);
  msg.content = parts.answer;
  msg.reasoning = parts.reasoning;
  msg.tools = reply.tools.filter(Boolean);
  showBody(view, msg, live && Boolean(parts.thinking));
  scrollDown();
}

async function replay(index, view) {
  const msg = page.messages[index];
  const result = view.querySelector(".replay-result");
  result.className = "replay-result";
  result.textContent = "replaying…";
  try {
    const reply = await stream(msg.request, undefined, () => {});
    const sha = reply.ids.length ? await tokenSha(reply.ids) : null;
    msg.replay = sha && sha === msg.sha ? "match" : `differs: ${short(sha)}`;
  } catch (err) {
    msg.replay = `failed: ${err.message}`;
  }
  saveChat();
  showReplay(view, msg);
}

// -- rendering ----------------------------------------------------------------------------------

function short(sha) {
  return sha ? sha.slice(0, 12) : "-";
}

function renderMessage(msg, index) {
  $("empty").hidden = true;
  const view = $("message-template").content.firstElementChild.cloneNode(true);
  view.classList.add(msg.role);
  view.dataset.index = index;
  view.querySelector(".role").textContent = msg.role === "user" ? "You" : "TensorFold";
  view.querySelector(".replay").addEventListener("click", () => replay(index, view));
  view.querySelector(".copy-msg").replaceWith(
    markdown.copyButton(() => page.messages[index]?.content || "", "copy-msg"));
  const edit = view.querySelector(".edit");
  edit.hidden = msg.role !== "user";
  edit.addEventListener("click", () => editFrom(index));
  $("messages").append(view);
  showBody(view, msg);
  if (msg.stats) showStats(view, msg);
  return view;
}

function showBody(view, msg, stillThinking = false) {
  const block = view.querySelector(".thinking");
  block.hidden = !msg.reasoning && !stillThinking;
  block.classList.toggle("live", stillThinking);
  view.querySelector(".thinking-text").textContent = msg.reasoning || "";
  block.querySelector("summary").textContent = stillThinking ? "Thinking…" : "Thinking";
  markdown.render(view.querySelector(".answer"), msg.content || "");
  renderTools(view.querySelector(".tools"), toolCalls(msg));
  const error = view.querySelector(".error");
  error.hidden = !msg.error;
  error.textContent = msg.error ? `(${msg.error})` : "";
}

// Tool calls: the API's tool_calls, or Qwen's <tool_call> blocks in the text (JSON or XML form).
function toolCalls(msg) {
  const calls = (msg.tools || []).map((t) => ({ name: t.name, arguments: t.arguments }));
  for (const match of (msg.content || "").matchAll(/<tool_call>([\s\S]*?)(<\/tool_call>|$)/g)) {
    calls.push(parseToolCall(match[1].trim()));
  }
  return calls;
}

function parseToolCall(text) {
  const json = markdown.asJson(text);
  if (json && json.name) {
    return { name: json.name, arguments: json.arguments ?? json.parameters ?? {} };
  }
  const fn = text.match(/<function=([^>\n]+)>/);
  const args = {};
  for (const p of text.matchAll(/<parameter=([^>\n]+)>\n?([\s\S]*?)\n?<\/parameter>/g)) {
    args[p[1]] = p[2];
  }
  return { name: fn ? fn[1] : "(unparsed)", arguments: fn ? args : text };
}

function renderTools(el, calls) {
  el.hidden = calls.length === 0;
  el.replaceChildren(...calls.map((call) => {
    const card = document.createElement("div");
    card.className = "tool-call";
    const name = document.createElement("div");
    name.className = "tool-name";
    name.textContent = `tool call: ${call.name}`;
    let args = call.arguments;
    if (typeof args === "string") args = markdown.asJson(args) ?? args;
    const text = typeof args === "string" ? args : JSON.stringify(args, null, 2);
    card.append(name, markdown.codeBlock(text, "json"));
    return card;
  }));
}

function setStat(view, name, text, title) {
  const el = view.querySelector(`[data-stat="${name}"]`);
  el.textContent = text;
  if (title) el.title = title;
  return el;
}

function showStats(view, msg) {
  const s = msg.stats || {};
  view.querySelector(".stats").hidden = false;
  setStat(view, "tok_s", s.tok_s == null ? "– tok/s" : `${s.tok_s.toFixed(1)} tok/s`);
  setStat(view, "ttft", s.ttft_ms == null ? "TTFT –" : `TTFT ${Math.round(s.ttft_ms)} ms`);
  setStat(view, "tokens", `${s.tokens ?? "–"} tokens${s.finish ? ` (${s.finish})` : ""}`);
  setStat(view, "cached", `cached ${s.cached ?? "–"}`);
  setStat(view, "seed", `seed ${msg.request?.seed ?? "–"}`);
  setStat(view, "fingerprint", s.fingerprint || "fp –");  // the value is fp_…: no second prefix
  const sha = setStat(view, "sha", `sha ${short(msg.sha)}`, msg.sha || "no token ids");
  sha.dataset.sha = msg.sha || "";
  view.querySelector(".replay").hidden = !msg.sha;
  showReplay(view, msg);
}

function showReplay(view, msg) {
  const el = view.querySelector(".replay-result");
  el.textContent = msg.replay || "";
  el.className = `replay-result ${msg.replay === "match" ? "ok" : msg.replay ? "bad" : ""}`;
}

function renderAll() {
  $("messages").querySelectorAll(".msg").forEach((el) => el.remove());
  $("empty").hidden = page.messages.length > 0;
  page.messages.forEach((msg, i) => renderMessage(msg, i));
  scrollDown();
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function busy(on) {
  page.abort = on ? new AbortController() : null;
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("regenerate").disabled = on;
  $("status").textContent = on ? "generating…" : "ready";
  document.body.classList.toggle("busy", on);
}

// -- actions ------------------------------------------------------------------------------------

async function send(event) {
  event?.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || page.abort) return;
  $("prompt").value = "";
  page.messages.push({ role: "user", content: text });
  renderMessage(page.messages.at(-1), page.messages.length - 1);
  saveChat();
  await generate();
}

async function regenerate() {
  if (page.abort) return;
  while (page.messages.length && page.messages.at(-1).role === "assistant") page.messages.pop();
  if (!page.messages.length) return;
  renderAll();
  await generate();
}

// The message back in the composer, it and everything after it gone: sending asks again.
function editFrom(index) {
  if (page.abort) return;
  $("prompt").value = page.messages[index].content;
  page.messages = page.messages.slice(0, index);
  saveChat();
  renderAll();
  $("prompt").focus();
}

function openChat(id) {
  if (page.abort) page.abort.abort();
  page.messages = chats.switchTo(page.messages, id);
  saveChat();
  renderAll();
  renderChats();
}

function newChat() {
  openChat(null);
}

function renderChats() {
  $("chats").replaceChildren(...chats.list().map((c) => {
    const item = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "chat-open";
    open.textContent = c.title;
    open.title = `${c.messages.length} messages`;
    open.addEventListener("click", () => openChat(c.id));
    const drop = document.createElement("button");
    drop.type = "button";
    drop.className = "chat-delete";
    drop.textContent = "×";
    drop.title = "delete this conversation";
    drop.addEventListener("click", () => {
      chats.remove(c.id);
      renderChats();
    });
    item.append(open, drop);
    return item;
  }));
}

function toggleSettings() {
  const open = document.body.classList.toggle("settings-open");
  $("settings-toggle").setAttribute("aria-expanded", String(open));
}

async function connect() {
  $("status").textContent = "connecting…";
  try {
    const response = await api("/v1/models");
    if (!response.ok) throw new Error(await errorText(response));
    const card = (await response.json()).data[0];
    page.model = card.id;
    if (!("context" in load(STORE.settings, {}))) {
      $("context").checked = !SINGLE_TURN_MODELS.includes(card.id);
    }
    $("model").textContent = `${card.id} · context ${card.max_model_len ?? "?"}`;
    $("status").textContent = "ready";
  } catch (err) {
    $("status").textContent = `no server: ${err.message}`;
  }
}

function wire() {
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) send(e);
  });
  $("stop").addEventListener("click", () => page.abort?.abort());
  $("regenerate").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", newChat);
  $("settings-toggle").addEventListener("click", toggleSettings);
  $("key-form").addEventListener("submit", keyEntered);
  $("key-dialog").addEventListener("cancel", (e) => e.preventDefault());
  for (const id of SETTING_IDS) $(id).addEventListener("change", saveSettings);
  document.querySelectorAll(".example").forEach((b) => b.addEventListener("click", () => {
    $("prompt").value = b.textContent;
    send();
  }));
}

wire();
restoreSettings();
page.messages = load(STORE.chat, []);
renderAll();
renderChats();
connect();
