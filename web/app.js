// The demo page: connects (WebRTC, or the WebSocket fallback), runs the session
// protocol (docs/protocol.md), drives the avatar from audio.levels released on the
// playback clock, and shows what happens. window.voiceagentDemo.state() is a read-only
// snapshot for tests and for poking around in the console.

import { Avatar } from "./avatar.js";
import { LevelClock } from "./levels.js";
import { RtcTransport } from "./transport-webrtc.js";
import { WsTransport } from "./transport-ws.js";

const $ = (id) => document.getElementById(id);

// Error codes (voiceagent/protocol/errors.py) in plain words; the server's own message
// is shown under each.
const ERROR_TEXT = {
  invalid_json: "The page sent a message that is not valid JSON.",
  invalid_message: "The server did not understand a message from the page.",
  unknown_type: "The server does not know one of the page's message types (is it an older server?).",
  unexpected_binary: "Microphone audio reached the server while its microphone input was off.",
  message_too_large: "That text is too long to send in one message. Send a shorter text.",
  text_too_long: "This reply's text is longer than the server allows for one turn.",
  unknown_voice: "That role is not one of the server's voices.",
  invalid_parameter: "The server did not accept a setting or a field (for example an empty text).",
  session_not_started: "The session had not started yet when the page sent that.",
  session_already_started: "The session was already started.",
  duplicate_turn_id: "The page used a turn id twice.",
  unknown_turn: "That turn is unknown to the server (it may have finished).",
  no_open_turn: "There was no open turn to end.",
  turn_queue_full: "Too many replies are waiting to be spoken. Wait for one to finish, or cancel.",
  too_many_sessions: "The server is full (too many sessions). Try again in a moment.",
  synthesis_failed: "The server could not synthesize this reply.",
  engine_unavailable: "The speech engine behind the server cannot be reached right now.",
  internal_error: "The server hit an internal error on this reply.",
};

const MAX_EVENTS = 300;
const LLM_DELTA_MS = 50;

const ui = {
  transportSelect: $("transport-select"),
  transport: $("transport"),
  connection: $("connection"),
  reconnect: $("reconnect"),
  modelNotice: $("model-notice"),
  modelWarning: $("model-warning"),
  envNotice: $("env-notice"),
  form: $("speak-form"),
  text: $("text"),
  voice: $("voice"),
  streamMode: $("stream-mode"),
  speak: $("speak"),
  cancel: $("cancel"),
  mic: $("mic"),
  bargeMode: $("barge-mode"),
  ttfa: $("ttfa"),
  buffered: $("buffered"),
  lipsync: $("lipsync"),
  playing: $("playing"),
  turns: $("turns"),
  barge: $("barge"),
  errors: $("errors"),
  mouthMeter: $("mouth-meter"),
  outputMeter: $("output-meter"),
  micMeter: $("mic-meter"),
};

const clock = new LevelClock();
const avatar = new Avatar($("avatar"));

const page = {
  transport: null,
  fallback: null, // why WebRTC was given up, when it was
  connection: "idle",
  generation: 0,
  session: null, // the session.created event
  voices: [],
  voice: null,
  mic: false,
  turns: new Map(), // turn_id -> record
  byNum: new Map(), // turn number -> turn_id (this session)
  stoppedAt: new Map(), // turn number -> ms of it played when the page silenced it
  lastTurnId: null,
  nextTurn: 0,
  events: [], // recent event types, oldest first (audio.levels only counted)
  sent: [], // recent messages sent: {type, t (performance.now())}
  levelEvents: 0,
  syncEvents: 0,
  errors: [],
  barge: [],
  mouthOpen: 0,
  outputLevel: 0,
  micLevel: 0,
  bufferedMs: null,
  playing: null,
  streamTimer: null,
};

// -- connection ---------------------------------------------------------------------------

