// The demo page: connects (WebRTC, or the WebSocket when WebRTC cannot get through), runs
// the session protocol (docs/protocol.md), drives the avatar and the captions from the
// page's playback clock, shows what the bot is doing, and heals its connection by itself.
// window.voiceagentDemo.state() is a read-only snapshot for tests and for the console
// (described in web/README.md).

import { Avatar } from "./avatar.js";
import { Captions } from "./captions.js";
import { Backoff, failureText, lostText, queryMs } from "./connection.js";
import { DevicePickers } from "./devices.js";
import { LevelClock } from "./levels.js";
import { Messages } from "./messages.js";
import { Transcript } from "./transcript.js";
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
  unknown_voice: "That voice is not one of the server's voices.",
  invalid_parameter: "The server did not accept a setting or a field (for example an empty text).",
  session_not_started: "The session had not started yet when the page sent that.",
  session_already_started: "The session was already started.",
  duplicate_turn_id: "The page used a turn id twice.",
  unknown_turn: "That turn is unknown to the server (it may have finished).",
  no_open_turn: "There was no open turn to end.",
  turn_queue_full: "Too many replies are waiting to be spoken. Wait for one to finish, or stop them.",
  too_many_sessions: "The server is full right now.",
  server_draining: "The server is restarting.",
  server_busy: "The server is busy with other replies. Try again in a moment.",
  quota_exceeded: "Your account has reached its limit for now. Try again in a moment.",
  rate_limited: "The page sent messages too fast; the server slowed it down.",
  synthesis_failed: "The server could not make the audio for this reply.",
  engine_unavailable: "The speech engine behind the server cannot be reached right now.",
  session_start_timeout: "The page took too long to start its session.",
  idle_timeout: "The session was idle for too long.",
  internal_error: "The server hit an internal error on this reply.",
};

// Errors that come with a refused connection: they are said in the connection's message.
const REFUSAL_CODES = new Set(["server_draining", "too_many_sessions", "quota_exceeded"]);
// Errors that turn down the message opening a reply. They carry no turn_id
// (docs/protocol.md); the server answers in order, so they are about the oldest reply the
// page sent that has no turn.started yet. (unknown_voice is also a voice change's answer.)
const TURN_REFUSALS = new Set([
  "text_too_long",
  "message_too_large",
  "turn_queue_full",
  "duplicate_turn_id",
  "quota_exceeded",
  "unknown_voice",
]);
const LIVE = new Set(["sent", "queued", "started", "playing"]);
const FINAL = new Set(["done", "cancelled", "failed", "ended"]);
const MAX_EVENTS = 300;
const LLM_DELTA_MS = 50;
const SESSION_TIMEOUT_MS = 10000;
const ICE_HINT_MS = queryMs("ice_hint_ms", 3000);
const ICE_HINT =
  "Still connecting… a firewall may be blocking the audio path; the page will switch to WebSocket if it does not get through.";
const INTERRUPTED_MS = 2000;

const ui = {
  link: $("link"),
  connection: $("connection"),
  transport: $("transport"),
  transportSelect: $("transport-select"),
  connMessage: $("conn-message"),
  connMessageText: $("conn-message-text"),
  reconnect: $("reconnect"),
  modelNotice: $("model-notice"),
  modelWarning: $("model-warning"),
  envNotice: $("env-notice"),
  botState: $("bot-state"),
  botStateText: $("bot-state-text"),
  form: $("speak-form"),
  text: $("text"),
  voice: $("voice"),
  streamMode: $("stream-mode"),
  speak: $("speak"),
  cancel: $("cancel"),
  mic: $("mic"),
  bargeMode: $("barge-mode"),
  settings: $("settings"),
  ttfa: $("ttfa"),
  buffered: $("buffered"),
  lipsync: $("lipsync"),
  playing: $("playing"),
  connDetail: $("conn-detail"),
  turns: $("turns"),
  barge: $("barge"),
  log: $("log"),
  errors: $("errors"),
  alert: $("announce-alert"),
  status: $("announce-status"),
  mouthMeter: $("mouth-meter"),
  outputMeter: $("output-meter"),
  micMeter: $("mic-meter"),
};

const clock = new LevelClock();
const avatar = new Avatar($("avatar"));
const captions = new Captions($("caption"));
const backoff = new Backoff(queryMs("retry_ms", 500), queryMs("retry_max_ms", 4000));
const devices = new DevicePickers($("mic-device"), $("speaker-device"), $("speaker-note"), onDevicePicked);
const transcript = new Transcript(ui.turns);
const messages = new Messages(ui, () => ui.text.focus());
const announce = (text, kind) => messages.announce(text, kind);
const logLine = (text) => messages.line(text);
const addError = (text, serverMessage, code) => messages.error(text, serverMessage, code);
const addNote = (text) => transcript.note(text);

function setConnMessage(text, tone = "warn") {
  messages.setConn(text, tone);
  ui.reconnect.hidden = !["reconnecting", "stopped"].includes(page.connection);
}

