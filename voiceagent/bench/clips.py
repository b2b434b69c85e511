"""Speech for a client to send, made on the spot: real speech from espeak-ng (when it is
installed), or a synthetic voiced vowel (always available)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..audio.resample import StreamResampler


def have_espeak() -> bool:
    return shutil.which("espeak-ng") is not None


def espeak_wav(path: Path, text: str, voice_args: Sequence[str] = ()) -> Path:
    """`text` spoken by espeak-ng into the WAV file `path` (16-bit mono, 22050 Hz);
    `voice_args` are espeak-ng options, e.g. ("-v", "en+f3", "-p", "80")."""
    cmd = ["espeak-ng", *voice_args, "-w", str(path), text]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)
    return path


def espeak_pcm(text: str, rate: int | None = None) -> tuple[np.ndarray, int]:
    """`text` spoken by espeak-ng as float32 mono in [-1, 1), at `rate` (resampled) or
    at espeak-ng's own rate; returns (pcm, its rate)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = espeak_wav(Path(tmp) / "speech.wav", text)
        with wave.open(str(path)) as w:
            if w.getnchannels() != 1 or w.getsampwidth() != 2:
                raise ValueError("espeak-ng wrote something other than 16-bit mono")
            native = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    if rate is None or rate == native:
        return pcm, native
    resampler = StreamResampler(native, rate)
    return np.concatenate([resampler.process(pcm), resampler.flush()]), rate


def vowel(seconds: float = 1.5, rate: int = 48000) -> np.ndarray:
    """A voiced, speech-like sound (120 Hz with three formants, syllable-rate loudness)
    that webrtcvad takes for speech; no recording or TTS needed."""
    t = np.arange(int(rate * seconds)) / rate
    phase = 2 * np.pi * np.cumsum(120 + 10 * np.sin(2 * np.pi * 3 * t)) / rate
    sig = np.zeros_like(t)
    for k in range(1, 30):
        env = sum(
            np.exp(-((((120 * k) - f) / bw) ** 2))
            for f, bw in ((700, 130), (1200, 150), (2600, 250))
        )
        sig += env * np.sin(k * phase)
    sig *= 0.3 / np.abs(sig).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    return sig.astype(np.float32)
