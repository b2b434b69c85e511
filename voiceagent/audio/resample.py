"""Streaming sample-rate conversion for mono float32 PCM."""

from __future__ import annotations

import numpy as np
import soxr
from numpy.typing import NDArray

Float32Array = NDArray[np.float32]

_EMPTY: Float32Array = np.zeros(0, dtype=np.float32)


def as_mono_f32(x: np.ndarray) -> Float32Array:
    """Validate a mono chunk and return it as contiguous float32."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    if arr.ndim != 1:
        raise ValueError(f"expected mono 1-D PCM, got shape {arr.shape}")
    return arr


class StreamResampler:
    """Chunk-size-independent resampler: concatenated output of any chunking
    equals that of one call with the whole stream (soxr keeps the filter state
    and compensates its own delay, so output sample 0 lines up with input 0).

    soxr buffers internally, so output lags input by up to ~35 ms (24k->48k,
    HQ); `flush()` releases that tail at end of stream.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: str = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.quality = quality
        self._stream: soxr.ResampleStream | None = self._new_stream()

    def _new_stream(self) -> soxr.ResampleStream | None:
        if self.in_rate == self.out_rate:
            return None
        return soxr.ResampleStream(
            self.in_rate, self.out_rate, 1, dtype="float32", quality=self.quality
        )

    @property
    def passthrough(self) -> bool:
        return self._stream is None

    def process(self, x: np.ndarray) -> Float32Array:
        arr = as_mono_f32(x)
        if self._stream is None:
            return arr.copy()
        if arr.size == 0:
            return _EMPTY.copy()
        out: Float32Array = self._stream.resample_chunk(arr)
        return out

    def flush(self) -> Float32Array:
        """Return the buffered tail; the resampler is then ready for a new stream."""
        if self._stream is None:
            return _EMPTY.copy()
        out: Float32Array = self._stream.resample_chunk(_EMPTY, last=True)
        # soxr cannot accept input after last=True; start clean for reuse.
        self._stream = self._new_stream()
        return out