const page = {
  transport: null,
  preferred: "webrtc", // what the person chose: WebRTC (WebSocket if blocked) or WebSocket
  fallback: null, // why WebRTC was given up, when it was
  connection: "connecting", // connecting | connected | reconnecting | stopped
  generation: 0,
  session: null, // the session.created event
  everConnected: false,
  reconnects: 0, // sessions started again after a drop
  lostText: null, // why the last connection ended or the last attempt failed
  retryAt: null,
  refusal: null, // error code sent just before a refused connection closed
  timers: { retry: null, session: null, hint: null },
  lastClose: null,
  voices: [],
  roles: [],
  voice: null, // the session's voice (or role), as the server last confirmed it
  voiceAsked: null, // a voice change sent and not answered yet
  mic: false,
  micWanted: false, // stays on across a reconnect
  micBusy: false,
  micDevice: "",
  speakerWanted: "",
  speakerInUse: null,
  speakerSupported: null,
  turns: new Map(), // turn_id -> record
  byNum: new Map(), // turn number -> turn_id (this session)
  stoppedAt: new Map(), // turn number -> ms of it played when the page silenced it
  lastTurnId: null,
  nextTurn: 0,
  captionTurn: null,
  events: [], // recent event types, oldest first (audio.levels only counted)
  sent: [], // recent messages sent: {type, turn_id, text, t (performance.now())}
  levelEvents: 0,
  syncEvents: 0,
  barge: [],
  botState: "connecting",
  speakingUntil: 0,
  speakingTurn: null, // the turn whose audio last played
  interrupted: { until: 0, by: null },
  hearing: false, // the microphone hears speech (speech_started .. speech_stopped)
  ducked: false,
  mouthOpen: 0,
  outputLevel: 0,
  micLevel: 0,
  bufferedMs: null,
  playing: null,
  stream: null, // the reply streaming in pieces: {id, pieces, next, timer}
};

// -- connection ---------------------------------------------------------------------------

function clearTimers() {
  for (const k of Object.keys(page.timers)) {
    clearTimeout(page.timers[k]);
    page.timers[k] = null;
  }
}

function setConnection(state) {
  page.connection = state;
  ui.link.dataset.state = state;
  const words = {
    connecting: page.everConnected ? "Reconnecting…" : "Connecting…",
    connected: "Connected",
    reconnecting: "Offline",
    stopped: "Disconnected",
  };
  ui.connection.textContent = words[state];
  ui.reconnect.hidden = !["reconnecting", "stopped"].includes(state);
  renderControls();
}

function ready() {
  return page.connection === "connected" && page.session !== null;
}

function renderControls() {
  const ok = ready();
  // aria-disabled, not disabled: a focused control keeps its focus while the page
  // reconnects, and a press says why nothing happens
  for (const el of [ui.speak, ui.mic]) el.setAttribute("aria-disabled", String(!ok));
  ui.cancel.setAttribute("aria-disabled", String(!ok || !stoppable(performance.now()).length));
}

function renderTransport() {
  const t = page.transport;
  let text = t ? t.name : "–";
  if (t && page.fallback) text = "WebSocket (WebRTC blocked)";
  ui.transport.textContent = text;
  ui.link.title = page.fallback ? `WebRTC could not connect: ${page.fallback}. The page uses the WebSocket instead.` : "";
}

function currentKind() {
  return page.fallback ? "ws" : page.preferred;
}

