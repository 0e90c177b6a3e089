// WeDLM web chat: chat over POST /v1/chat/completions with stream: true. Multi-turn, unless
// /v1/models says the model is single-turn (its generation_config.json): then every question
// is sent alone (with the system prompt), and a note says so once.
// Every SSE chunk is what one decode step committed (the server's `wedlm_trace` adds the
// step index and token ids), so each chunk becomes one coloured span: a span holding
// several tokens is a parallel commit. Live stats: tokens/forward = tokens / steps so
// far, tok/s = tokens / seconds since the request; the final usage chunk gives the
// server's exact decode_forwards, tokens_per_forward and p_cache.
// A server started with --api-key needs `Authorization: Bearer <key>` on /v1/*: the key typed
// into the side panel is kept in this browser's localStorage and sent with every API call.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, history: [], controller: null, singleTurn: false };
const API_KEY_STORE = "wedlm-api-key";
const SINGLE_TURN_NOTE = "This model was trained on single questions: every message starts a fresh "
  + "conversation; earlier turns are not sent.";

function stepColour(step) {
  // Golden-angle hues: neighbouring steps get clearly different colours.
  return `hsl(${Math.round((step * 137.508) % 360)}, 75%, 84%)`;
}

// Headers of an API call: the JSON content type for a body, and the stored API key if any.
function apiHeaders(json) {
  const headers = json ? { "Content-Type": "application/json" } : {};
  const key = localStorage.getItem(API_KEY_STORE);
  if (key) headers["Authorization"] = `Bearer ${key}`;
  return headers;
}