function setConnection(state) {
  page.connection = state;
  ui.connection.textContent = state;
  ui.connection.dataset.state = state;
  ui.reconnect.hidden = !["closed", "failed", "disconnected"].includes(state);
  const ready = state === "connected" && page.session !== null;
  for (const el of [ui.speak, ui.cancel, ui.mic, ui.voice, ui.bargeMode]) el.disabled = !ready;
}

function setTransportLabel() {
  const t = page.transport;
  ui.transport.textContent = t ? (page.fallback ? `${t.name} (fallback)` : t.name) : "–";
  ui.transport.title = page.fallback ? `WebRTC failed: ${page.fallback}` : "";
}

async function connect(kind, allowFallback) {
  const gen = ++page.generation;
  if (page.transport) page.transport.close();
  stopStreaming();
  clock.dropAll();
  page.byNum.clear();
  page.stoppedAt.clear();
  page.session = null;
  page.mic = false;
  page.bufferedMs = null;
  renderMic();
  const hooks = {
    onEvent: (e) => gen === page.generation && onEvent(e),
    onState: (s) => gen === page.generation && setConnection(s),
    onAnchor: (turn, offset, at, hold) => gen === page.generation && onAnchor(turn, offset, at, hold),
    onBuffered: (ms) => {
      if (gen === page.generation) page.bufferedMs = ms;
    },
    onError: (text) => gen === page.generation && addError(text),
  };
  const t = kind === "ws" ? new WsTransport(hooks) : new RtcTransport(hooks, $("remote-audio"));
  // every control message the page sends, also those the transport sends itself
  const rawSend = t.send.bind(t);
  t.send = (message) => {
    page.sent.push({ type: message.type, t: performance.now() });
    if (page.sent.length > MAX_EVENTS) page.sent.splice(0, page.sent.length - MAX_EVENTS);
    try {
      rawSend(message);
    } catch (err) {
      addError(`The page could not send a ${message.type} message: ${err.message}.`);
    }
  };
  page.transport = t;
  setTransportLabel();
  setConnection("connecting");
  try {
    await t.connect();
  } catch (err) {
    t.close();
    if (gen !== page.generation) return;
    if (kind === "webrtc" && allowFallback) {
      page.fallback = err.message;
      addError(`WebRTC could not connect (${err.message}). Using the WebSocket instead.`);
      await connect("ws", false);
      return;
    }
    setConnection("failed");
    addError(`Could not connect over ${t.name}: ${err.message}.`);
    return;
  }
  if (gen !== page.generation) return;
  // playback.reports: the page says how much of a turn it played (every 250 ms, and once
  // when it stops a turn on audio.clear), so cancels report what was really heard.
  t.send({
    type: "session.start",
    ...t.startSettings(false),
    barge_in: { mode: "off" },
    playback: { reports: true },
  });
}

function chooseTransport(kind) {
  const url = new URL(location.href);
  url.searchParams.set("transport", kind);
  history.replaceState(null, "", url);
  page.fallback = null;
  connect(kind, kind === "webrtc");
}

// -- events -------------------------------------------------------------------------------

function remember(type) {
  page.events.push(type);
  if (page.events.length > MAX_EVENTS) page.events.splice(0, page.events.length - MAX_EVENTS);
}

function turnRecord(id) {
  let rec = page.turns.get(id);
  if (!rec) {
    rec = { turn_id: id, turn: null, voice: null, status: "sent", sentAt: null, ttfa_ms: null };
    page.turns.set(id, rec);
  }
  return rec;
}

function recordOf(num) {
  const id = page.byNum.get(num);
  return id === undefined ? null : page.turns.get(id);
}

