// The omni-serve playground: voice over /v1/realtime (OpenAI's Realtime events), images over
// /v1/images/generations. Plain JS, no build step; window.playground holds the page's state
// (a test reads its stats).
"use strict";

const RATE = 24000; // the Realtime API's PCM16 rate
const $ = (id) => document.getElementById(id);
const page = {
  key: sessionStorage.getItem("omni-serve-key") || "",
  config: null,
  ws: null,
  ctx: null,
  player: null,
  mic: null,
  lines: {}, // assistant transcript lines by item id
  posted: 0, // samples handed to the player
  itemStart: {}, // samples handed to the player before an item's audio
  current: null, // the assistant item being spoken
  voice: null, // the voice picked (null: the server's default)
  stats: { received: 0, played: 0, queued: 0, interruptions: 0, stops: 0, responses: 0, errors: 0 },
};
window.playground = page;

function showError(message) {
  page.stats.errors += 1;
  const line = document.createElement("div");
  line.textContent = message;
  $("errors").appendChild(line);
}

function setStatus(text) {
  $("status").textContent = text;
}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (page.key) headers.Authorization = `Bearer ${page.key}`;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    $("key-form").hidden = false;
    throw new Error("this server needs an API key: enter it above");
  }
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const reason = body && body.error ? body.error.message : response.statusText;
    throw new Error(`${response.status}: ${reason}`);
  }
  return body;
}

async function load() {
  $("errors").textContent = "";
  try {
    page.config = await api("/playground/config.json");
  } catch (error) {
    setStatus("not connected");
    showError(error.message);
    return;
  }
  $("key-form").hidden = true;
  $("model").textContent = page.config.model;
  if (page.config.kind === "image") return showImagePanel();
  showVoicePanel();
}

// -- voice -------------------------------------------------------------------------------

function showVoicePanel() {
  $("voice").hidden = false;
  const select = $("voice-select");
  for (const voice of page.config.voices) select.add(new Option(voice, voice));
  select.disabled = page.config.voices.length === 0;
  select.onchange = () => {
    page.voice = select.value;
    sendSession();
  };
  $("transcribe").onchange = () => sendSession();
  connect();
}

