"""`voiceagent bench --scenario intelligibility`: does a recognizer understand the server's
speech of the held-out sentences, and how well next to the teacher's speech of the same?

The sentences are `--sentences` rows of the training work directory's
corpus/heldout.tsv (docs/training.md), spread evenly over it (the corpus writes its
sources one after another). A server on loopback speaks them one at a time, one
WebSocket session per sentence, Opus at 48 kHz (the default format); each is sent in its
written form, as a user would send it, and the server normalizes it. The client times the
first audio frame (TTFA) and reads the turn's RTF from turn.done (as the ws bench does),
decodes the Opus frames to PCM, and once every sentence is spoken, pocketsphinx
(train/wer.py) transcribes them in a process pool, with the teacher's WAVs of the same
sentences (teacher/wav/<id>.wav, and every further draw the teacher stage spoke with
`--heldout-draws`). Both WERs are pooled over their sentences against the spoken form
(`corpus_wer`). pocketsphinx is a weak recognizer: the two numbers are for
comparing voices on the same sentences, not absolute measures.

A voice samples its speech tokens, so one sampling of each sentence is one draw: with
`--seeds N` each sentence is spoken N times (sampling seeds 0 to N-1), the WER pools
them all, and `wer_by_seed` shows how far one draw of the same sentences moves (on
100 sentences, about as far as two voices of adjacent training runs differ). The teacher
samples too (Piper's noise, unseeded): one speaking of the 100 sentences was heard at
0.282 on one machine and 0.309 on the next, so the teacher's WER pools its draws in the
same way (`wer_by_draw`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import opuslib

from ..model.speech_model import SpeechModel
from ..protocol import frames
from ..server.app import ServerConfig
from ..server.background import BackgroundServer, free_port
from ..train import corpus, teacher, wer
from ..train.corpus import Sentence
from ..train.feats import read_wav
from .clients import Client, connect
from .served import served_engine, served_playout
from .ws import TurnSample, percentile

DEFAULT_SENTENCES = 100
# Held-out sentences have at most 20 spoken words (about 6 s); a voice that babbles on is
# cut here (per segment), which also bounds a random model's noise.
MAX_SPEECH_S = 15.0
OPUS_RATE = 48000
UNPACED_LEAD_MS = 10_000_000  # the bench plays nothing: frames go out as they are made
WARM_UP = "Thanks for calling, how can I help you today?"


class BenchError(Exception):
    """The bench cannot run: what is missing and how to make it."""


@dataclass
class Spoken:
    """One sentence as the server spoke it."""

    sentence: Sentence
    seed: int
    sample: TurnSample
    pcm: np.ndarray  # mono float32 at OPUS_RATE


def heldout(work: Path, n: int) -> list[Sentence]:
    """`n` held-out sentences of the work directory, spread over all of them, in order."""
    path = corpus.corpus_dir(work) / "heldout.tsv"
    if not path.is_file():
        raise BenchError(
            f"no held-out corpus in {work} ({path} is missing): run `voiceagent train corpus` "
            "and `voiceagent train teacher` first (with --out, if the work directory is "
            "not the default)"
        )
    sentences = corpus.spread(corpus.read_tsv(path), n)
    if not sentences:
        raise BenchError(f"{path} has no sentences: run `voiceagent train corpus` again")
    return sentences


def check_recognizer() -> None:
    if importlib.util.find_spec("pocketsphinx") is None:
        raise BenchError(
            "pocketsphinx is not installed: the intelligibility bench needs it "
            "(pip install '.[test]', or bash deploy/setup.sh --test)"
        )


def decode_opus(turn_frames: list[frames.AudioFrame]) -> np.ndarray:
    """A turn's Opus frames, in order, as mono float32 PCM at 48 kHz."""
    decoder = opuslib.Decoder(OPUS_RATE, 1)
    parts = []
    for f in turn_frames:
        if f.codec != "opus":
            raise RuntimeError(f"expected Opus frames, got {f.codec}")
        # 120 ms: the longest Opus frame; the server's are 20 ms
        parts.append(np.frombuffer(decoder.decode(f.payload, OPUS_RATE * 120 // 1000), "<i2"))
    if not parts:
        return np.zeros(0, np.float32)
    return np.concatenate(parts).astype(np.float32) / 32768


async def speak(url: str, text: str, seed: int) -> tuple[TurnSample, list[frames.AudioFrame]]:
    """`text` spoken in a session of its own (Opus, sampling seed `seed`): the turn's
    TTFA and timings, and its audio frames."""
    async with connect(url) as ws:
        client = Client(ws)
        await client.start(sampling={"seed": seed}, format={"codec": "opus"})
        sent = time.perf_counter()
        await client.send({"type": "speak", "text": text})
        result = await client.turn(until=("turn.done", "error"), timeout=None)
    event = result.events[-1]
    if event["type"] == "error":
        raise RuntimeError(f"bench turn failed on {text!r}: {event}")
    if result.first_frame_at is None:
        raise RuntimeError(f"the turn for {text!r} finished without audio")
    timings = event["timings"]
    ttfa_ms = (result.first_frame_at - sent) * 1000
    sample = TurnSample(ttfa_ms, timings["rtf"], timings["audio_ms"], timings["tokens"])
    return sample, result.frames


def synthesize(
    model: SpeechModel, sentences: list[Sentence], max_speech_s: float, seeds: int = 1
) -> list[Spoken]:
    """Each sentence's written form spoken by a server on loopback, one session at a time,
    once per sampling seed 0 to `seeds` - 1 (seed by seed)."""
    playout = served_playout(lead_ms=UNPACED_LEAD_MS, max_segment_tokens=int(max_speech_s * 25))
    config = ServerConfig(port=free_port(), playout=playout)
    spoken = []
    with BackgroundServer(model, config, **served_engine(model)) as server:
        asyncio.run(speak(server.url, WARM_UP, 0))  # first-call allocations
        for seed in range(seeds):
            for s in sentences:
                sample, turn_frames = asyncio.run(speak(server.url, s.written, seed))
                spoken.append(Spoken(s, seed, sample, decode_opus(turn_frames)))
    return spoken


def transcribe_all(clips: list[tuple[np.ndarray, int]], workers: int | None = None) -> list[str]:
    """pocketsphinx's transcript of each (pcm, rate), in order, in a pool of processes
    (one per core by default; forkserver: the workers are not forks of a process with
    a model and its threads)."""
    if not clips:
        return []
    workers = max(1, min(workers or len(os.sched_getaffinity(0)), len(clips)))
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(wer.transcribe, *zip(*clips, strict=True)))


def measure(
    model: SpeechModel,
    work: Path,
    sentences: int = DEFAULT_SENTENCES,
    max_speech_s: float = MAX_SPEECH_S,
    workers: int | None = None,
    seeds: int = 1,
) -> dict[str, Any]:
    check_recognizer()
    picked = heldout(work, sentences)
    start = time.perf_counter()
    spoken = synthesize(model, picked, max_speech_s, seeds)
    synth_s = time.perf_counter() - start

    # the teacher's draws: Piper's noise is unseeded, so each speaking is another sample
    draws = [{s.id: d / f"{s.id}.wav" for s in picked} for d in teacher.draws(work)]
    draws = [{i: p for i, p in d.items() if p.is_file()} for d in draws]
    missing = [s.id for s in picked if s.id not in draws[0]]
    clips = [(x.pcm, OPUS_RATE) for x in spoken]
    for d in draws:
        clips += [read_wav(p) for p in d.values()]
    start = time.perf_counter()
    hyps = iter(transcribe_all(clips, workers))
    asr_s = time.perf_counter() - start
    ours_hyp = [next(hyps) for _ in spoken]
    teacher_hyps = [{i: next(hyps) for i in d} for d in draws]
    teacher_hyp = teacher_hyps[0]
    text = {s.id: s.text for s in picked}
    teacher_by_draw = [[(text[i], h) for i, h in d.items()] for d in teacher_hyps if d]

    samples = [x.sample for x in spoken]
    ttfa = [x.ttfa_ms for x in samples]
    ours_pairs = [(x.sentence.text, hyp) for x, hyp in zip(spoken, ours_hyp, strict=True)]
    by_seed = [ours_pairs[i * len(picked) : (i + 1) * len(picked)] for i in range(seeds)]
    return {
        "model": model.name,
        "work": str(work),
        "ours": {
            "wer": round(wer.corpus_wer(ours_pairs), 4),
            "wer_by_seed": [round(wer.corpus_wer(pairs), 4) for pairs in by_seed],
            "ttfa_ms_p50": round(statistics.median(ttfa), 1),
            "ttfa_ms_p95": round(percentile(ttfa, 0.95), 1),
            "rtf": round(statistics.mean(x.rtf for x in samples), 4),
            "audio_s_per_sentence": round(statistics.mean(x.audio_ms for x in samples) / 1000, 2),
            "sentences": len(picked),
            "seeds": seeds,
        },
        "teacher": {
            "wer": (
                round(wer.corpus_wer([p for d in teacher_by_draw for p in d]), 4)
                if teacher_by_draw
                else None
            ),
            "wer_by_draw": [round(wer.corpus_wer(d), 4) for d in teacher_by_draw],
            "sentences": len(teacher_hyp),
            "draws": len(teacher_by_draw),
            "missing": missing,
        },
        "words": sum(len(wer.words(s.text)) for s in picked),
        "max_speech_s": max_speech_s,
        "synthesis_s": round(synth_s, 1),
        "transcription_s": round(asr_s, 1),
        "per_sentence": [
            _row(x, hyp, teacher_hyp.get(x.sentence.id))
            for x, hyp in zip(spoken, ours_hyp, strict=True)
        ],
    }


def _row(spoken: Spoken, hyp: str, teacher_hyp: str | None) -> dict[str, Any]:
    s = spoken.sentence
    return {
        "id": s.id,
        "seed": spoken.seed,
        "text": s.text,
        "written": s.written,
        "ours": hyp,
        "ours_wer": round(wer.word_error_rate(s.text, hyp), 3),
        "teacher": teacher_hyp,
        "teacher_wer": (
            None if teacher_hyp is None else round(wer.word_error_rate(s.text, teacher_hyp), 3)
        ),
        "ttfa_ms": round(spoken.sample.ttfa_ms, 1),
        "audio_s": round(spoken.sample.audio_ms / 1000, 2),
    }


def table(report: dict[str, Any]) -> str:
    ours, tea = report["ours"], report["teacher"]
    teacher_wer = "-" if tea["wer"] is None else f"{tea['wer']:.3f}"
    lines = [
        f"{'voice':<10}{'sentences':>10}{'WER':>8}{'TTFA p50 ms':>13}{'TTFA p95 ms':>13}{'RTF':>8}",
        f"{'ours':<10}{ours['sentences']:>10}{ours['wer']:>8.3f}{ours['ttfa_ms_p50']:>13}"
        f"{ours['ttfa_ms_p95']:>13}{ours['rtf']:>8}",
        f"{'teacher':<10}{tea['sentences']:>10}{teacher_wer:>8}{'-':>13}{'-':>13}{'-':>8}",
        f"model {report['model']}; {report['words']} reference words; pocketsphinx WER, "
        f"pooled over the sentences",
    ]
    if ours["seeds"] > 1:
        each = ", ".join(f"{w:.3f}" for w in ours["wer_by_seed"])
        n = ours["seeds"]
        lines.append(f"each sentence spoken {n} times (sampling seeds 0-{n - 1}): WER {each}")
    if tea["draws"] > 1:
        each = ", ".join(f"{w:.3f}" for w in tea["wer_by_draw"])
        lines.append(f"the teacher's speech in {tea['draws']} draws (Piper's noise): WER {each}")
    if tea["missing"]:
        lines.append(
            f"teacher WAVs missing for {len(tea['missing'])} of {ours['sentences']} sentences "
            f"({', '.join(tea['missing'][:5])}{', ...' if len(tea['missing']) > 5 else ''}): "
            "its WER is over the rest (voiceagent train teacher speaks them)"
        )
    return "\n".join(lines)