function onEvent(e) {
  if (e.type === "audio.levels") page.levelEvents += 1;
  else remember(e.type);
  switch (e.type) {
    case "session.created":
      onSessionCreated(e);
      break;
    case "session.updated":
      page.voice = e.settings.voice;
      ui.voice.value = page.voice;
      break;
    case "turn.started": {
      const rec = turnRecord(e.turn_id);
      Object.assign(rec, { turn: e.turn, voice: e.voice, status: e.queued ? "queued" : "started" });
      page.byNum.set(e.turn, e.turn_id);
      page.lastTurnId = e.turn_id;
      renderTurn(rec);
      break;
    }
    case "turn.first_audio": {
      const rec = recordOf(e.turn);
      if (!rec) break;
      rec.status = "playing";
      rec.firstAudioAt = performance.now();
      // Without audio.sync (an older server) WebRTC has no playback anchor: estimate.
      setTimeout(() => estimateTtfa(rec), 1500);
      renderTurn(rec);
      break;
    }
    case "audio.levels":
      clock.addLevels(e.turn, e.offset_ms, e.frame_ms, e.levels);
      break;
    case "audio.sync":
      page.syncEvents += 1; // the transport anchored it on arrival
      break;
    case "turn.done": {
      clock.end(e.turn, e.sent_ms);
      const rec = recordOf(e.turn);
      if (!rec) break;
      Object.assign(rec, { status: "done", sent_ms: e.sent_ms, server_ttfa_ms: e.timings?.ttfa_ms ?? null });
      renderTurn(rec);
      break;
    }
    case "audio.clear": {
      // Stop this turn now (if the page has not already) and say how much of it was heard.
      silence([e.turn]);
      const played = Math.round(page.stoppedAt.get(e.turn) ?? 0);
      page.transport.send({ type: "playback", turn_id: e.turn_id, played_ms: played, stopped: true });
      break;
    }
    case "turn.cancelled": {
      silence([e.turn]);
      const rec = recordOf(e.turn);
      if (rec) {
        Object.assign(rec, {
          status: "cancelled",
          reason: e.reason || "cancel",
          sent_ms: e.sent_ms,
          played_ms: e.played_ms ?? null,
          played_source: e.played_source ?? null,
        });
        renderTurn(rec);
      }
      if (e.reason === "barge_in") {
        const heard = e.played_ms == null ? "" : ` after ${(e.played_ms / 1000).toFixed(2)} s heard`;
        addBarge(`barge-in: ${e.turn_id} cancelled${heard}`);
      }
      break;
    }
    case "speech_started":
      addBarge(`speech started (mic at ${(e.t_ms / 1000).toFixed(2)} s)`);
      break;
    case "speech_stopped":
      addBarge(`speech stopped (mic at ${(e.t_ms / 1000).toFixed(2)} s)`);
      break;
    case "audio.ducked": // barge_in.mode "duck": the person talks, the bot goes quiet
      addBarge(`the bot's voice is ducked to gain ${e.gain}`);
      break;
    case "audio.unducked":
      addBarge("the bot's voice is back to full volume");
      break;
    case "error":
      onServerError(e);
      break;
    default:
      break;
  }
}

function onSessionCreated(e) {
  page.session = e;
  page.voices = Array.isArray(e.voices) ? e.voices : [];
  ui.voice.replaceChildren(
    ...page.voices.map((v) => {
      const o = document.createElement("option");
      o.value = v;
      o.textContent = v;
      return o;
    }),
  );
  const wanted = page.voice;
  page.voice = e.settings?.voice ?? page.voices[0] ?? null;
  if (wanted && wanted !== page.voice && page.voices.includes(wanted)) {
    page.voice = wanted; // keep the role picked before a reconnect
    page.transport.send({ type: "session.update", voice: wanted });
  }
  ui.voice.value = page.voice;
  const model = e.model || {};
  ui.modelNotice.hidden = model.random_weights !== true;
  ui.modelWarning.textContent = model.warning ? `Server: ${model.warning}` : "";
  setConnection(page.connection);
}

function onServerError(e) {
  const plain = ERROR_TEXT[e.code] || `The server reported an error (${e.code}).`;
  addError(plain, e.message, e.code);
  if (e.turn_id) {
    const rec = page.turns.get(e.turn_id);
    if (rec) {
      rec.status = "failed";
      if (rec.turn !== null) silence([rec.turn]);
      renderTurn(rec);
    }
  }
}