function connect() {
  const url = new URL(`/v1/realtime?model=${encodeURIComponent(page.config.model)}`, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const protocols = ["realtime"];
  if (page.key) protocols.push(`openai-insecure-api-key.${page.key}`);
  const ws = new WebSocket(url, protocols);
  page.ws = ws;
  ws.onopen = () => setStatus("connected");
  ws.onmessage = (event) => handle(JSON.parse(event.data));
  ws.onclose = (event) => {
    setStatus("disconnected");
    if (event.code !== 1000) showError(`connection closed (${event.code}) ${event.reason || ""}`);
  };
}

function send(event) {
  if (page.ws && page.ws.readyState === WebSocket.OPEN) page.ws.send(JSON.stringify(event));
}

function sendSession() {
  // Sent on session.created (keeping the server's default voice until one is picked) and
  // when the voice or "Show my words" changes.
  const spoken = page.config.voices.length > 0;
  const transcription = $("transcribe").checked ? { model: page.config.model } : null;
  const session = {
    type: "realtime",
    output_modalities: [spoken ? "audio" : "text"],
    audio: {
      input: { turn_detection: { type: "server_vad", silence_duration_ms: 500 }, transcription },
    },
  };
  if (spoken && page.voice) session.audio.output = { voice: page.voice };
  send({ type: "session.update", session });
}

function line(kind, text) {
  const item = document.createElement("li");
  item.className = kind;
  item.textContent = text;
  $("transcript").appendChild(item);
  item.scrollIntoView({ block: "end" });
  return item;
}

function handle(event) {
  switch (event.type) {
    case "session.created": {
      const output = event.session.audio && event.session.audio.output;
      if (output && output.voice) $("voice-select").value = output.voice;
      page.session = event.session;
      sendSession();
      break;
    }
    case "session.updated":
      page.session = event.session; // what the server now uses (a test reads the voice)
      break;
    case "input_audio_buffer.speech_started":
      setStatus("hearing you");
      interrupt();
      break;
    case "input_audio_buffer.speech_stopped":
      setStatus("thinking");
      break;
    case "conversation.item.created":
    case "conversation.item.added": {
      const item = event.item;
      if (item.role !== "user" || $(`u-${item.id}`)) break;
      const part = item.content[0] || {};
      const shown = part.text || part.transcript || "(you spoke)";
      line("user", shown).id = `u-${item.id}`;
      break;
    }
    case "conversation.item.input_audio_transcription.delta": {
      const said = $(`u-${event.item_id}`);
      if (!said) break;
      if (!said.dataset.words) said.textContent = "";
      said.dataset.words = "1";
      said.textContent += event.delta;
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const said = $(`u-${event.item_id}`);
      if (!said) break;
      if (event.transcript.trim()) said.textContent = event.transcript;
      said.dataset.transcribed = "1";
      break;
    }
    case "conversation.item.input_audio_transcription.failed":
      showError(`transcribing what you said failed: ${event.error.message}`);
      break;
    case "response.created":
      page.stats.responses += 1;
      break;
    case "response.output_audio.delta":
      play(event.item_id, event.delta);
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      assistantLine(event.item_id).textContent += event.delta;
      break;
    case "response.done":
      showTimings(event.response);
      setStatus("listening");
      break;
    case "error":
      showError(event.error.message);
      break;
  }
}

function assistantLine(itemId) {
  if (!page.lines[itemId]) page.lines[itemId] = line("assistant", "");
  return page.lines[itemId];
}

function showTimings(response) {
  const timings = response.timings;
  if (response.status === "cancelled" && page.lines[page.current]) {
    page.lines[page.current].classList.add("interrupted");
  }
  if (!timings) return;
  if (timings.first_audio_s !== undefined) $("ttfa").textContent = `${timings.first_audio_s.toFixed(2)} s`;
  if (timings.rtf !== undefined) $("rtf").textContent = timings.rtf.toFixed(2);
}

async function ensureAudio() {
  if (page.ctx) return;
  page.ctx = new AudioContext({ sampleRate: RATE });
  await page.ctx.audioWorklet.addModule("/playground/worklets.js");
  page.player = new AudioWorkletNode(page.ctx, "player");
  page.player.connect(page.ctx.destination);
  page.player.port.onmessage = (event) => {
    const { cleared, ...counts } = event.data;
    Object.assign(page.stats, counts);
    if (cleared && counts.queued === 0) page.stats.stops += 1; // playback stopped for barge-in
    $("played").textContent = (page.stats.played / RATE).toFixed(1);
  };
}

function play(itemId, base64) {
  if (!page.player) return;
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const pcm = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
  const samples = Float32Array.from(pcm, (v) => v / 32768);
  if (page.current !== itemId) {
    page.current = itemId;
    page.itemStart[itemId] = page.posted;
  }
  page.posted += samples.length;
  page.player.port.postMessage(samples, [samples.buffer]);
}

function interrupt() {
  // Speech during a reply: the server stops the answer (barge-in); the page stops playing
  // and tells the server how much of the item was heard, so the model's memory matches.
  if (!page.player || page.stats.queued <= 0 || !page.current) return;
  const heard = Math.max(0, page.stats.played - (page.itemStart[page.current] || 0));
  page.player.port.postMessage("clear");
  page.stats.interruptions += 1;
  assistantLine(page.current).classList.add("interrupted");
  send({
    type: "conversation.item.truncate",
    item_id: page.current,
    content_index: 0,
    audio_end_ms: Math.round((heard / RATE) * 1000),
  });
}

async function toggleTalking() {
  const button = $("talk");
  if (page.mic) {
    page.mic.stream.getTracks().forEach((track) => track.stop());
    page.mic.node.disconnect();
    page.mic = null;
    button.textContent = "Start talking";
    button.classList.remove("on");
    return;
  }
  try {
    await ensureAudio();
    await page.ctx.resume();
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    const node = new AudioWorkletNode(page.ctx, "capture");
    node.port.onmessage = (event) => send({ type: "input_audio_buffer.append", audio: toPcm16Base64(event.data) });
    const silent = page.ctx.createGain();
    silent.gain.value = 0; // keeps the capture node pulled without playing the microphone
    page.ctx.createMediaStreamSource(stream).connect(node);
    node.connect(silent).connect(page.ctx.destination);
    page.mic = { stream, node };
    button.textContent = "Stop talking";
    button.classList.add("on");
    setStatus("listening");
  } catch (error) {
    showError(`microphone: ${error.message}`);
  }
}

function toPcm16Base64(samples) {
  const pcm = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    pcm[i] = Math.max(-32768, Math.min(32767, Math.round(samples[i] * 32767)));
  }
  const bytes = new Uint8Array(pcm.buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

async function sendText(event) {
  event.preventDefault();
  const text = $("text").value.trim();
  if (!text) return;
  $("text").value = "";
  await ensureAudio();
  await page.ctx.resume();
  send({
    type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
  });
  send({ type: "response.create" });
}

// -- images ------------------------------------------------------------------------------

function showImagePanel() {
  $("image").hidden = false;
  for (const size of page.config.sizes || []) $("size").add(new Option(size, size));
  if (page.config.default_steps) $("steps").value = page.config.default_steps;
  setStatus("ready");
}

async function generate(event) {
  event.preventDefault();
  const button = event.submitter || $("image-form").querySelector("button");
  button.disabled = true;
  setStatus("generating");
  const started = performance.now();
  try {
    const body = await api("/v1/images/generations", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        model: page.config.model,
        prompt: $("prompt").value,
        size: $("size").value,
        num_inference_steps: Number($("steps").value),
        seed: Number($("seed").value),
      }),
    });
    const url = `data:image/png;base64,${body.data[0].b64_json}`;
    $("picture").src = url;
    $("download").href = url;
    $("result").hidden = false;
    $("image-time").textContent = `${((performance.now() - started) / 1000).toFixed(1)} s`;
    setStatus("ready");
  } catch (error) {
    showError(error.message);
    setStatus("ready");
  } finally {
    button.disabled = false;
  }
}

$("key-form").onsubmit = (event) => {
  event.preventDefault();
  page.key = $("key").value.trim();
  sessionStorage.setItem("omni-serve-key", page.key);
  load();
};
$("talk").onclick = toggleTalking;
$("text-form").onsubmit = sendText;
$("image-form").onsubmit = generate;
load();
