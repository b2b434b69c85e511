"""16-bit mono WAV output for debugging and offline renders."""

from __future__ import annotations

import os
import wave
from typing import BinaryIO

import numpy as np

from voiceagent.audio.resample import as_mono_f32

from .codecs import float_to_int16


def write_wav(
    path_or_file: str | os.PathLike[str] | BinaryIO, pcm: np.ndarray, sample_rate: int
) -> None:
    """Write float32 mono PCM in [-1, 1] (clipped) as 16-bit little-endian WAV."""
    data = float_to_int16(as_mono_f32(pcm)).astype("<i2").tobytes()
    # wave.open only treats str as a path; anything else must be a file object.
    target = os.fspath(path_or_file) if isinstance(path_or_file, os.PathLike) else path_or_file
    with wave.open(target, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(data)
