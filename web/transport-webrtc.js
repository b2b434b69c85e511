// WebRTC transport: one peer connection with a sendrecv audio transceiver (the bot's
// voice comes down, the microphone goes up when it is on) and one data channel carrying
// the session protocol's JSON. Signaling: POST /v1/webrtc/offer, no trickle ICE.
// The playback clock: the server sends `audio.sync` when a turn's frame at `offset_ms`
// leaves its track; it plays about one jitter-buffer delay after it arrives here.

// A live connection is declared lost when, for this long, no RTP packet has come in (the
// server's track sends silence while idle, so packets always flow), or when the ICE
// connection stays "disconnected" this long. A killed server otherwise shows "connected"
// for 5-6 s, until ICE consent fails. `?stall_ms=` changes it.

import { ConnectError, queryMs } from "./connection.js";
import { micConstraints } from "./devices.js";

const FALLBACK_JITTER_MS = 60;
const OPEN_TIMEOUT_MS = 10000;
const OFFER_TIMEOUT_MS = 10000;
const RETRY_CODES = new Set(["server_draining", "too_many_sessions", "quota_exceeded", "rate_limited"]);

function waitFor(predicate, target, eventName, timeoutMs, what) {
  if (predicate()) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      target.removeEventListener(eventName, check);
      reject(new Error(`${what} within ${timeoutMs / 1000} s`));
    }, timeoutMs);
    function check() {
      if (!predicate()) return;
      clearTimeout(timer);
      target.removeEventListener(eventName, check);
      resolve();
    }
    target.addEventListener(eventName, check);
  });
}

/** Resolves when the data channel opens; rejects when the connection fails first, or
 *  after OPEN_TIMEOUT_MS (ICE blocked by a firewall never fails by itself that soon). */
function opened(pc, channel) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => done(new Error(`the audio path did not open within ${OPEN_TIMEOUT_MS / 1000} s`)),
      OPEN_TIMEOUT_MS,
    );
    function check() {
      if (channel.readyState === "open") done(null);
      else if (pc.connectionState === "failed" || channel.readyState === "closed") {
        done(new Error("the audio path could not be set up"));
      }
    }
    function done(err) {
      clearTimeout(timer);
      channel.removeEventListener("open", check);
      channel.removeEventListener("close", check);
      pc.removeEventListener("connectionstatechange", check);
      if (err) reject(err);
      else resolve();
    }
    channel.addEventListener("open", check);
    channel.addEventListener("close", check);
    pc.addEventListener("connectionstatechange", check);
    check();
  });
}

export class RtcTransport {
  /** hooks: see WsTransport */
  constructor(hooks, audioElement) {
    this.name = "WebRTC";
    this.hooks = hooks;
    this.audio = audioElement;
    this.audio.muted = false; // the element outlives transports: the last may have closed muted
    this.pc = null;
    this.channel = null;
    this.transceiver = null;
    this.ctx = null;
    this.analyser = null;
    this.micAnalyser = null;
    this.mic = null; // {stream, track, source}
    this.jitterMs = null; // current jitter-buffer delay of the inbound audio
    this.lastStats = null;
    this.statsTimer = null;
    this.unmuteTimer = null;
    this.holdMute = false; // muted since a cancel, until the next turn's audio is heard
    this.cancelled = new Set(); // turns silenced: their late audio.sync unmutes nothing
    this.outGain = null; // mirrors the element's mute for the analyser
    this.closed = false;
    this.live = false; // connect() finished: losses go to hooks.onLost
    this.stallMs = queryMs("stall_ms", 2000);
    this.packets = null; // {count, at}: RTP packets received, and when that last grew
    this.disconnectTimer = null;
    this.closing = null; // {code, reason} of the server's session.closing, as a WebSocket's close
  }

  /** Whether this transport's output can be sent to a chosen speaker. */
  static canPickSpeaker() {
    return typeof HTMLMediaElement !== "undefined" && "setSinkId" in HTMLMediaElement.prototype;
  }

  lost(why) {
    if (this.closed || !this.live) return;
    this.live = false;
    // the server's own word (session.closing), whichever of our checks noticed first
    this.hooks.onLost(this.closing || { why });
  }

