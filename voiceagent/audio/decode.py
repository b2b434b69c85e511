"""Reading reference audio of any common format (WAV, FLAC, MP3, Ogg, M4A, ...) with PyAV:
mono float32 in [-1, 1], resampled with soxr (HQ)."""

from __future__ import annotations

import io
import os
from itertools import chain
from pathlib import Path

import av
import numpy as np
import soxr

from voiceagent.audio.resample import Float32Array

AudioSource = str | os.PathLike[str] | bytes


class AudioTooLong(ValueError):
    """The audio lasts longer than the `max_seconds` a caller allowed."""


def source_name(source: AudioSource) -> str:
    return f"<{len(source)} bytes>" if isinstance(source, bytes) else str(source)


def decode_audio(source: AudioSource, max_seconds: float | None = None) -> tuple[Float32Array, int]:
    """Decode the first audio stream to mono float32 at its own rate (channels averaged,
    as CosyVoice's loader does). Raises ValueError if the audio cannot be read, has no
    samples, or lasts more than `max_seconds` (decoding stops as soon as it does)."""
    name = source_name(source)
    if not isinstance(source, bytes) and not Path(source).is_file():
        # ValueError, like every other unreadable input, so callers need one except clause.
        raise ValueError(f"cannot read audio {name}: no such file")
    chunks: list[np.ndarray] = []
    total = 0
    rate = 0
    try:
        with av.open(
            io.BytesIO(source) if isinstance(source, bytes) else os.fspath(source), mode="r"
        ) as c:
            if not c.streams.audio:
                raise ValueError(f"cannot read audio {name}: it has no audio stream")
            stream = c.streams.audio[0]
            # Packed float, whatever the codec's format: interleaved channels in one plane.
            # (Not planar: PyAV's arrays of planar audio crash from 8 channels up.)
            to_float = av.AudioResampler(format="flt")
            for frame in chain(c.decode(stream), [None]):  # None flushes the converter
                for f in to_float.resample(frame):
                    rate = f.sample_rate
                    channels = f.layout.nb_channels
                    pcm = f.to_ndarray().reshape(-1, channels).mean(axis=1, dtype=np.float32)
                    chunks.append(pcm)
                    total += pcm.size
                if max_seconds is not None and rate and total > max_seconds * rate:
                    raise AudioTooLong(
                        f"audio {name} is longer than the {max_seconds:g} s allowed here"
                    )
    except av.FFmpegError as exc:
        raise ValueError(f"cannot read audio {name}: {exc}") from exc
    if total == 0:
        raise ValueError(f"cannot read audio {name}: it has no samples")
    mono = np.concatenate(chunks)
    if not np.isfinite(mono).all():
        raise ValueError(f"cannot read audio {name}: it has non-finite samples")
    return mono, rate


def resample(pcm: np.ndarray, from_rate: int, to_rate: int) -> Float32Array:
    """Whole-clip soxr HQ resampling, clipped to [-1, 1] (the filter may overshoot a little)."""
    x = np.ascontiguousarray(pcm, dtype=np.float32)
    if from_rate != to_rate:
        x = soxr.resample(x, from_rate, to_rate, quality="HQ").astype(np.float32, copy=False)
    return np.clip(x, -1.0, 1.0)


def load_audio(source: AudioSource, rate: int, max_seconds: float | None = None) -> Float32Array:
    """A file path or encoded bytes -> mono float32 in [-1, 1] at `rate`."""
    pcm, source_rate = decode_audio(source, max_seconds)
    return resample(pcm, source_rate, rate)
