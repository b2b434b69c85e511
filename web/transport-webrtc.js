// WebRTC transport: one peer connection with a sendrecv audio transceiver (the bot's
// voice comes down, the microphone goes up when it is on) and one data channel carrying
// the session protocol's JSON. Signaling: POST /v1/webrtc/offer, no trickle ICE.
// The playback clock: the server sends `audio.sync` when a turn's frame at `offset_ms`
// leaves its track; it plays about one jitter-buffer delay after it arrives here.

const FALLBACK_JITTER_MS = 60;

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

export class RtcTransport {
  /** hooks: see WsTransport */
  constructor(hooks, audioElement) {
    this.name = "WebRTC";
    this.hooks = hooks;
    this.audio = audioElement;
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
    this.outGain = null; // mirrors the element's mute for the analyser
    this.closed = false;
  }

  async connect() {
    if (typeof RTCPeerConnection === "undefined") throw new Error("this browser has no WebRTC");
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
      if (!this.closed) this.hooks.onState(s === "new" ? "connecting" : s);
      if (s === "failed" && !this.closed) this.hooks.onError("The WebRTC connection failed.");
    };
    channel.onmessage = (e) => this.onMessage(e.data);
    channel.onclose = () => {
      if (!this.closed) this.hooks.onState("closed");
    };
    this.hooks.onState("connecting");

    await pc.setLocalDescription(await pc.createOffer());
    await waitFor(() => pc.iceGatheringState === "complete", pc, "icegatheringstatechange", 5000, "ICE gathering did not finish").catch(
      () => {}, // send what was gathered so far
    );
    const headers = { "content-type": "application/json" };
    const token = new URLSearchParams(location.search).get("token"); // auth on: docs/security.md
    if (token) headers.authorization = `Bearer ${token}`;
    const response = await fetch("/v1/webrtc/offer", {
      method: "POST",
      headers,
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer" }),
    });
    let answer = null;
    try {
      answer = await response.json();
    } catch {
      // not JSON: reported below
    }
    if (!response.ok || !answer || answer.type !== "answer") {
      const why = answer && answer.message ? answer.message : `HTTP ${response.status}`;
      throw new Error(`the server refused the WebRTC offer: ${why}`);
    }
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    await waitFor(() => channel.readyState === "open", channel, "open", 10000, "the data channel did not open");
    this.statsTimer = setInterval(() => this.pollStats(), 250);
    this.hooks.onState("connected");
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
    if (event.type === "audio.sync") {
      // This frame left the server's track now; it is heard after the jitter buffer.
      const at = performance.now() + this.delayMs();
      if (this.unmuteTimer !== null) this.unmuteAt(at); // a new turn: heard unmuted
      this.hooks.onAnchor(event.turn, event.offset_ms, at, Infinity);
    }
    this.hooks.onEvent(event);
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
    stats.forEach((r) => {
      if (r.type !== "inbound-rtp" || r.kind !== "audio") return;
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
  }

  send(message) {
    if (this.channel && this.channel.readyState === "open") this.channel.send(JSON.stringify(message));
  }

  async resume() {
    if (this.ctx && this.ctx.state !== "running") await this.ctx.resume();
    if (this.audio.srcObject && this.audio.paused) await this.audio.play().catch(() => {});
  }

  flushTurns() {
    // The server drops the turn's queued frames from its track, but the jitter buffer
    // still holds its tail (under load it grows past a second): mute the output until that
    // has played out, so a cancel or barge-in is silent at once.
    this.setMuted(true);
    this.unmuteAt(performance.now() + this.delayMs() + 20);
  }

  setMuted(muted) {
    this.audio.muted = muted;
    if (this.outGain) this.outGain.gain.value = muted ? 0 : 1;
  }

  unmuteAt(at) {
    clearTimeout(this.unmuteTimer);
    this.unmuteTimer = setTimeout(() => {
      this.unmuteTimer = null;
      this.setMuted(false);
    }, Math.max(0, at - performance.now()));
  }

  /** Microphone on or off; while on, the person's speech barges in with `mode`
   *  (barge_in.mode: "cancel" or "duck"). */
  async setMic(on, mode = "cancel") {
    if (on && !this.mic) {
      if (!navigator.mediaDevices) throw new Error("this page cannot reach a microphone (not a secure context)");
      const stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
      });
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
    this.stopMic();
    if (this.channel) this.channel.close();
    if (this.pc) this.pc.close();
    this.audio.srcObject = null;
    if (this.ctx) this.ctx.close().catch(() => {});
  }
}