  async connect() {
    if (typeof RTCPeerConnection === "undefined") throw new ConnectError("unsupported", "this browser has no WebRTC");
    this.ctx = new AudioContext({ latencyHint: "interactive" });
    this.analyser = this.ctx.createAnalyser();
    this.analyser.fftSize = 1024;
    const pc = (this.pc = new RTCPeerConnection({ iceServers: [] }));
    // The data channel and the transceiver exist before the offer: one m=application,
    // one m=audio (sendrecv, so the microphone can be switched on without renegotiation).
    const channel = (this.channel = pc.createDataChannel("control"));
    this.transceiver = pc.addTransceiver("audio", { direction: "sendrecv" });
    pc.ontrack = (e) => this.onTrack(e);
    pc.onconnectionstatechange = () => {
      const s = pc.connectionState;
      if (s === "failed" || s === "closed") this.lost(s);
      clearTimeout(this.disconnectTimer);
      // "disconnected" may heal by itself; if it does not soon, the connection is gone
      if (s === "disconnected") this.disconnectTimer = setTimeout(() => this.lost("disconnected"), this.stallMs);
    };
    channel.onmessage = (e) => this.onMessage(e.data);
    channel.onclose = () => this.lost("closed");

    await pc.setLocalDescription(await pc.createOffer());
    await waitFor(() => pc.iceGatheringState === "complete", pc, "icegatheringstatechange", 5000, "ICE gathering did not finish").catch(
      () => {}, // send what was gathered so far
    );
    const headers = { "content-type": "application/json" };
    const token = new URLSearchParams(location.search).get("token"); // auth on: docs/security.md
    if (token) headers.authorization = `Bearer ${token}`;
    let response;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), OFFER_TIMEOUT_MS);
    try {
      response = await fetch("/v1/webrtc/offer", {
        method: "POST",
        headers,
        body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer" }),
        signal: abort.signal,
      });
    } catch (err) {
      throw new ConnectError("unreachable", `the offer could not be sent (${err.message})`);
    } finally {
      clearTimeout(timer);
    }
    let answer = null;
    try {
      answer = await response.json();
    } catch {
      // not JSON: reported below
    }
    if (!response.ok || !answer || answer.type !== "answer") {
      const code = answer && typeof answer.code === "string" ? answer.code : null;
      const why = answer && answer.message ? answer.message : `HTTP ${response.status}`;
      if (RETRY_CODES.has(code)) throw new ConnectError("refused", why, code);
      if (response.status === 401 || response.status === 403) throw new ConnectError("denied", why, code);
      if (response.status === 502 || response.status === 504) throw new ConnectError("unreachable", why, code);
      throw new ConnectError("path", `the server refused the WebRTC offer: ${why}`, code);
    }
    try {
      await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
      await opened(pc, channel);
    } catch (err) {
      throw new ConnectError("path", err.message);
    }
    this.live = true;
    this.statsTimer = setInterval(() => this.pollStats(), 250);
  }

  startSettings() {
    return {};
  }

  onTrack(e) {
    const stream = e.streams && e.streams[0] ? e.streams[0] : new MediaStream([e.track]);
    // Chrome only lets a remote WebRTC stream flow once a media element plays it; the
    // element is what the listener hears (and what echo cancellation knows about).
    this.audio.srcObject = stream;
    this.audio.play().catch(() => {});
    // The analyser taps the same remote stream: what actually comes out.
    const source = this.ctx.createMediaStreamSource(stream);
    this.outGain = this.ctx.createGain();
    source.connect(this.outGain);
    this.outGain.connect(this.analyser);
    this.remoteSource = source;
  }

  onMessage(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      this.hooks.onError("The server sent a control message that is not JSON.");
      return;
    }
    if (event.type === "session.closing") this.closing = { code: event.code, reason: event.reason };
    if (event.type === "audio.sync") {
      // This frame left the server's track now; it is heard after the jitter buffer.
      const at = performance.now() + this.delayMs();
      // a new turn after a cancel: heard unmuted
      if (this.holdMute && !this.cancelled.has(event.turn)) this.unmuteAt(at);
      this.hooks.onAnchor(event.turn, event.offset_ms, at, Infinity);
    }
    this.hooks.onEvent(event);
  }

  /** RTP packets received so far, as the last stats poll counted them: the stall check
   *  starts with the first. */
  packetsReceived() {
    return this.packets ? this.packets.count : 0;
  }

  /** From leaving the server's track to being heard: the jitter buffer, then the output
   *  device (as the AudioContext reports it for the default output). */
  delayMs() {
    const ctx = this.ctx;
    const output = ctx ? ((ctx.baseLatency || 0) + (ctx.outputLatency || 0)) * 1000 : 0;
    return (this.jitterMs ?? FALLBACK_JITTER_MS) + output;
  }

  async pollStats() {
    if (!this.pc || this.closed) return;
    let stats;
    try {
      stats = await this.pc.getStats();
    } catch {
      return;
    }
    const now = performance.now();
    stats.forEach((r) => {
      if (r.type !== "inbound-rtp" || r.kind !== "audio") return;
      const received = r.packetsReceived ?? 0;
      if (!this.packets || received !== this.packets.count) this.packets = { count: received, at: now };
      const delay = r.jitterBufferDelay;
      const count = r.jitterBufferEmittedCount;
      if (!(count > 0)) return;
      const prev = this.lastStats;
      if (prev && count > prev.count) {
        // the delay over the last interval, not the average since the call began
        this.jitterMs = ((delay - prev.delay) / (count - prev.count)) * 1000;
      } else if (this.jitterMs === null) {
        this.jitterMs = (delay / count) * 1000;
      }
      this.lastStats = { delay, count };
      this.hooks.onBuffered(this.jitterMs);
    });
    // the server's track sends a packet every 20 ms, silence included: none for a while
    // means the server (or the path to it) is gone
    if (this.packets && this.packets.count > 0 && now - this.packets.at > this.stallMs) this.lost("stall");
  }

  send(message) {
    if (this.channel && this.channel.readyState === "open") this.channel.send(JSON.stringify(message));
  }

  async resume() {
    if (this.ctx && this.ctx.state !== "running") await this.ctx.resume();
    if (this.audio.srcObject && this.audio.paused) await this.audio.play().catch(() => {});
  }

  /** Play through the speaker with this deviceId ("" = the system's default); returns the
   *  one in use. */
  async setSpeaker(deviceId) {
    if (!RtcTransport.canPickSpeaker()) return null;
    if (this.audio.sinkId !== deviceId) await this.audio.setSinkId(deviceId);
    return typeof this.audio.sinkId === "string" ? this.audio.sinkId : "";
  }

  /** The deviceId of the microphone in use, or null. */
  micDeviceId() {
    return this.mic ? this.mic.track.getSettings().deviceId ?? null : null;
  }

  /** Silence these turns at once. `audible`: some of their audio has left the server's
   *  track (nothing to silence otherwise). */
  flushTurns(turns, audible = true) {
    // The server drops the turn's queued frames from its track, but the jitter buffer
    // still holds its tail (under load it grows past a second, more than the measured
    // delay): mute the output until the next turn's first audio is heard (its audio.sync
    // says when), so a cancel or barge-in is silent at once whatever the buffer holds.
    for (const t of turns) this.cancelled.add(t);
    if (!audible) return;
    this.setMuted(true);
    this.holdMute = true;
    clearTimeout(this.unmuteTimer);
    this.unmuteTimer = null;
  }

  setMuted(muted) {
    this.audio.muted = muted;
    if (this.outGain) this.outGain.gain.value = muted ? 0 : 1;
  }

  unmuteAt(at) {
    clearTimeout(this.unmuteTimer);
    this.unmuteTimer = setTimeout(() => {
      this.unmuteTimer = null;
      this.holdMute = false;
      this.setMuted(false);
    }, Math.max(0, at - performance.now()));
  }

  /** Microphone on or off; while on, the person's speech barges in with `mode`
   *  (barge_in.mode: "cancel" or "duck"). */
  async setMic(on, mode = "cancel", deviceId = "") {
    if (on && !this.mic) {
      if (!navigator.mediaDevices) throw new Error("this page cannot reach a microphone (not a secure context)");
      const stream = await navigator.mediaDevices.getUserMedia({ audio: micConstraints(deviceId) });
      if (this.closed) {
        for (const t of stream.getTracks()) t.stop();
        return;
      }
      const track = stream.getAudioTracks()[0];
      await this.transceiver.sender.replaceTrack(track);
      const source = this.ctx.createMediaStreamSource(stream);
      this.micAnalyser = this.ctx.createAnalyser();
      this.micAnalyser.fftSize = 1024;
      source.connect(this.micAnalyser);
      this.mic = { stream, track, source };
      this.send({ type: "session.update", barge_in: { mode } });
    } else if (!on && this.mic) {
      await this.stopMic();
      this.send({ type: "session.update", barge_in: { mode: "off" } });
    }
  }

  async stopMic() {
    if (!this.mic) return;
    const mic = this.mic;
    this.mic = null;
    this.micAnalyser = null;
    mic.source.disconnect();
    if (this.transceiver && this.pc && this.pc.signalingState !== "closed") {
      await this.transceiver.sender.replaceTrack(null).catch(() => {});
    }
    for (const t of mic.stream.getTracks()) t.stop();
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.statsTimer);
    clearTimeout(this.unmuteTimer);
    clearTimeout(this.disconnectTimer);
    this.stopMic();
    if (this.channel) this.channel.close();
    if (this.pc) this.pc.close();
    this.audio.srcObject = null;
    if (this.ctx) this.ctx.close().catch(() => {});
  }
}
