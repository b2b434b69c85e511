// WebSocket transport: JSON events as text messages, Opus frames as binary messages
// (16-byte header + one 20 ms packet), decoded in the page with WebCodecs' AudioDecoder
// and played by an AudioWorklet ring (player-worklet.js) whose per-chunk reports give the
// playback clock. The microphone goes up as 16 kHz PCM16 from mic-worklet.js.

import { ConnectError } from "./connection.js";
import { micConstraints } from "./devices.js";

const HEADER_BYTES = 16;
const RATE = 48000;
const MIC_RATE = 16000;

/** One binary frame: {codec, turn, seq, ptsMs, payload} (docs/protocol.md). */
export function parseFrame(data) {
  const v = new DataView(data);
  if (data.byteLength < HEADER_BYTES || v.getUint8(0) !== 1) throw new Error("not a v1 audio frame");
  return {
    codec: v.getUint8(1),
    turn: v.getUint32(4),
    seq: v.getUint32(8),
    ptsMs: v.getUint32(12),
    payload: new Uint8Array(data, HEADER_BYTES),
  };
}

function resample(x, from, to) {
  if (from === to) return x;
  const out = new Float32Array(Math.round((x.length * to) / from));
  const step = from / to;
  for (let i = 0; i < out.length; i++) {
    const p = i * step;
    const k = Math.floor(p);
    const f = p - k;
    out[i] = (x[k] ?? 0) * (1 - f) + (x[k + 1] ?? x[k] ?? 0) * f;
  }
  return out;
}

/** Why this browser cannot use the WebSocket transport, or null if it can. */
export function wsUnsupported() {
  if (!window.isSecureContext) {
    return "the page is not a secure context (open it over https or on localhost), so the browser hides WebCodecs and AudioWorklet";
  }
  if (typeof AudioDecoder === "undefined") return "this browser has no WebCodecs AudioDecoder";
  if (typeof AudioWorkletNode === "undefined") return "this browser has no AudioWorklet";
  return null;
}

/** Why a WebSocket handshake failed, which the browser does not say: the same URL asked
 *  over plain HTTP answers 401 or 403 where the credential is the reason (any other answer
 *  means the server is there and turned the socket down: a limit, a restart). */
async function handshakeRefusal(path) {
  try {
    const r = await fetch(path, { cache: "no-store", signal: AbortSignal.timeout(3000) });
    if (r.status === 401 || r.status === 403) return new ConnectError("denied", `the server answered ${r.status}`);
    return new ConnectError("refused", "the server turned the WebSocket down");
  } catch {
    return new ConnectError("unreachable", "the WebSocket could not open");
  }
}

export class WsTransport {
  /** hooks: onEvent(event), onLost({code, reason}) (once, when an open connection ends),
   *  onAnchor(turn, offsetMs, atMs, holdMs), onBuffered(ms), onError(text) */
  constructor(hooks) {
    this.name = "WebSocket";
    this.hooks = hooks;
    this.ws = null;
    this.ctx = null;
    this.player = null;
    this.analyser = null;
    this.micAnalyser = null;
    this.decoder = null;
    this.decoderTurn = -1;
    this.cancelled = new Set();
    this.mic = null; // {stream, source, node}
    this.micSentMs = 0; // microphone audio sent up
    this.closed = false;
  }

  /** Whether this transport's output can be sent to a chosen speaker. */
  static canPickSpeaker() {
    return typeof AudioContext !== "undefined" && "setSinkId" in AudioContext.prototype;
  }

