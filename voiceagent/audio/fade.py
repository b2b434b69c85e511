"""The last frame of a cut-short turn, faded: a cancel or barge-in on a transport that
paces its own frames (WebRTC, AudioSocket) ends in a short fade, not a step to silence
(a step from mid-wave to zero clicks: 0.48 of full scale where speech moves 0.01)."""

from __future__ import annotations

import numpy as np

FADE_S = 0.01


def fade_out(pcm: bytes, rate: int) -> bytes:
    """Little-endian int16 PCM at `rate`, faded linearly to silence over its first
    FADE_S and silent after."""
    x = np.frombuffer(pcm, "<i2").astype(np.float32)
    n = min(x.size, max(1, round(FADE_S * rate)))
    gain = np.zeros(x.size, np.float32)
    gain[:n] = np.linspace(1.0, 0.0, n + 1, dtype=np.float32)[1:]
    return np.rint(x * gain).astype("<i2").tobytes()
