"""Stage `feats`: every teacher WAV at the model's rate, with the flow's mel of it.

The model speaks at 24 kHz and its flow works on CosyVoice2's 80-bin log-mel at 50 Hz
(`audio.features.prompt_mel`, hop 480), so the teacher's 22.05 kHz speech is resampled
(soxr) and cut to an even number of mel frames: two frames per 25 Hz speech token, and
frame i covers samples 480 i .. 480 (i + 1), which the vocoder learns to invert.

On disk (DIR/feats/): <id>.npz with `wav` (int16, 24 kHz, 480 x frames samples) and
`mel` (float32 [frames, 80]); stage.json once every manifest row has its file.
"""

from __future__ import annotations

import hashlib
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

from ..audio.features import prompt_mel
from . import teacher
from .files import read_marker, write_json, written

RATE = 24000
HOP = 480  # samples per mel frame
FRAMES_PER_TOKEN = 2


@dataclass(frozen=True)
class Utterance:
    id: str
    text: str
    split: str  # "train" or "heldout"


def feats_dir(work: Path) -> Path:
    return work / "feats"


def utterances(work: Path) -> list[Utterance]:
    """The teacher's manifest rows, in corpus order."""
    lines = (teacher.teacher_dir(work) / "manifest.tsv").read_text(encoding="utf-8")
    rows = [line.split("\t") for line in lines.splitlines()[1:] if line]
    return [Utterance(r[0], r[2], r[3]) for r in rows]


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """16-bit mono WAV -> float32 samples in [-1, 1] and the rate."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: not 16-bit mono")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return data.astype(np.float32) / 32768.0, w.getframerate()


def compute(samples: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(24 kHz float32 samples, mel [frames, 80]) with frames even and samples = 480 x frames."""
    x = soxr.resample(samples, rate, RATE).astype(np.float32) if rate != RATE else samples
    frames = len(x) // HOP
    frames -= frames % FRAMES_PER_TOKEN
    x = np.clip(x[: frames * HOP], -1.0, 1.0)
    return x, prompt_mel(x)


def save(path: Path, wav: np.ndarray, mel: np.ndarray) -> None:
    with written(path) as tmp:
        np.savez(tmp, wav=np.round(wav * 32767).astype(np.int16), mel=mel.astype(np.float32))


def load(work: Path, utt_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(wav float32 at 24 kHz, mel float32 [frames, 80]) of one utterance."""
    with np.load(feats_dir(work) / f"{utt_id}.npz") as f:
        return f["wav"].astype(np.float32) / 32767.0, f["mel"]


def manifest_digest(work: Path) -> str:
    """Which utterances the teacher's manifest lists (a new corpus sentence changes it)."""
    ids = "\n".join(u.id for u in utterances(work))
    return hashlib.sha1(ids.encode()).hexdigest()


def is_complete(work: Path) -> bool:
    """Every utterance of the teacher's manifest has its features."""
    done = read_marker(feats_dir(work) / "stage.json")
    return done is not None and done.get("manifest") == manifest_digest(work)


def run(work: Path) -> Iterator[str]:
    """Compute what is missing; yields progress lines."""
    out = feats_dir(work)
    out.mkdir(parents=True, exist_ok=True)
    utts = utterances(work)
    wav_dir = teacher.teacher_dir(work) / "wav"
    frames_total = done = 0
    for i, u in enumerate(utts):
        path = out / f"{u.id}.npz"
        if not path.exists():
            wav, mel = compute(*read_wav(wav_dir / f"{u.id}.wav"))
            save(path, wav, mel)
            done += 1
        if (i + 1) % 250 == 0:
            yield f"feats: {i + 1}/{len(utts)}"
    for u in utts:
        with np.load(out / f"{u.id}.npz") as f:
            frames_total += f["mel"].shape[0]
    summary = {
        "utterances": len(utts),
        "computed": done,
        "mel_frames": frames_total,
        "manifest": manifest_digest(work),
    }
    write_json(out / "stage.json", summary)
    yield f"feats: {len(utts)} utterances ({done} new), {frames_total / 50 / 3600:.2f} hours"
