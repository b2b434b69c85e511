"""Loudness of a frame on a 0..1 scale, for lip sync (`audio.levels` events)."""

from __future__ import annotations

import math

import numpy as np

FLOOR_DB = -60.0  # at or below this a frame counts as silent (level 0)


def loudness(frame: np.ndarray) -> float:
    """RMS of float PCM in dBFS mapped linearly: -60 dBFS or less -> 0, 0 dBFS -> 1."""
    if frame.size == 0:
        return 0.0
    rms = math.sqrt(float(np.mean(np.square(frame, dtype=np.float64))))
    if rms <= 0.0:
        return 0.0
    db = 20.0 * math.log10(rms)
    return min(1.0, max(0.0, (db - FLOOR_DB) / -FLOOR_DB))
