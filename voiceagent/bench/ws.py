"""`voiceagent bench`: time to first audio and real-time factor over real WebSocket.

For each concurrency level, that many clients connect to a server on loopback and each
speaks `--turns` turns. TTFA is measured at the client (speak sent -> first binary frame
received). RTF is the server's production time over audio time (turn.done timings).
The same run is repeated against a server in the naive baseline mode (all tokens, then
all audio, then send), so both numbers come from one machine at one time.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..engine.embedded import LMBackend
from ..model.speech_model import SpeechModel
from ..server.app import ServerConfig
from ..server.background import BackgroundServer, free_port
from .clients import Client, connect
from .served import served_engine, served_playout

TEXTS = (
    "Thanks for calling. Your order shipped this morning and should arrive on Thursday.",
    "I can help with that. Could you tell me the last four digits of your card?",
    "The meeting moved to three thirty, and the room is on the second floor.",
)


@dataclass
class TurnSample:
    ttfa_ms: float
    rtf: float
    audio_ms: float
    tokens: int


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


async def _client(url: str, index: int, turns: int, voices: list[str]) -> list[TurnSample]:
    samples = []
    async with connect(url) as ws:
        client = Client(ws)
        voice = voices[index % len(voices)]  # sessions spread over the model's voices
        await client.send({"type": "session.start", "voice": voice, "sampling": {"seed": index}})
        await client.event(timeout=None)
        for t in range(turns):
            sent = time.perf_counter()
            await client.send({"type": "speak", "text": TEXTS[(index + t) % len(TEXTS)]})
            result = await client.turn(until=("turn.done", "error"), timeout=None)
            event = result.events[-1]
            if event["type"] == "error":
                raise RuntimeError(f"bench turn failed: {event}")
            assert result.first_frame_at is not None, "turn finished without audio"
            timings = event["timings"]
            samples.append(
                TurnSample(
                    (result.first_frame_at - sent) * 1000,
                    timings["rtf"],
                    timings["audio_ms"],
                    timings["tokens"],
                )
            )
    return samples


async def _level(url: str, sessions: int, turns: int, voices: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(_client(url, i, turns, voices) for i in range(sessions)))
    elapsed = time.perf_counter() - t0
    samples = [s for r in results for s in r]
    ttfa = [s.ttfa_ms for s in samples]
    return {
        "sessions": sessions,
        "turns": len(samples),
        "ttfa_ms_p50": round(statistics.median(ttfa), 1),
        "ttfa_ms_p95": round(percentile(ttfa, 0.95), 1),
        "rtf": round(statistics.mean(s.rtf for s in samples), 4),
        "audio_s_per_turn": round(statistics.mean(s.audio_ms for s in samples) / 1000, 2),
        # all sessions' speech tokens over the level's wall time (paced playout included)
        "tokens_per_s": round(sum(s.tokens for s in samples) / elapsed, 1),
    }


def measure(
    model: SpeechModel,
    levels: list[int],
    turns: int,
    lead_ms: int,
    max_segment_tokens: int | None = None,
    lm_factory: Callable[[], LMBackend] | None = None,
) -> dict[str, Any]:
    """Streaming vs the whole-utterance baseline; with `lm_factory`, also streaming with
    that LM backend (SGLang) as mode `sglang`."""
    gpu = gpu_engine(max(levels)) if model.device.type == "cuda" else {}
    engine = served_engine(model, **gpu)
    shown = _shown({k: v for k, v in engine.items() if k != "warm"})  # (voices: not JSON)
    report: dict[str, Any] = {"model": model.name, "runs": {}, "engine": shown}
    modes = ["streaming", "baseline"] + (["sglang"] if lm_factory else [])
    for mode in modes:
        playout = served_playout(
            lead_ms=lead_ms,
            streaming=mode != "baseline",
            max_segment_tokens=max_segment_tokens,
        )
        config = ServerConfig(port=free_port(), playout=playout)
        lm = lm_factory() if mode == "sglang" and lm_factory else None
        with BackgroundServer(model, config, lm, **engine) as server:
            url = server.url
            voices = list(model.voices)
            asyncio.run(_level(url, 1, 1, voices))  # warm-up: first-call allocations
            report["runs"][mode] = [asyncio.run(_level(url, n, turns, voices)) for n in levels]
        # The headline: the highest concurrency level measured.
        report[mode] = report["runs"][mode][-1]
    s, b = report["streaming"], report["baseline"]
    report["ttfa_p50_speedup"] = round(b["ttfa_ms_p50"] / max(s["ttfa_ms_p50"], 1e-6), 1)
    return report


def gpu_engine(sessions: int) -> dict[str, Any]:
    """The engine a GPU serves `sessions` with: bfloat16 LM and flow, the LM's decode
    steps as CUDA graphs, a KV slot per session, the sessions' chunks batched."""
    return {
        "lm_dtype": torch.bfloat16,
        "lm_graphs": True,
        "flow_precision": "bfloat16",
        "max_batch": max(16, sessions),
        "acoustic_batching": "batched",
        "first_audio_first": True,
    }


def _shown(options: dict[str, Any]) -> dict[str, Any]:
    """`options` as JSON: dtypes by name."""
    return {
        k: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
        for k, v in options.items()
    }


def table(report: dict[str, Any]) -> str:
    cols = ("sessions", "turns", "ttfa_ms_p50", "ttfa_ms_p95", "rtf", "tokens_per_s")
    lines = [f"{'mode':<10}" + "".join(f"{c:>18}" for c in cols)]
    for mode, runs in report["runs"].items():
        for r in runs:
            lines.append(f"{mode:<10}" + "".join(f"{r[c]:>18}" for c in cols))
    lines.append(
        f"streaming TTFA p50 is {report['ttfa_p50_speedup']}x lower than the baseline "
        f"at {report['streaming']['sessions']} sessions"
    )
    return "\n".join(lines)