async function loadModel() {
  try {
    const res = await fetch("/v1/models", { headers: apiHeaders(false) });
    const body = await res.json();
    if (!res.ok) throw new Error(body.error ? body.error.message : res.statusText);
    state.model = body.data[0].id;
    $("model").textContent = `${state.model} · context ${body.data[0].max_model_len}`;
    const defaults = body.data[0].wedlm;  // the engine's W, tau and lambda: the controls start there
    if (defaults) {
      if (defaults.wedlm_window_size) $("window").value = defaults.wedlm_window_size;
      if (typeof defaults.wedlm_entropy_threshold === "number") {
        $("tau").value = defaults.wedlm_entropy_threshold;
        $("tau-out").textContent = Number($("tau").value).toFixed(2);
      }
      if (typeof defaults.wedlm_pos_penalty_factor === "number") $("lambda").value = defaults.wedlm_pos_penalty_factor;
      state.singleTurn = defaults.wedlm_single_turn === true;
      if (state.singleTurn && !document.querySelector(".msg.note")) addMessage("note", SINGLE_TURN_NOTE);
    }
  } catch (err) {
    $("model").textContent = `no model: ${err}`;
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text || "";
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// The schema box, when filled, becomes an OpenAI `response_format` (structured outputs).
function responseFormat() {
  const text = $("schema").value.trim();
  if (!text) return undefined;
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (err) {
    throw new Error(`the JSON schema is not valid JSON: ${err.message}`);
  }
  return { type: "json_schema", json_schema: { name: "schema", schema, strict: true } };
}

function requestBody(messages) {
  const num = (id) => Number($(id).value);
  return {
    model: state.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    wedlm_trace: true,
    decoding: $("decoding").value,
    wedlm_window_size: num("window"),
    wedlm_entropy_threshold: num("tau"),
    wedlm_pos_penalty_factor: num("lambda"),
    temperature: num("temperature"),
    max_tokens: num("max-tokens"),
    response_format: responseFormat(),
  };
}

function showStats(s) {
  $("stat-tok").textContent = s.tokens;
  $("stat-fwd").textContent = s.forwards;
  $("stat-tpf").textContent = s.forwards ? (s.tokens / s.forwards).toFixed(2) : "–";
  $("stat-tps").textContent = s.seconds > 0 ? (s.tokens / s.seconds).toFixed(1) : "–";
  $("stat-pcache").textContent = s.pCache == null ? "–" : s.pCache.toFixed(3);
}

// Yields the JSON payload of every `data:` event of an SSE response body.
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function appendStep(div, text, trace) {
  const span = document.createElement("span");
  span.className = "step";
  span.textContent = text;
  if (trace) {
    span.dataset.step = trace.step;
    span.dataset.tokens = trace.num_tokens;
    span.title = `decode step ${trace.step}: ${trace.num_tokens} token(s)`;
    span.style.background = stepColour(trace.step);
  }
  div.appendChild(span);
}

async function streamAnswer(div, messages) {
  const started = performance.now();
  const live = { tokens: 0, forwards: 0, seconds: 0, pCache: null };
  const steps = new Set();
  let text = "";
  let finish = null;
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: apiHeaders(true),
    body: JSON.stringify(requestBody(messages)),
    signal: state.controller.signal,
  });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.error ? `${body.error.message} (param: ${body.error.param})` : response.statusText);
  }
  for await (const chunk of sseEvents(response)) {
    if (chunk.error) throw new Error(chunk.error.message);
    if (chunk.usage) {
      live.forwards = chunk.usage.decode_forwards;
      live.tokens = chunk.usage.completion_tokens;
      live.pCache = chunk.usage.p_cache;
    }
    for (const choice of chunk.choices || []) {
      const piece = choice.delta && choice.delta.content;
      if (choice.wedlm) {
        steps.add(choice.wedlm.step);
        live.tokens += choice.wedlm.num_tokens;
        live.forwards = steps.size;
      }
      // A step whose tokens end mid-character commits no text yet; its span stays empty.
      if (piece || choice.wedlm) {
        appendStep(div, piece || "", choice.wedlm);
        text += piece || "";
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    live.seconds = (performance.now() - started) / 1000;
    showStats(live);
    div.scrollIntoView({ block: "end" });
  }
  return { text, finish, live };
}

async function send(event) {
  if (event) event.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt || state.controller) return;
  $("prompt").value = "";
  addMessage("user", prompt);
  if (state.singleTurn) state.history = [];
  state.history.push({ role: "user", content: prompt });
  const system = $("system").value.trim();
  const messages = (system ? [{ role: "system", content: system }] : []).concat(state.history);
  const div = addMessage("assistant", "");
  state.controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const { text, finish, live } = await streamAnswer(div, messages);
    state.history.push({ role: "assistant", content: text });
    const meta = document.createElement("span");
    meta.className = "meta";
    const tpf = live.forwards ? (live.tokens / live.forwards).toFixed(2) : "–";
    meta.textContent = `${live.tokens} tokens in ${live.forwards} forwards · ${tpf} tokens/forward · `
      + `${(live.tokens / Math.max(live.seconds, 1e-6)).toFixed(1)} tok/s · finish: ${finish}`
      + (finish === "length" ? ` [stopped: max tokens ${$("max-tokens").value}]` : "");
    div.appendChild(meta);
    div.classList.add("done");
  } catch (err) {
    div.classList.add("error", "done");
    div.appendChild(document.createTextNode(err.name === "AbortError" ? " [stopped]" : ` [error: ${err.message}]`));
    state.history.pop();
  } finally {
    state.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

function reset() {
  if (state.controller) state.controller.abort();
  state.history = [];
  $("messages").innerHTML = "";
  if (state.singleTurn) addMessage("note", SINGLE_TURN_NOTE);
  for (const id of ["stat-tok", "stat-fwd", "stat-tpf", "stat-tps", "stat-pcache"]) $(id).textContent = "–";
}

function init() {
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) send(e);
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("reset").addEventListener("click", reset);
  $("tau").addEventListener("input", () => { $("tau-out").textContent = Number($("tau").value).toFixed(2); });
  $("api-key").value = localStorage.getItem(API_KEY_STORE) || "";
  $("api-key").addEventListener("change", () => {
    const key = $("api-key").value.trim();
    if (key) localStorage.setItem(API_KEY_STORE, key);
    else localStorage.removeItem(API_KEY_STORE);
    loadModel();
  });
  loadModel();
}

init();