/** The running playback report: how much of the turn playing now has been heard. */
function reportPlayback() {
  const t = page.transport;
  if (!t || !page.session) return;
  const now = performance.now();
  const playing = clock.at(now);
  const rec = playing && recordOf(playing.turn);
  if (!rec || rec.status === "cancelled") return;
  t.send({ type: "playback", turn_id: rec.turn_id, played_ms: Math.round(clock.playedMs(playing.turn, now)) });
}
setInterval(reportPlayback, 250);

/** Stop showing and playing these turns at once (cancel, barge-in, failure). */
function silence(nums) {
  const now = performance.now();
  for (const n of nums) {
    // where each turn stopped: the playback report that answers audio.clear
    if (!page.stoppedAt.has(n)) page.stoppedAt.set(n, clock.playedMs(n, now));
    clock.drop(n);
  }
  if (page.transport) page.transport.flushTurns(nums);
}

function onAnchor(turn, offsetMs, at, holdMs) {
  clock.anchor(turn, offsetMs, at, holdMs);
  const rec = recordOf(turn);
  if (rec && rec.ttfa_ms === null && rec.sentAt !== null) {
    // when offset 0 of the turn is heard, counted from the moment the text was sent
    rec.ttfa_ms = Math.round(at - offsetMs - rec.sentAt);
    rec.ttfaEstimated = false;
    renderTurn(rec);
  }
}

function estimateTtfa(rec) {
  if (rec.ttfa_ms !== null || rec.sentAt === null || !page.transport) return;
  const t = page.transport;
  const delay = t.delayMs ? t.delayMs() : 40;
  rec.ttfa_ms = Math.round(rec.firstAudioAt + delay - rec.sentAt);
  rec.ttfaEstimated = true;
  renderTurn(rec);
}

// -- actions ------------------------------------------------------------------------------

function llmPieces(text) {
  // token-sized pieces, spaces kept in front, like an LLM's stream
  return text.match(/\s*\S{1,5}/g) || [];
}

function stopStreaming() {
  if (page.streamTimer !== null) clearInterval(page.streamTimer);
  page.streamTimer = null;
}

async function speak() {
  const t = page.transport;
  const text = ui.text.value;
  if (!t || !page.session) return;
  if (!text.trim()) {
    addError("Type some text first.");
    return;
  }
  await t.resume();
  stopStreaming();
  page.nextTurn += 1;
  const id = `r${page.nextTurn}`;
  const rec = turnRecord(id);
  rec.sentAt = performance.now();
  rec.text = text;
  page.lastTurnId = id;
  if (!ui.streamMode.checked) {
    t.send({ type: "speak", turn_id: id, text });
    return;
  }
  const pieces = llmPieces(text);
  let i = 0;
  const step = () => {
    if (i < pieces.length) {
      t.send({ type: "text.delta", turn_id: id, text: pieces[i++] });
    } else {
      t.send({ type: "text.end", turn_id: id });
      stopStreaming();
    }
  };
  step();
  page.streamTimer = setInterval(step, LLM_DELTA_MS);
}

function cancelAll() {
  const t = page.transport;
  if (!t) return;
  const streaming = page.streamTimer !== null;
  stopStreaming();
  t.send({ type: "cancel" });
  // silence what is still buffered here at once; the server confirms with turn.cancelled
  const live = [...page.turns.values()].filter(
    (r) => r.turn !== null && ["sent", "queued", "started", "playing"].includes(r.status),
  );
  silence(live.map((r) => r.turn));
  if (streaming) remember("llm.stopped");
}

async function toggleMic() {
  const t = page.transport;
  if (!t) return;
  const on = !page.mic;
  ui.mic.disabled = true;
  try {
    await t.resume();
    await t.setMic(on, ui.bargeMode.value);
    page.mic = on;
  } catch (err) {
    addError(`The microphone could not be ${on ? "opened" : "closed"}: ${err.message}.`);
  } finally {
    ui.mic.disabled = !(page.connection === "connected" && page.session);
    renderMic();
  }
}