  async connect() {
    const why = wsUnsupported();
    if (why) throw new ConnectError("unsupported", why);
    const ctx = (this.ctx = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" }));
    await ctx.audioWorklet.addModule(new URL("./player-worklet.js", import.meta.url));
    if (this.closed) throw new ConnectError("unreachable", "closed while connecting");
    this.player = new AudioWorkletNode(ctx, "voiceagent-player", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { prebufferMs: 40 },
    });
    this.analyser = ctx.createAnalyser();
    this.analyser.fftSize = 1024;
    // The analyser sits on the real output path: player -> analyser -> speakers.
    this.player.connect(this.analyser);
    this.analyser.connect(ctx.destination);
    this.player.port.onmessage = (e) => this.onPlayer(e.data);

    const scheme = location.protocol === "https:" ? "wss" : "ws";
    // With authentication on, the page's URL carries a session token (?token=, see
    // docs/security.md); a browser's WebSocket cannot set headers, so it goes in the URL.
    const token = new URLSearchParams(location.search).get("token");
    const query = token ? `?token=${encodeURIComponent(token)}` : "";
    const ws = (this.ws = new WebSocket(`${scheme}://${location.host}/v1/ws${query}`));
    ws.binaryType = "arraybuffer";
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new ConnectError("unreachable", "the WebSocket did not open within 10 s")), 10000);
      ws.onopen = () => {
        clearTimeout(timer);
        resolve();
      };
      ws.onerror = () => {
        clearTimeout(timer);
        handshakeRefusal(`/v1/ws${query}`).then(reject);
      };
    });
    ws.onerror = null;
    ws.onmessage = (e) => {
      if (typeof e.data !== "string") {
        this.onFrame(e.data);
        return;
      }
      let event;
      try {
        event = JSON.parse(e.data);
      } catch {
        this.hooks.onError("The server sent a control message that is not JSON.");
        return;
      }
      this.hooks.onEvent(event);
    };
    ws.onclose = (e) => {
      if (this.closed) return;
      this.hooks.onLost({ code: e.code, reason: e.reason || "" });
    };
  }

  /** Settings that session.start needs on this transport. */
  startSettings(micOn) {
    return { input: { sample_rate: micOn ? MIC_RATE : 0 } };
  }

  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }

  async resume() {
    if (this.ctx && this.ctx.state !== "running") await this.ctx.resume();
  }

  /** Play through the speaker with this deviceId ("" = the system's default); returns the
   *  one in use. */
  async setSpeaker(deviceId) {
    if (!this.ctx || !WsTransport.canPickSpeaker()) return null;
    if (this.ctx.sinkId !== deviceId) await this.ctx.setSinkId(deviceId);
    return typeof this.ctx.sinkId === "string" ? this.ctx.sinkId : "";
  }

  /** The deviceId of the microphone in use, or null. */
  micDeviceId() {
    if (!this.mic) return null;
    const track = this.mic.stream.getAudioTracks()[0];
    return track ? track.getSettings().deviceId ?? null : null;
  }

  /** performance.now() time at which AudioContext time `t` is heard. */
  perfTime(t) {
    const ctx = this.ctx;
    const ts = ctx.getOutputTimestamp ? ctx.getOutputTimestamp() : null;
    if (ts && ts.performanceTime > 0 && ts.contextTime > 0) {
      return ts.performanceTime + (t - ts.contextTime) * 1000;
    }
    const latency = ctx.outputLatency || ctx.baseLatency || 0;
    return performance.now() + (t - ctx.currentTime + latency) * 1000;
  }

  onPlayer(msg) {
    if (msg.type === "playing") {
      if (this.cancelled.has(msg.turn)) return;
      // anchors come every 20 ms while the turn plays; 80 ms without one is an underrun
      this.hooks.onAnchor(msg.turn, msg.pts, this.perfTime(msg.time), 80);
    } else if (msg.type === "buffer") {
      this.hooks.onBuffered(msg.ms);
    }
  }

  onFrame(data) {
    let frame;
    try {
      frame = parseFrame(data);
    } catch (err) {
      this.hooks.onError(`An audio frame could not be read: ${err.message}.`);
      return;
    }
    if (this.cancelled.has(frame.turn)) return; // a cancelled turn stays silent
    if (frame.codec === 2) {
      // pcm16 (only if someone changed the session's format): play as is
      const v = new DataView(frame.payload.buffer, frame.payload.byteOffset, frame.payload.byteLength);
      const x = new Float32Array(frame.payload.byteLength / 2);
      for (let i = 0; i < x.length; i++) x[i] = v.getInt16(2 * i, true) / 32768;
      const rate = Math.round(x.length * 50);
      this.push(frame.turn, frame.ptsMs, resample(x, rate, this.ctx.sampleRate));
      return;
    }
    if (frame.codec !== 1) {
      this.hooks.onError(`The server sent audio in a codec this page does not play (${frame.codec}).`);
      return;
    }
    if (!this.decoder || this.decoderTurn !== frame.turn) this.newDecoder(frame.turn);
    this.decoder.decode(
      new EncodedAudioChunk({ type: "key", timestamp: frame.ptsMs * 1000, data: frame.payload }),
    );
  }

  newDecoder(turn) {
    // Each turn is a new Opus stream: a fresh decoder per turn.
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    const decoder = new AudioDecoder({
      output: (audio) => this.onDecoded(turn, audio),
      error: (err) => this.hooks.onError(`The Opus decoder failed: ${err.message}.`),
    });
    decoder.configure({ codec: "opus", sampleRate: RATE, numberOfChannels: 1 });
    this.decoder = decoder;
    this.decoderTurn = turn;
  }

  onDecoded(turn, audio) {
    try {
      if (this.cancelled.has(turn) || !this.player) return;
      const x = new Float32Array(audio.numberOfFrames);
      audio.copyTo(x, { planeIndex: 0, format: "f32-planar" });
      const pts = Math.round(audio.timestamp / 1000);
      this.push(turn, pts, resample(x, audio.sampleRate, this.ctx.sampleRate));
    } finally {
      audio.close();
    }
  }

  push(turn, pts, samples) {
    this.player.port.postMessage({ type: "push", turn, pts, samples }, [samples.buffer]);
  }

  /** Silence these turns at once: drop their queued audio and any frame still coming. */
  flushTurns(turns) {
    for (const t of turns) this.cancelled.add(t);
    if (this.player) this.player.port.postMessage({ type: "flush", turns });
    if (this.decoder && turns.includes(this.decoderTurn) && this.decoder.state !== "closed") {
      this.decoder.close();
      this.decoder = null;
      this.decoderTurn = -1;
    }
  }

  /** Microphone on or off; while on, the person's speech barges in with `mode`
   *  (barge_in.mode: "cancel" or "duck"). `deviceId`: which microphone ("" = default). */
  async setMic(on, mode = "cancel", deviceId = "") {
    if (on && !this.mic) {
      if (!navigator.mediaDevices) throw new Error("this page cannot reach a microphone (not a secure context)");
      const stream = await navigator.mediaDevices.getUserMedia({ audio: micConstraints(deviceId) });
      if (this.closed) {
        for (const track of stream.getTracks()) track.stop();
        return;
      }
      const ctx = this.ctx;
      await ctx.audioWorklet.addModule(new URL("./mic-worklet.js", import.meta.url));
      const source = ctx.createMediaStreamSource(stream);
      const node = new AudioWorkletNode(ctx, "voiceagent-mic", {
        numberOfOutputs: 1,
        outputChannelCount: [1],
        processorOptions: { rate: MIC_RATE },
      });
      this.micAnalyser = ctx.createAnalyser();
      this.micAnalyser.fftSize = 1024;
      source.connect(this.micAnalyser);
      source.connect(node);
      node.connect(ctx.destination); // writes silence; being connected keeps it running
      // The server must expect microphone audio before the first binary message.
      this.send({ type: "session.update", input: { sample_rate: MIC_RATE }, barge_in: { mode } });
      node.port.onmessage = (e) => {
        if (this.ws && this.ws.readyState === WebSocket.OPEN) {
          this.ws.send(e.data.pcm);
          this.micSentMs += 20;
        }
      };
      this.mic = { stream, source, node };
    } else if (!on && this.mic) {
      this.stopMic();
      this.send({ type: "session.update", input: { sample_rate: 0 }, barge_in: { mode: "off" } });
    }
  }

  stopMic() {
    if (!this.mic) return;
    this.mic.node.port.onmessage = null;
    this.mic.source.disconnect();
    this.mic.node.disconnect();
    for (const track of this.mic.stream.getTracks()) track.stop();
    this.mic = null;
    this.micAnalyser = null;
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this.stopMic();
    if (this.ws) this.ws.close(1000);
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    if (this.ctx) this.ctx.close().catch(() => {});
  }
}
