"""`voiceagent bench --scenario isolation`: what bit-exact isolation costs, and buys.

Servers with `engine.acoustic_batching` "invariant" and "batched" are measured in one
run, interleaved (each repeat runs both, the order alternating), so the machine's load
weighs on both alike. At each level, that many PCM16 WebSocket sessions speak `--turns`
turns each (the ws scenario's sentences, voices and seeds), paced as `serve` paces.
Reported per mode and level (the median over repeats):

- TTFA p50/p95 at the client, RTF from turn.done, as in the ws scenario;
- `acoustic_ms_per_audio_s`: the acoustic thread's flow + vocoder compute per second of
  audio (its `voiceagent_acoustic_chunk_seconds` sums), the direct cost of batching or not;
- `differing_samples`: PCM16 samples, over all turns of all repeats, that differ from
  the same session's turns rendered alone (before the runs, one session at a time), and
  `differing_turns`.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.acoustic import ACOUSTIC_BATCHING, AcousticBatching
from ..model.speech_model import SpeechModel
from ..server.app import ServerConfig
from ..server.background import BackgroundServer, free_port
from .clients import Client, connect
from .served import served_engine, served_playout
from .ws import TEXTS, percentile


@dataclass
class Turn:
    ttfa_ms: float
    rtf: float
    audio_ms: float
    pcm: np.ndarray  # int16


async def _session(url: str, index: int, turns: int, voices: list[str]) -> list[Turn]:
    out = []
    async with connect(url) as ws:
        client = Client(ws)
        await client.start(
            voice=voices[index % len(voices)], sampling={"seed": index}, format={"codec": "pcm16"}
        )
        for t in range(turns):
            sent = time.perf_counter()
            await client.send({"type": "speak", "text": TEXTS[(index + t) % len(TEXTS)]})
            result = await client.turn(until=("turn.done", "error"), timeout=None)
            event = result.events[-1]
            if event["type"] == "error" or result.first_frame_at is None:
                raise RuntimeError(f"bench turn failed: {event}")
            pcm = np.concatenate([np.frombuffer(f.payload, "<i2") for f in result.frames])
            timings = event["timings"]
            ttfa = (result.first_frame_at - sent) * 1000
            out.append(Turn(ttfa, timings["rtf"], timings["audio_ms"], pcm))
    return out


def _acoustic_seconds(server: BackgroundServer) -> float:
    registry = server.engine.metrics.registry
    return sum(
        registry.get_sample_value("voiceagent_acoustic_chunk_seconds_sum", {"stage": s}) or 0.0
        for s in ("flow", "vocoder")
    )


def _level(
    server: BackgroundServer,
    sessions: int,
    turns: int,
    alone: list[list[np.ndarray]],
    voices: list[str],
) -> dict[str, Any]:
    async def together() -> list[list[Turn]]:
        sessions_ = (_session(server.url, i, turns, voices) for i in range(sessions))
        return await asyncio.gather(*sessions_)

    acoustic0 = _acoustic_seconds(server)
    results = asyncio.run(together())
    acoustic_s = _acoustic_seconds(server) - acoustic0
    turns_ = [t for r in results for t in r]
    differing, turns_differing = 0, 0
    for i, session in enumerate(results):
        for t, turn in enumerate(session):
            ref = alone[i][t]
            n = (
                int((turn.pcm != ref).sum())
                if turn.pcm.shape == ref.shape
                else max(turn.pcm.size, ref.size)
            )
            differing += n
            turns_differing += n > 0
    ttfa = [t.ttfa_ms for t in turns_]
    audio_s = sum(t.audio_ms for t in turns_) / 1000
    return {
        "ttfa_ms_p50": statistics.median(ttfa),
        "ttfa_ms_p95": percentile(ttfa, 0.95),
        "rtf": statistics.mean(t.rtf for t in turns_),
        "acoustic_ms_per_audio_s": 1000 * acoustic_s / audio_s,
        "samples": sum(t.pcm.size for t in turns_),
        "differing_samples": differing,
        "differing_turns": turns_differing,
        "turns": len(turns_),
    }


def measure(
    model: SpeechModel, levels: list[int], turns: int, lead_ms: int, repeats: int
) -> dict[str, Any]:
    load_before = os.getloadavg()
    voices = list(model.voices)  # sessions spread over the model's voices
    # Each session's turns alone, one session at a time, unpaced: the reference samples.
    # (Alone, both modes run the same computation: a batch of one chunk.)
    unpaced = ServerConfig(port=free_port(), playout=served_playout(lead_ms=100_000))
    with BackgroundServer(model, unpaced, **served_engine(model)) as server:
        alone = [
            [t.pcm for t in asyncio.run(_session(server.url, i, turns, voices))]
            for i in range(max(levels))
        ]
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        m: {n: [] for n in levels} for m in ACOUSTIC_BATCHING
    }
    for r in range(repeats):
        order: list[AcousticBatching] = list(ACOUSTIC_BATCHING)
        if r % 2:
            order.reverse()
        for mode in order:
            config = ServerConfig(port=free_port(), playout=served_playout(lead_ms=lead_ms))
            engine = served_engine(model, acoustic_batching=mode)
            with BackgroundServer(model, config, **engine) as server:
                asyncio.run(_session(server.url, 0, 1, voices))  # warm-up: first-call allocations
                for n in levels:
                    runs[mode][n].append(_level(server, n, turns, alone, voices))
    report: dict[str, Any] = {
        "model": model.name,
        "repeats": repeats,
        "turns": turns,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "runs": {},
    }
    for mode in ACOUSTIC_BATCHING:
        report["runs"][mode] = [_summary(n, runs[mode][n]) for n in levels]
    return report


def _summary(sessions: int, reps: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str, digits: int) -> float:
        return round(statistics.median(r[key] for r in reps), digits)

    return {
        "sessions": sessions,
        "ttfa_ms_p50": median("ttfa_ms_p50", 1),
        "ttfa_ms_p95": median("ttfa_ms_p95", 1),
        "rtf": median("rtf", 4),
        "acoustic_ms_per_audio_s": median("acoustic_ms_per_audio_s", 1),
        # spread over the repeats, to judge the noise
        "acoustic_ms_per_audio_s_all": [round(r["acoustic_ms_per_audio_s"], 1) for r in reps],
        "ttfa_ms_p50_all": [round(r["ttfa_ms_p50"], 1) for r in reps],
        "turns": sum(r["turns"] for r in reps),
        "samples": sum(r["samples"] for r in reps),
        "differing_samples": sum(r["differing_samples"] for r in reps),
        "differing_turns": sum(r["differing_turns"] for r in reps),
    }


def table(report: dict[str, Any]) -> str:
    cols = (
        "sessions",
        "ttfa_ms_p50",
        "ttfa_ms_p95",
        "rtf",
        "acoustic_ms_per_audio_s",
        "differing_samples",
        "differing_turns",
        "turns",
    )
    widths = [max(10, len(c) + 2) for c in cols]
    lines = [f"{'acoustic':<10}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True))]
    for mode, levels in report["runs"].items():
        for r in levels:
            cells = (f"{r[c]:>{w}}" for c, w in zip(cols, widths, strict=True))
            lines.append(f"{mode:<10}" + "".join(cells))
    lines.append(
        f"median of {report['repeats']} interleaved repeats; load average "
        f"{report['loadavg_before'][0]} before, {report['loadavg_after'][0]} after; "
        "differing: PCM16 samples unlike the same session's turns alone"
    )
    return "\n".join(lines)