async function connect(kind, allowFallback) {
  endLiveTurns(); // a turn still live now belongs to the connection that goes
  const gen = ++page.generation;
  clearTimers();
  if (page.transport) page.transport.close();
  stopStreaming();
  clock.dropAll();
  page.byNum.clear();
  page.stoppedAt.clear();
  page.session = null;
  page.refusal = null;
  page.mic = false;
  page.hearing = false;
  page.ducked = false;
  page.bufferedMs = null;
  page.speakerInUse = null;
  renderMic();
  const mine = (f) => (...args) => (gen === page.generation ? f(...args) : undefined);
  const hooks = {
    onEvent: mine(onEvent),
    onLost: mine(onLost),
    onAnchor: mine(onAnchor),
    onBuffered: mine((ms) => {
      page.bufferedMs = ms;
    }),
    onError: mine((text) => addError(text)),
  };
  const t = kind === "ws" ? new WsTransport(hooks) : new RtcTransport(hooks, $("remote-audio"));
  // every control message the page sends, also those the transport sends itself
  const rawSend = t.send.bind(t);
  t.send = (message) => {
    const { type, turn_id, text } = message;
    page.sent.push({ type, turn_id, text, t: performance.now() });
    if (page.sent.length > MAX_EVENTS) page.sent.splice(0, page.sent.length - MAX_EVENTS);
    try {
      rawSend(message);
    } catch (err) {
      logLine(`could not send ${message.type}: ${err.message}`);
    }
  };
  page.transport = t;
  renderTransport();
  setConnection("connecting");
  if (page.lostText) setConnMessage(`${page.lostText} Reconnecting…`);
  if (kind === "webrtc") {
    page.timers.hint = setTimeout(
      mine(() => {
        if (page.connection !== "connecting") return;
        setConnMessage(ICE_HINT, "info");
        announce(ICE_HINT);
      }),
      ICE_HINT_MS,
    );
  }
  try {
    await t.connect();
  } catch (err) {
    t.close();
    if (gen !== page.generation) return;
    clearTimeout(page.timers.hint);
    logLine(`${t.name} did not connect: ${err.message}`);
    // A server that went away between answering the offer and the audio path opening
    // looks like a blocked path: only give WebRTC up while the server is there.
    if (err.kind === "path" && !(await reachable())) err.kind = "unreachable";
    if (gen !== page.generation) return;
    if (kind === "webrtc" && allowFallback && (err.kind === "path" || err.kind === "unsupported")) {
      page.fallback = err.message;
      logLine("using the WebSocket instead of WebRTC");
      connect("ws", false);
      return;
    }
    if (err.kind === "denied") stopConnecting(failureText(err));
    else scheduleRetry(failureText(err));
    return;
  }
  if (gen !== page.generation) return;
  clearTimeout(page.timers.hint);
  // playback.reports: the page says how much of a turn it played (every 250 ms, and once
  // when it stops a turn on audio.clear), so cancels report what was really heard.
  t.send({
    type: "session.start",
    ...t.startSettings(false),
    barge_in: { mode: "off" },
    playback: { reports: true },
  });
  page.timers.session = setTimeout(
    mine(() => {
      if (page.session) return;
      t.close();
      logLine("no session.created within 10 s");
      scheduleRetry(failureText({ kind: "session" }));
    }),
    SESSION_TIMEOUT_MS,
  );
}

/** Whether the server answers at all (its liveness probe, which needs no credential). */
async function reachable() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), 3000);
  try {
    const r = await fetch("/healthz", { cache: "no-store", signal: abort.signal });
    return r.status < 500;
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

function scheduleRetry(text) {
  const delay = backoff.next();
  page.lostText = text;
  page.retryAt = performance.now() + delay;
  setConnection("reconnecting");
  renderRetryMessage();
  page.timers.retry = setTimeout(reconnectNow, delay);
}

function renderRetryMessage() {
  if (page.connection !== "reconnecting" || page.retryAt === null) return;
  const s = Math.max(1, Math.ceil((page.retryAt - performance.now()) / 1000));
  const text = `${page.lostText} Reconnecting in ${s} s…`;
  if (!messages.conn || messages.conn.text !== text) setConnMessage(text);
}

function stopConnecting(text) {
  page.lostText = text;
  page.retryAt = null;
  setConnection("stopped");
  setConnMessage(text, "error");
  announce(text, "alert");
}

function reconnectNow() {
  clearTimers();
  page.retryAt = null;
  connect(currentKind(), currentKind() === "webrtc");
}

/** The connection ended (transports call this once, only after connect() succeeded). */
function onLost(info) {
  page.lastClose = info;
  logLine(`connection ended: ${info.why ? info.why : `close code ${info.code}${info.reason ? ` (${info.reason})` : ""}`}`);
  const { text, retry } = lostText(info, page.refusal);
  const wasUp = page.session !== null;
  const t = page.transport;
  clearTimers();
  stopStreaming();
  endLiveTurns(); // before the transport goes: what was heard of each is still known
  page.generation += 1; // whatever the old transport still reports is ignored from now on
  page.session = null;
  page.mic = false;
  renderMic();
  t.close();
  clock.dropAll();
  page.playing = null;
  if (wasUp) {
    announce(retry ? `${text} Reconnecting.` : text, "alert");
    addNote(`Connection lost: ${text}`);
  }
  if (retry) scheduleRetry(text);
  else stopConnecting(text);
}

function chooseTransport(kind) {
  const url = new URL(location.href);
  url.searchParams.set("transport", kind);
  history.replaceState(null, "", url);
  page.preferred = kind;
  page.fallback = null;
  page.lostText = null;
  backoff.reset();
  setConnMessage(null);
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
    rec = {
      turn_id: id,
      seq: null,
      turn: null,
      voice: null,
      status: "sent",
      text: "",
      sentAt: null,
      ttfa_ms: null,
      ttfa_from: null,
      generation: page.generation,
    };
    page.turns.set(id, rec);
  }
  return rec;
}

function recordOf(num) {
  const id = page.byNum.get(num);
  return id === undefined ? null : page.turns.get(id);
}

/** A turn the server is done with whose audio is still to be heard (the server sends
 *  ahead of playback; a starved player falls further behind). Bounded by the turn's
 *  length after turn.done, in case its audio never shows up. */
