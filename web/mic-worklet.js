// AudioWorklet: microphone capture for the WebSocket transport. Low-passes and decimates
// the context-rate input to `rate` (16 kHz by default) and posts 20 ms PCM16 chunks
// (little-endian Int16Array buffers, transferred) plus a peak level for the meter.

class MicProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.rate = opts.rate || 16000;
    this.step = sampleRate / this.rate;
    // one-pole low-pass a little below the new Nyquist frequency
    this.alpha = 1 - Math.exp((-2 * Math.PI * 0.45 * this.rate) / sampleRate);
    this.lp = 0;
    this.phase = 0;
    this.size = Math.round(this.rate / 50); // 20 ms
    this.chunk = new Int16Array(this.size);
    this.n = 0;
    this.peak = 0;
  }

  process(inputs) {
    const input = inputs[0];
    const x = input && input[0];
    if (!x) return true;
    for (let i = 0; i < x.length; i++) {
      this.lp += this.alpha * (x[i] - this.lp);
      this.phase += 1;
      if (this.phase < this.step) continue;
      this.phase -= this.step;
      const s = Math.max(-1, Math.min(1, this.lp));
      this.peak = Math.max(this.peak, Math.abs(s));
      this.chunk[this.n++] = Math.round(s * 32767);
      if (this.n === this.size) {
        const pcm = this.chunk;
        this.port.postMessage({ pcm: pcm.buffer, peak: this.peak }, [pcm.buffer]);
        this.chunk = new Int16Array(this.size); // the old buffer was transferred
        this.n = 0;
        this.peak = 0;
      }
    }
    return true;
  }
}

registerProcessor("voiceagent-mic", MicProcessor);