// -- rendering ----------------------------------------------------------------------------

function addError(text, serverMessage = null, code = null) {
  page.errors.push({ code, text, message: serverMessage });
  const li = document.createElement("li");
  li.textContent = text;
  if (serverMessage) {
    const small = document.createElement("small");
    small.textContent = `server: ${serverMessage}`;
    li.append(small);
  }
  ui.errors.append(li);
  ui.errors.scrollTop = ui.errors.scrollHeight;
}

function addBarge(text) {
  page.barge.push(text);
  const li = document.createElement("li");
  li.textContent = text;
  ui.barge.append(li);
  ui.barge.scrollTop = ui.barge.scrollHeight;
}

function renderMic() {
  ui.mic.setAttribute("aria-pressed", String(page.mic));
  ui.mic.textContent = page.mic ? "Microphone on · barge-in" : "Microphone off";
}

function fmtMs(ms) {
  return ms === null || ms === undefined ? "–" : `${Math.round(ms)} ms`;
}

function renderTurn(rec) {
  let li = ui.turns.querySelector(`li[data-turn-id="${CSS.escape(rec.turn_id)}"]`);
  if (!li) {
    li = document.createElement("li");
    li.dataset.turnId = rec.turn_id;
    ui.turns.append(li);
  }
  const ttfa = rec.ttfa_ms === null ? "TTFA –" : `TTFA ${rec.ttfa_ms} ms${rec.ttfaEstimated ? " (est.)" : ""}`;
  let status = rec.status;
  if (rec.status === "done" && rec.sent_ms != null) status = `done, ${(rec.sent_ms / 1000).toFixed(2)} s`;
  if (rec.status === "cancelled") {
    status = rec.reason === "barge_in" ? "cancelled by barge-in" : "cancelled";
    if (rec.played_ms != null) status += ` after ${(rec.played_ms / 1000).toFixed(2)} s`;
  }
  li.textContent = `${rec.turn_id} · ${rec.voice ?? "?"} · ${ttfa} · ${status}`;
  ui.turns.scrollTop = ui.turns.scrollHeight;
  if (rec.turn_id === page.lastTurnId && rec.ttfa_ms !== null) {
    ui.ttfa.textContent = `${rec.ttfa_ms} ms${rec.ttfaEstimated ? " (est.)" : ""} (${rec.turn_id})`;
  }
}

const scratch = new Float32Array(1024);

function rms(analyser) {
  if (!analyser) return 0;
  analyser.getFloatTimeDomainData(scratch);
  let sum = 0;
  for (let i = 0; i < scratch.length; i++) sum += scratch[i] * scratch[i];
  return Math.sqrt(sum / scratch.length);
}

function meter(el, value) {
  el.style.backgroundSize = `${Math.round(Math.max(0, Math.min(1, value)) * 100)}% 100%`;
}

// level in dB on the same 0..1 scale as audio.levels, for the meters
function scaled(x) {
  return x <= 1e-6 ? 0 : Math.max(0, Math.min(1, 1 + (20 * Math.log10(x)) / 60));
}

let lastPrune = 0;
function tick(now) {
  const p = clock.at(now);
  page.playing = p;
  avatar.update(p ? p.level : 0, now);
  page.mouthOpen = avatar.open;
  const t = page.transport;
  page.outputLevel = rms(t && t.analyser);
  page.micLevel = rms(t && t.micAnalyser);
  meter(ui.mouthMeter, page.mouthOpen);
  meter(ui.outputMeter, scaled(page.outputLevel));
  meter(ui.micMeter, scaled(page.micLevel));
  if (now - lastPrune > 1000) {
    clock.prune(now);
    lastPrune = now;
    ui.buffered.textContent =
      page.bufferedMs === null ? "–" : `${Math.round(page.bufferedMs)} ms${t && t.name === "WebRTC" ? " (jitter buffer)" : ""}`;
    ui.lipsync.textContent = page.levelEvents
      ? `${page.levelEvents} audio.levels events` + (page.syncEvents ? `, ${page.syncEvents} audio.sync` : "")
      : "no audio.levels from the server yet";
  }
  if (p) {
    const id = page.byNum.get(p.turn) ?? `turn ${p.turn}`;
    ui.playing.textContent = `${id} at ${(p.offsetMs / 1000).toFixed(2)} s`;
  } else {
    ui.playing.textContent = "–";
  }
  requestAnimationFrame(tick);
}