function stillHeard(r, now) {
  if (r.status !== "done" || r.turn === null || !clock.pending(r.turn, now)) return false;
  return now - r.doneAt < (r.sent_ms ?? 0) + 5000;
}

/** Turns Stop would end: live ones and ones still to be heard. */
function stoppable(now) {
  return [...page.turns.values()].filter((r) => LIVE.has(r.status) || stillHeard(r, now));
}

function onEvent(e) {
  if (e.type === "audio.levels") page.levelEvents += 1;
  else remember(e.type);
  switch (e.type) {
    case "session.created":
      onSessionCreated(e);
      break;
    case "session.updated":
      page.voiceAsked = null;
      page.voice = e.settings.voice;
      ui.voice.value = page.voice;
      break;
    case "turn.started": {
      const rec = turnRecord(e.turn_id);
      Object.assign(rec, { turn: e.turn, voice: e.voice });
      if (!FINAL.has(rec.status)) rec.status = e.queued ? "queued" : "started";
      page.byNum.set(e.turn, e.turn_id);
      renderTurn(rec);
      break;
    }
    case "turn.words":
      captions.add(e.turn_id, e);
      break;
    case "turn.first_audio": {
      const rec = recordOf(e.turn);
      if (!rec) break;
      if (!FINAL.has(rec.status)) rec.status = "playing";
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
      rec.sent_ms = e.sent_ms;
      rec.server_ttfa_ms = e.timings?.ttfa_ms ?? null;
      rec.doneAt = performance.now();
      if (!FINAL.has(rec.status)) rec.status = "done";
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
    case "turn.cancelled":
      onCancelled(e);
      break;
    case "speech_started":
      page.hearing = true;
      addBarge(`you started talking (${(e.t_ms / 1000).toFixed(2)} s into the microphone audio)`);
      break;
    case "speech_stopped":
      page.hearing = false;
      addBarge(`you stopped talking (${(e.t_ms / 1000).toFixed(2)} s)`);
      break;
    case "audio.ducked": // barge_in.mode "duck": the person talks, the bot goes quiet
      page.ducked = true;
      addBarge(`the avatar talks quieter while you talk (volume × ${e.gain})`);
      announce("You are talking: the avatar lowers its voice.", "alert");
      break;
    case "audio.unducked":
      page.ducked = false;
      addBarge("the avatar is back to full volume");
      break;
    case "error":
      onServerError(e);
      break;
    default:
      break;
  }
}

function onSessionCreated(e) {
  clearTimeout(page.timers.session);
  page.session = e;
  page.voices = Array.isArray(e.voices) ? e.voices : [];
  page.roles = Array.isArray(e.roles) ? e.roles : [];
  listVoices();
  const wanted = page.voiceAsked ?? page.voice;
  page.voiceAsked = null;
  page.voice = e.settings?.voice ?? page.voices[0] ?? null;
  if (wanted && wanted !== page.voice && [...page.voices, ...page.roles].includes(wanted)) {
    page.voice = wanted; // keep the voice picked before a reconnect
    page.transport.send({ type: "session.update", voice: wanted });
  }
  ui.voice.value = page.voice;
  const model = e.model || {};
  ui.modelNotice.hidden = model.random_weights !== true;
  ui.modelWarning.textContent = model.warning ? `Server: ${model.warning}` : "";
  const again = page.everConnected;
  page.everConnected = true;
  backoff.reset();
  page.lostText = null;
  page.retryAt = null;
  messages.clearErrors();
  setConnMessage(null);
  setConnection("connected");
  logLine(`session ${e.session_id} started over ${page.transport.name}`);
  if (again) {
    page.reconnects += 1;
    addNote("Reconnected.");
    announce("Reconnected.");
  }
  const t = page.transport;
  devices.setSpeakerSupport(t.constructor.canPickSpeaker(), t.name);
  if (page.speakerWanted) applySpeaker();
  if (page.micWanted) toggleMic(true);
}

/** The voice picker: the server's voices, and its roles (a voice with defaults) apart. */
function listVoices() {
  const options = (names) => names.map((v) => new Option(v, v));
  if (!page.roles.length) {
    ui.voice.replaceChildren(...options(page.voices));
    return;
  }
  const group = (label, names) => {
    const g = document.createElement("optgroup");
    g.label = label;
    g.append(...options(names));
    return g;
  };
  ui.voice.replaceChildren(group("Voices", page.voices), group("Roles", page.roles));
}

/** The server's voices now, read when the picker is about to open: a voice made (or
 *  deleted) since the session started is listed without a reconnect. */
async function refreshVoices() {
  if (!ready()) return;
  const token = new URLSearchParams(location.search).get("token");
  try {
    const r = await fetch("/v1/voices", {
      cache: "no-store",
      headers: token ? { Authorization: `Bearer ${token}` } : {},
      signal: AbortSignal.timeout(3000),
    });
    const voices = r.ok ? (await r.json()).voices : null;
    if (!Array.isArray(voices) || voices.join("\n") === page.voices.join("\n")) return;
    page.voices = voices;
    listVoices();
    ui.voice.value = page.voiceAsked ?? page.voice;
  } catch {
    // the list stays as it was
  }
}

/** The reply an error without a turn_id turned down, if it turned one down. */
function refusedReply(code) {
  if (!TURN_REFUSALS.has(code)) return null;
  if (code === "unknown_voice" && page.voiceAsked !== null) return null; // the voice change's
  const waiting = [...page.turns.values()].filter((r) => r.status === "sent" && r.generation === page.generation);
  return waiting.length ? waiting.reduce((a, b) => (a.seq < b.seq ? a : b)) : null;
}

function onServerError(e) {
  if (!page.session && REFUSAL_CODES.has(e.code)) {
    // a refused connection: the close that follows says it in the connection's message
    page.refusal = e.code;
    logLine(`refused: ${e.code} (${e.message})`);
    return;
  }
  const plain = ERROR_TEXT[e.code] || "The server reported an error.";
  addError(plain, e.message, e.code);
  const rec = e.turn_id ? page.turns.get(e.turn_id) : refusedReply(e.code);
  if (e.code === "unknown_voice" && page.voiceAsked !== null) {
    page.voiceAsked = null; // the voice stays what the server last confirmed
    ui.voice.value = page.voice;
  }
  if (rec) {
    rec.status = "failed";
    rec.error = plain;
    rec.endedAt = performance.now();
    if (rec.turn !== null) silence([rec.turn]);
    renderTurn(rec);
    renderControls();
  }
}

function onCancelled(e) {
  silence([e.turn]);
  const rec = recordOf(e.turn);
  if (!rec) return;
  const first = rec.status !== "cancelled"; // not already marked when the page stopped it
  Object.assign(rec, {
    status: "cancelled",
    reason: e.reason || "cancel",
    sent_ms: e.sent_ms,
    played_ms: e.played_ms ?? rec.played_ms ?? 0,
    played_source: e.played_source ?? null,
  });
  if (rec.endedAt == null) rec.endedAt = performance.now();
  renderTurn(rec);
  if (e.reason === "barge_in") {
    const heard = e.played_ms == null ? "" : ` after ${(e.played_ms / 1000).toFixed(2)} s`;
    addBarge(`barge-in: you interrupted ${e.turn_id}${heard}`);
    if (first && rec.played_ms > 0) interrupt("barge_in");
  }
}

/** The bot was cut off while it spoke: the face says so for a moment. */
function interrupt(by) {
  const now = performance.now();
  page.interrupted = { until: now + INTERRUPTED_MS, by };
  page.speakingUntil = 0;
  renderBotState(now, null); // at once, not at the next animation frame
  if (by === "barge_in") {
    announce("You interrupted the avatar.", "alert");
    addNote("You spoke: the avatar stopped.");
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
  const audible = nums.some((n) => clock.anchored(n));
  for (const n of nums) {
    // where each turn stopped: the playback report that answers audio.clear
    if (!page.stoppedAt.has(n)) page.stoppedAt.set(n, clock.playedMs(n, now));
    clock.drop(n);
  }
  if (page.transport) page.transport.flushTurns(nums, audible);
}

/** Every turn still live belongs to a connection that is gone: it ends here. */
function endLiveTurns() {
  const now = performance.now();
  for (const rec of page.turns.values()) {
    if (!LIVE.has(rec.status)) continue;
    const played = rec.turn !== null && rec.generation === page.generation ? clock.playedMs(rec.turn, now) : 0;
    Object.assign(rec, { status: "ended", reason: "connection_lost", played_ms: Math.round(played), endedAt: now });
    renderTurn(rec);
  }
}

function onAnchor(turn, offsetMs, at, holdMs) {
  clock.anchor(turn, offsetMs, at, holdMs);
  const rec = recordOf(turn);
  if (rec && rec.ttfa_ms === null && rec.sentAt !== null) {
    setTtfa(rec, at - offsetMs, false);
  }
}

/** Time to first audio, from when the turn could start playing: when its text was sent,
 *  or when the turn before it finished, whichever is later (a queued turn waits for the
 *  one before it; that wait is not the server's delay). `heardAt`: when its audio at
 *  offset 0 is heard. */
function setTtfa(rec, heardAt, estimated) {
  let from = rec.sentAt;
  let fromPrevious = false;
  const prev = rec.turn > 1 ? recordOf(rec.turn - 1) : null;
  if (prev) {
    let end = prev.endedAt ?? clock.endAt(prev.turn);
    if (end == null) end = prev.status === "done" && !(prev.sent_ms > 0) ? prev.doneAt : heardAt;
    if (end != null && end > from) {
      from = end;
      fromPrevious = true;
    }
  }
  rec.ttfa_ms = Math.max(0, Math.round(heardAt - from));
  rec.ttfa_from = fromPrevious ? "previous" : "sent";
  rec.ttfaEstimated = estimated;
  renderTurn(rec);
}

function estimateTtfa(rec) {
  const over = FINAL.has(rec.status) && rec.status !== "done";
  if (rec.ttfa_ms !== null || rec.sentAt === null || !page.transport || over) return;
  const t = page.transport;
  const delay = t.delayMs ? t.delayMs() : 40;
  setTtfa(rec, rec.firstAudioAt + delay, true);
}

// -- actions ------------------------------------------------------------------------------

function llmPieces(text) {
  // token-sized pieces, spaces kept in front, like an LLM's stream; by code point, so a
  // piece never ends in half a character (the server refuses a lone surrogate)
  return text.match(/\s*\S{1,5}/gu) || [];
}

function stopStreaming() {
  if (page.stream !== null) clearInterval(page.stream.timer);
  page.stream = null;
}

/** Send the rest of the reply still streaming, and end it: a new reply must not cut it
 *  short (Stop, or a lost connection, drops the rest instead). */
function finishStreaming() {
  const s = page.stream;
  if (s === null) return;
  stopStreaming();
  const rest = s.pieces.slice(s.next).join("");
  if (rest) page.transport.send({ type: "text.delta", turn_id: s.id, text: rest });
  page.transport.send({ type: "text.end", turn_id: s.id });
}

function notReady() {
  const why =
    page.connection === "stopped"
      ? "Not connected. Press Reconnect now."
      : "Not connected yet: the page is connecting to the server.";
  announce(why, "alert");
  if (!messages.conn) setConnMessage(why);
}

async function speak() {
  const t = page.transport;
  const text = ui.text.value;
  if (!ready()) {
    notReady();
    return;
  }
  if (!text.trim()) {
    addError("Type something for the avatar to say first.");
    return;
  }
  await t.resume();
  finishStreaming();
  page.nextTurn += 1;
  const id = `r${page.nextTurn}`;
  const rec = turnRecord(id);
  rec.seq = page.nextTurn;
  rec.sentAt = performance.now();
  rec.text = text;
  captions.expect(id, text);
  page.lastTurnId = id;
  renderTurn(rec);
  renderControls();
  if (!ui.streamMode.checked) {
    t.send({ type: "speak", turn_id: id, text });
    return;
  }
  const stream = { id, pieces: llmPieces(text), next: 0, timer: null };
  const step = () => {
    if (stream.next < stream.pieces.length) {
      t.send({ type: "text.delta", turn_id: id, text: stream.pieces[stream.next++] });
    } else {
      t.send({ type: "text.end", turn_id: id });
      stopStreaming();
    }
  };
  page.stream = stream;
  step();
  stream.timer = setInterval(step, LLM_DELTA_MS);
}

/** Stop: every live turn, whatever the transport. The page marks them stopped at once,
 *  with how much of each it played (the same number it reports to the server); the
 *  server's turn.cancelled confirms it. */
function cancelAll() {
  const t = page.transport;
  const streaming = page.stream !== null;
  stopStreaming();
  const now = performance.now();
  const live = stoppable(now);
  if (!live.length && !streaming) return false;
  if (t && ready()) t.send({ type: "cancel" });
  // the avatar was cut off if any of these had started to be heard
  const heard = live.some((r) => r.turn !== null && (r.ttfa_ms !== null || clock.playedMs(r.turn, now) > 0));
  silence(live.filter((r) => r.turn !== null).map((r) => r.turn));
  for (const r of live) {
    Object.assign(r, {
      status: "cancelled",
      reason: "cancel",
      played_ms: r.turn === null ? 0 : Math.round(page.stoppedAt.get(r.turn) ?? 0),
      endedAt: now,
    });
    renderTurn(r);
  }
  // Say at once how much of each was heard, rather than only in answer to the server's
  // audio.clear: on a busy machine that round trip can outlast the server's wait for it
  // (playback.timeout_ms), which then settles for an older periodic report.
  if (t && ready()) {
    for (const r of live) {
      if (r.turn !== null && r.turn_id) t.send({ type: "playback", turn_id: r.turn_id, played_ms: r.played_ms, stopped: true });
    }
  }
  if (streaming) remember("llm.stopped");
  if (heard) interrupt("cancel");
  announce("Stopped.");
  renderControls();
  return true;
}

async function toggleMic(forceOn = null) {
  if (page.micBusy) return;
  const t = page.transport;
  if (!ready()) {
    notReady();
    return;
  }
  const on = forceOn === null ? !page.mic : forceOn;
  if (on === page.mic) return;
  // never disabled while it works: the button keeps its focus (aria-busy says it is busy)
  page.micBusy = true;
  ui.mic.setAttribute("aria-busy", "true");
  try {
    await t.resume();
    await t.setMic(on, ui.bargeMode.value, page.micDevice);
    if (t !== page.transport) return;
    page.mic = on;
    page.micWanted = on;
    if (on) devices.refresh(); // with the microphone allowed, devices have names
    announce(on ? "Microphone on: talk to interrupt the avatar." : "Microphone off.");
  } catch (err) {
    addError(`The microphone could not be turned ${on ? "on" : "off"}: ${err.message}.`);
  } finally {
    page.micBusy = false;
    ui.mic.removeAttribute("aria-busy");
    renderMic();
  }
}

async function onDevicePicked(kind, deviceId) {
  if (kind === "mic") {
    page.micDevice = deviceId;
    if (page.mic && ready()) {
      // the new microphone from now on: close the old one, open the new one
      await toggleMic(false);
      page.micWanted = true;
      await toggleMic(true);
    }
    return;
  }
  page.speakerWanted = deviceId;
  await applySpeaker();
}

async function applySpeaker() {
  const t = page.transport;
  if (!t || !ready()) return;
  try {
    page.speakerInUse = await t.setSpeaker(page.speakerWanted);
  } catch (err) {
    addError(`The page could not switch to that speaker: ${err.message}.`);
  }
}

// -- rendering ----------------------------------------------------------------------------

function addBarge(text) {
  page.barge.push(text);
  const li = document.createElement("li");
  li.textContent = text;
  ui.barge.append(li);
  ui.barge.scrollTop = ui.barge.scrollHeight;
}

function renderMic() {
  ui.mic.setAttribute("aria-pressed", String(page.mic));
  ui.mic.textContent = page.mic ? "Mic on" : "Mic off";
  ui.mic.title = page.mic ? "Your microphone is on: talk to interrupt the avatar" : "Turn the microphone on to interrupt by talking";
}

function renderTurn(rec) {
  transcript.render(rec);
  if (rec.turn_id === page.lastTurnId && rec.ttfa_ms !== null) {
    const est = rec.ttfaEstimated ? " (estimated)" : "";
    const from = rec.ttfa_from === "previous" ? "after the reply before it finished" : "after its text was sent";
    ui.ttfa.textContent = `${rec.ttfa_ms} ms${est} (${rec.turn_id}, ${from})`;
  }
}

const BOT_WORDS = {
  connecting: () => (page.everConnected ? "Reconnecting…" : "Connecting…"),
  offline: () => "Offline",
  listening: () => (page.hearing ? "Listening: hearing you" : "Listening"),
  thinking: () => "Thinking…",
  speaking: () => (page.ducked ? "Speaking (quieter while you talk)" : "Speaking"),
  interrupted: () => (page.interrupted.by === "barge_in" ? "Interrupted: you spoke" : "Interrupted: stopped"),
};

function botState(now, playing) {
  if (!ready()) return page.connection === "stopped" ? "offline" : "connecting";
  if (playing) {
    page.speakingUntil = now + 300; // bridges a short gap in the audio...
    page.speakingTurn = playing.turn;
    return "speaking";
  }
  // ...of that turn alone: the next turn is "thinking" until its own audio plays
  const last = page.speakingTurn === null ? null : recordOf(page.speakingTurn);
  if (now < page.speakingUntil && last && (LIVE.has(last.status) || stillHeard(last, now))) return "speaking";
  if (now < page.interrupted.until) return "interrupted";
  if (stoppable(now).length) return "thinking"; // (or its audio is late)
  return "listening";
}

function renderBotState(now, playing) {
  const state = botState(now, playing);
  const words = BOT_WORDS[state]();
  page.botState = state;
  if (ui.botState.dataset.state !== state) ui.botState.dataset.state = state;
  if (ui.botStateText.textContent !== words) ui.botStateText.textContent = words;
}

function renderCaptions(playing) {
  let rec = playing ? recordOf(playing.turn) : null;
  if (rec) {
    page.captionTurn = rec.turn_id;
    captions.show(rec.turn_id, playing.offsetMs, false);
    return;
  }
  rec = page.captionTurn ? page.turns.get(page.captionTurn) : null;
  if (!rec) return;
  if (rec.status === "done") captions.show(rec.turn_id, Infinity, false);
  else if (rec.status === "cancelled" || rec.status === "failed" || rec.status === "ended") {
    captions.show(rec.turn_id, rec.played_ms ?? captions.position ?? 0, true);
  }
  // still live but not heard this instant (a gap in the audio): leave it as it is
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

let lastSlow = 0;
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
  renderCaptions(p);
  renderBotState(now, p);
  if (now - lastSlow > 250) {
    lastSlow = now;
    renderControls();
    renderRetryMessage();
    if (now - (tick.pruned || 0) > 1000) {
      clock.prune(now);
      tick.pruned = now;
    }
    ui.buffered.textContent =
      page.bufferedMs === null
        ? "–"
        : `${Math.round(page.bufferedMs)} ms${t && t.name === "WebRTC" ? " (held by the browser before it plays)" : ""}`;
    ui.lipsync.textContent = page.levelEvents
      ? `${page.levelEvents} loudness updates` + (page.syncEvents ? `, ${page.syncEvents} timing marks` : "")
      : "none yet";
    const fallback = page.fallback ? ` (WebRTC could not connect: ${page.fallback})` : "";
    const again = page.reconnects ? `, reconnected ${page.reconnects}×` : "";
    ui.connDetail.textContent = `${t ? t.name : "–"}${fallback}, ${page.connection}${again}`;
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
  const { turn_id, turn, voice, status, text, ttfa_ms, ttfa_from, ttfaEstimated, reason, played_ms, played_source, sent_ms, error } =
    rec;
  return {
    turn_id,
    turn,
    voice,
    status,
    text,
    ttfa_ms,
    ttfa_from,
    ttfa_estimated: !!ttfaEstimated,
    reason,
    played_ms,
    played_source,
    sent_ms,
    error: error ?? null,
  };
}

window.voiceagentDemo = Object.freeze({
  /** A small snapshot, cheap enough to take on every animation frame. */
  sample() {
    const p = page.playing;
    const now = captions.box.querySelector(".now");
    return {
      mouthOpen: page.mouthOpen,
      outputLevel: page.outputLevel,
      playing: p ? { turn: p.turn, offsetMs: p.offsetMs } : null,
      botState: page.botState,
      botText: ui.botStateText.textContent,
      connection: page.connection,
      connectionText: ui.connection.textContent,
      caption: { turn_id: captions.shown, marked: now ? captions.spans.indexOf(now) : -1, word: now ? now.textContent : null },
    };
  },

  /** A JSON snapshot of what the page shows; changing it changes nothing. */
  state() {
    const t = page.transport;
    return JSON.parse(
      JSON.stringify({
        transport: t ? t.name : null,
        preferred: page.preferred,
        fallback: page.fallback,
        connection: page.connection,
        connectionMessage: messages.conn ? messages.conn.text : null,
        sessionStarted: page.session !== null,
        rtpPackets: t && t.packetsReceived ? t.packetsReceived() : null,
        reconnects: page.reconnects,
        retryInMs: page.retryAt === null ? null : Math.max(0, Math.round(page.retryAt - performance.now())),
        botState: page.botState,
        caption: captions.snapshot(),
        voices: page.voices,
        roles: page.roles,
        voice: page.voice,
        mic: page.mic,
        micWanted: page.micWanted,
        bargeMode: ui.bargeMode.value,
        devices: {
          mics: devices.list.mics,
          speakers: devices.list.speakers,
          micDevice: page.micDevice,
          micInUse: t && t.micDeviceId ? t.micDeviceId() : null,
          speaker: page.speakerWanted,
          speakerInUse: page.speakerInUse,
          speakerSupported: t ? t.constructor.canPickSpeaker() : null,
        },
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
        errors: messages.errors,
        log: messages.log,
        barge: page.barge,
        announcements: messages.announcements,
      }),
    );
  },
});

// -- wiring -------------------------------------------------------------------------------

ui.form.addEventListener("submit", (e) => {
  e.preventDefault();
  speak();
});
ui.text.addEventListener("keydown", (e) => {
  // Enter speaks, Shift+Enter is a new line (Ctrl/Cmd+Enter speaks too); not while an
  // input method is composing a character
  if (e.key !== "Enter" || e.shiftKey || e.isComposing || e.altKey) return;
  e.preventDefault();
  speak();
});
document.addEventListener("keydown", (e) => {
  if (e.key !== "Escape" || e.defaultPrevented) return;
  if (cancelAll()) e.preventDefault();
});
ui.cancel.addEventListener("click", () => {
  if (!cancelAll()) announce("Nothing to stop.");
});
ui.mic.addEventListener("click", () => toggleMic());
ui.voice.addEventListener("focus", refreshVoices);
ui.voice.addEventListener("change", () => {
  if (!ready()) {
    page.voice = ui.voice.value; // asked for when the session starts
    return;
  }
  page.voiceAsked = ui.voice.value; // page.voice follows when session.updated confirms it
  page.transport.send({ type: "session.update", voice: page.voiceAsked });
});
ui.bargeMode.addEventListener("change", () => {
  // only while the microphone is on: with it off, barge-in is off
  if (page.mic && ready()) {
    page.transport.send({ type: "session.update", barge_in: { mode: ui.bargeMode.value } });
  }
});
ui.transportSelect.addEventListener("change", () => chooseTransport(ui.transportSelect.value));
ui.reconnect.addEventListener("click", () => {
  backoff.reset();
  reconnectNow();
});
window.addEventListener("online", () => {
  if (page.connection === "reconnecting") reconnectNow();
});
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
page.preferred = wanted === "ws" || wanted === "websocket" ? "ws" : "webrtc";
ui.transportSelect.value = page.preferred;
renderMic();
devices.refresh();
connect(page.preferred, page.preferred === "webrtc");
requestAnimationFrame(tick);
