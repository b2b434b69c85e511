"""Framing: model PCM (24 kHz float32) in any chunking -> whole 20 ms frames at the
output rate. Owned by a turn's acoustic stream; encoding is the sender's (codecs.py)."""

from __future__ import annotations

import numpy as np

from .format import MODEL_RATE, frame_samples
from .resample import Float32Array, StreamResampler, as_mono_f32


class Framer:
    """Resamples and cuts into frames, carrying the remainder, so frames are identical
    however the input was chunked. `flush` ends the stream: it drains the resampler, adds
    `tail_samples` of silence (a codec's lookahead, so its decoder gets all the audio out)
    and zero-pads the last partial frame."""

    def __init__(self, rate: int, tail_samples: int = 0) -> None:
        self.rate = rate
        self.frame_samples = frame_samples(rate)
        self.tail_samples = tail_samples
        self._resampler = StreamResampler(MODEL_RATE, rate)
        self._pending: Float32Array = np.zeros(0, dtype=np.float32)
        self._dirty = False  # real audio entered since the last flush
        self.samples_out = 0  # real (unpadded) output-rate samples produced so far

    def frames(self, pcm: np.ndarray) -> list[Float32Array]:
        arr = as_mono_f32(pcm)
        if arr.size:
            self._dirty = True
        out = self._resampler.process(arr)
        self.samples_out += out.size
        return self._take(out)

    def flush(self) -> list[Float32Array]:
        tail = self._resampler.flush()
        self.samples_out += tail.size
        if not self._dirty and self._pending.size == 0 and tail.size == 0:
            return []
        self._dirty = False
        extra = self.tail_samples
        extra += -(self._pending.size + tail.size + extra) % self.frame_samples
        return self._take(np.concatenate([tail, np.zeros(extra, dtype=np.float32)]))

    def _take(self, more: Float32Array) -> list[Float32Array]:
        buf = np.concatenate([self._pending, more]) if self._pending.size else more
        n = self.frame_samples
        whole = buf.size // n * n
        frames = [buf[i : i + n].copy() for i in range(0, whole, n)]
        self._pending = buf[whole:].copy()
        return frames
