"""Real human phone speech for tests: Debian's Asterisk prompts (one female speaker,
"Allison", 8 kHz mono 16-bit WAV, CC-BY-SA 3.0) with their transcripts.

- audio: package `asterisk-core-sounds-en-wav`, in /usr/share/asterisk/sounds/en_US_f_Allison
  (subfolders such as digits/ and letters/ hold prompts named "digits/5", ...);
- texts: package `asterisk-core-sounds-en`, /usr/share/doc/asterisk-core-sounds-en/
  core-sounds-en.txt.gz, one "name: text" line per prompt (";" starts a comment, and
  non-speech sounds are bracketed, e.g. "beep: [this is a simple beep tone]").

Without the transcript package every prompt still loads, with `text` None.
"""

from __future__ import annotations

import gzip
import wave
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

SOUNDS_DIR = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
TRANSCRIPTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
RATE = 8000


@dataclass(frozen=True)
class Prompt:
    name: str  # relative to SOUNDS_DIR, without ".wav": "auth-thankyou", "digits/5"
    text: str | None  # the transcript, None when the transcript package is absent
    pcm: NDArray[np.int16]  # mono, RATE Hz

    @property
    def seconds(self) -> float:
        return self.pcm.size / RATE

    @property
    def is_speech(self) -> bool:
        """False for tones and silences (bracketed in the transcript) and unknown texts."""
        return self.text is not None and not self.text.startswith("[")


def available(sounds_dir: Path = SOUNDS_DIR) -> bool:
    return sounds_dir.is_dir() and any(sounds_dir.glob("*.wav"))


def read_wav(path: Path) -> NDArray[np.int16]:
    """A 16-bit mono WAV at RATE as int16 (the prompts are all that; anything else is
    refused rather than silently converted)."""
    with wave.open(str(path)) as w:
        if (w.getnchannels(), w.getsampwidth(), w.getframerate()) != (1, 2, RATE):
            raise ValueError(f"{path}: expected 16-bit mono {RATE} Hz, got {w.getparams()}")
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.int16)


def transcripts(path: Path = TRANSCRIPTS) -> dict[str, str]:
    """name -> text from core-sounds-en.txt(.gz); empty when the file is missing."""
    if not path.exists():
        plain = path.with_suffix("")  # some packagings ship it uncompressed
        if not plain.exists():
            return {}
        path = plain
    opener = gzip.open if path.suffix == ".gz" else open
    texts: dict[str, str] = {}
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(";") or ": " not in line:
                continue
            name, text = line.split(": ", 1)
            texts[name.strip()] = " ".join(text.split())  # the file has double spaces
    return texts


@cache
def prompts(sounds_dir: Path = SOUNDS_DIR, transcript: Path = TRANSCRIPTS) -> tuple[Prompt, ...]:
    """Every prompt with a WAV file, sorted by name (cached: ~25 minutes of audio, 25 MB)."""
    texts = transcripts(transcript)
    found = []
    for path in sorted(sounds_dir.rglob("*.wav")):
        name = path.relative_to(sounds_dir).with_suffix("").as_posix()
        found.append(Prompt(name, texts.get(name), read_wav(path)))
    return tuple(found)


def prompt(name: str, sounds_dir: Path = SOUNDS_DIR) -> Prompt:
    for p in prompts(sounds_dir):
        if p.name == name:
            return p
    raise KeyError(f"no prompt {name!r} in {sounds_dir}")


def barge_in_sentences(
    n: int = 5, min_s: float = 1.0, max_s: float = 3.0, sounds_dir: Path = SOUNDS_DIR
) -> list[Prompt]:
    """`n` whole spoken sentences of `min_s`..`max_s` seconds (at least three words and a
    final full stop, so each is one clear utterance), loudest first so that a VAD hears
    them at once; ties and order are deterministic. Fewer when transcripts are absent."""
    fits = [
        p
        for p in prompts(sounds_dir)
        if p.is_speech
        and min_s <= p.seconds <= max_s
        and p.text is not None
        and p.text.endswith(".")
        and len(p.text.split()) >= 3
    ]
    fits.sort(key=lambda p: (-_rms(p.pcm), p.name))
    return fits[:n]


def _rms(pcm: NDArray[np.int16]) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if pcm.size else 0.0