// -- debug handle -------------------------------------------------------------------------

function publicTurn(rec) {
  if (!rec) return null;
  const { turn_id, turn, voice, status, ttfa_ms, ttfaEstimated, reason, played_ms, played_source, sent_ms } = rec;
  return {
    turn_id,
    turn,
    voice,
    status,
    ttfa_ms,
    ttfa_estimated: !!ttfaEstimated,
    reason,
    played_ms,
    played_source,
    sent_ms,
  };
}

window.voiceagentDemo = Object.freeze({
  /** A JSON snapshot of what the page shows; changing it changes nothing. */
  state() {
    const t = page.transport;
    return JSON.parse(
      JSON.stringify({
        transport: t ? t.name : null,
        fallback: page.fallback,
        connection: page.connection,
        sessionStarted: page.session !== null,
        voices: page.voices,
        voice: page.voice,
        mic: page.mic,
        bargeMode: ui.bargeMode.value,
        model: page.session ? page.session.model : null,
        limits: page.session ? page.session.limits : null,
        randomWeightsNotice: !ui.modelNotice.hidden,
        mouthOpen: page.mouthOpen,
        outputLevel: page.outputLevel,
        micLevel: page.micLevel,
        micSentMs: t && t.micSentMs !== undefined ? t.micSentMs : null,
        bufferedMs: page.bufferedMs,
        playing: page.playing ? { turn: page.playing.turn, offsetMs: page.playing.offsetMs, level: page.playing.level } : null,
        lastTurn: publicTurn(page.turns.get(page.lastTurnId)),
        turns: [...page.turns.values()].map(publicTurn),
        events: page.events,
        sent: page.sent,
        levelEvents: page.levelEvents,
        syncEvents: page.syncEvents,
        errors: page.errors,
        barge: page.barge,
      }),
    );
  },
});

// -- wiring -------------------------------------------------------------------------------

ui.form.addEventListener("submit", (e) => {
  e.preventDefault();
  speak();
});
ui.cancel.addEventListener("click", cancelAll);
ui.mic.addEventListener("click", toggleMic);
ui.voice.addEventListener("change", () => {
  page.voice = ui.voice.value;
  if (page.transport) page.transport.send({ type: "session.update", voice: page.voice });
});
ui.bargeMode.addEventListener("change", () => {
  // only while the microphone is on: with it off, barge-in is off
  if (page.mic && page.transport) {
    page.transport.send({ type: "session.update", barge_in: { mode: ui.bargeMode.value } });
  }
});
ui.transportSelect.addEventListener("change", () => chooseTransport(ui.transportSelect.value));
ui.reconnect.addEventListener("click", () => chooseTransport(ui.transportSelect.value));
// Browsers start audio only after a user gesture: resume on the first one.
document.addEventListener("pointerdown", () => page.transport && page.transport.resume());
document.addEventListener("keydown", () => page.transport && page.transport.resume());

if (!window.isSecureContext) {
  ui.envNotice.hidden = false;
  ui.envNotice.textContent =
    "This page is not a secure context (it is not on https or localhost), so the browser " +
    "blocks the microphone and the WebSocket fallback's audio decoder. WebRTC playback " +
    "still works. Open it as http://localhost:PORT (an SSH tunnel works) or over https.";
}

const wanted = new URLSearchParams(location.search).get("transport");
const kind = wanted === "ws" || wanted === "websocket" ? "ws" : "webrtc";
ui.transportSelect.value = kind;
renderMic();
connect(kind, kind === "webrtc");
requestAnimationFrame(tick);
