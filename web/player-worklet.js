// AudioWorklet: the WebSocket transport's playback ring. The page pushes decoded 20 ms
// chunks tagged with (turn, pts); this processor plays them in order and reports, for
// each chunk, the AudioContext time its first sample is rendered, so the page knows
// exactly when turn T's offset X plays. `flush` drops the queued chunks of given turns
// (a cancel is silent at once). A short prebuffer absorbs arrival jitter after an
// underrun; a lone short tail still plays once it has waited as long.

class PlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.prebuffer = Math.round(((opts.prebufferMs ?? 40) * sampleRate) / 1000);
    this.chunks = []; // {turn, pts, data: Float32Array, pos, arrived}
    this.queued = 0; // samples not yet played
    this.primed = false;
    this.lastReport = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(msg) {
    if (msg.type === "push") {
      this.chunks.push({ turn: msg.turn, pts: msg.pts, data: msg.samples, pos: 0, arrived: currentFrame });
      this.queued += msg.samples.length;
    } else if (msg.type === "flush") {
      const drop = msg.turns ? new Set(msg.turns) : null;
      this.chunks = drop ? this.chunks.filter((c) => !drop.has(c.turn)) : [];
      this.queued = this.chunks.reduce((n, c) => n + c.data.length - c.pos, 0);
      if (!this.chunks.length) this.primed = false;
      this.report(true);
    }
  }

  report(force) {
    if (!force && currentFrame - this.lastReport < sampleRate / 10) return;
    this.lastReport = currentFrame;
    this.port.postMessage({ type: "buffer", ms: (this.queued / sampleRate) * 1000, time: currentTime });
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    if (!out) return true;
    if (!this.primed && this.chunks.length) {
      const waited = currentFrame - this.chunks[0].arrived;
      if (this.queued >= this.prebuffer || waited >= this.prebuffer) this.primed = true;
    }
    let i = 0;
    if (this.primed) {
      while (i < out.length && this.chunks.length) {
        const c = this.chunks[0];
        if (c.pos === 0) {
          this.port.postMessage({ type: "playing", turn: c.turn, pts: c.pts, time: currentTime + i / sampleRate });
        }
        const n = Math.min(out.length - i, c.data.length - c.pos);
        out.set(c.data.subarray(c.pos, c.pos + n), i);
        c.pos += n;
        i += n;
        this.queued -= n;
        if (c.pos >= c.data.length) this.chunks.shift();
      }
      if (!this.chunks.length) {
        this.primed = false;
        this.port.postMessage({ type: "idle", time: currentTime + i / sampleRate });
      }
    }
    for (let ch = 1; ch < outputs[0].length; ch++) outputs[0][ch].set(out);
    this.report(false);
    return true;
  }
}

registerProcessor("voiceagent-player", PlayerProcessor);
