"""`voiceagent bench`: time to first audio and real-time factor over real WebSocket.

For each concurrency level, that many clients connect to a server on loopback and each
speaks `--turns` turns. TTFA is measured at the client (speak sent -> first binary frame
received). RTF is the server's production time over audio time (turn.done timings).
The same run is repeated against a server in the naive baseline mode (all tokens, then
all audio, then send), so both numbers come from one machine at one time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import websockets

from .engine.embedded import LMBackend
from .engine.sglang.client import SGLangLM
from .model.speech_model import SpeechModel
from .server.app import ServerConfig
from .server.background import BackgroundServer, free_port
from .server.runner import PlayoutConfig

TEXTS = (
    "Thanks for calling. Your order shipped this morning and should arrive on Thursday.",
    "I can help with that. Could you tell me the last four digits of your card?",
    "The meeting moved to three thirty, and the room is on the second floor.",
)
VOICES = ("agent", "narrator", "supervisor")


@dataclass
class TurnSample:
    ttfa_ms: float
    rtf: float
    audio_ms: float
    tokens: int


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


async def _client(url: str, index: int, turns: int) -> list[TurnSample]:
    samples = []
    async with websockets.connect(url, max_size=None) as ws:
        voice = VOICES[index % len(VOICES)]
        await ws.send(
            json.dumps({"type": "session.start", "voice": voice, "sampling": {"seed": index}})
        )
        json.loads(await ws.recv())
        for t in range(turns):
            sent = time.perf_counter()
            await ws.send(json.dumps({"type": "speak", "text": TEXTS[(index + t) % len(TEXTS)]}))
            first: float | None = None
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    first = first or time.perf_counter()
                    continue
                event = json.loads(msg)
                if event["type"] == "turn.done":
                    assert first is not None, "turn finished without audio"
                    timings = event["timings"]
                    samples.append(
                        TurnSample(
                            (first - sent) * 1000,
                            timings["rtf"],
                            timings["audio_ms"],
                            timings["tokens"],
                        )
                    )
                    break
                if event["type"] == "error":
                    raise RuntimeError(f"bench turn failed: {event}")
    return samples


async def _level(url: str, sessions: int, turns: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(_client(url, i, turns) for i in range(sessions)))
    elapsed = time.perf_counter() - t0
    samples = [s for r in results for s in r]
    ttfa = [s.ttfa_ms for s in samples]
    return {
        "sessions": sessions,
        "turns": len(samples),
        "ttfa_ms_p50": round(statistics.median(ttfa), 1),
        "ttfa_ms_p95": round(_percentile(ttfa, 0.95), 1),
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
    report: dict[str, Any] = {"model": model.name, "runs": {}}
    modes = ["streaming", "baseline"] + (["sglang"] if lm_factory else [])
    for mode in modes:
        playout = PlayoutConfig(
            lead_ms=lead_ms,
            streaming=mode != "baseline",
            max_segment_tokens=max_segment_tokens,
        )
        config = ServerConfig(port=free_port(), playout=playout)
        lm = lm_factory() if mode == "sglang" and lm_factory else None
        with BackgroundServer(model, config, lm) as server:
            url = server.url
            asyncio.run(_level(url, 1, 1))  # warm-up: first-call allocations
            report["runs"][mode] = [asyncio.run(_level(url, n, turns)) for n in levels]
        # The headline: the highest concurrency level measured.
        report[mode] = report["runs"][mode][-1]
    s, b = report["streaming"], report["baseline"]
    report["ttfa_p50_speedup"] = round(b["ttfa_ms_p50"] / max(s["ttfa_ms_p50"], 1e-6), 1)
    return report


def _table(report: dict[str, Any]) -> str:
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


def run_bench(args: argparse.Namespace) -> int:
    from .cli import load_model

    for name in ("voiceagent", "aioice", "aiortc", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if args.scenario == "chunk-cost":
        from . import bench_chunks

        model = load_model(args.model or str(bench_chunks.ensure_full_random()), args.device)
        report = bench_chunks.measure(model, repeats=args.repeats)
        text = "\n".join(
            f"{mode:<10} chunk 1: {report[mode]['chunk1_ms']:>9} ms   chunk 20: "
            f"{report[mode]['chunk20_ms']:>9} ms   ratio {report[mode]['ratio']}"
            for mode in ("linear", "recompute")
        )
    elif args.scenario == "cutoff":
        from . import bench_cutoff

        model = load_model(args.model, args.device)
        report = bench_cutoff.measure(model, max_ahead_ms=args.max_ahead_ms)
        text = bench_cutoff.table(report)
    elif args.scenario == "webrtc":
        from . import bench_webrtc

        levels = [int(x) for x in (args.sessions or "1,2,4,8,12,16").split(",")]
        opts = bench_webrtc.Options(
            client_prefetch=args.client_prefetch, max_ahead_ms=args.max_ahead_ms
        )
        report = bench_webrtc.measure(args.model, levels, opts, args.max_speech_s or 3.0)
        text = bench_webrtc.table(report)
    else:
        model = load_model(args.model, args.device)
        levels = [int(x) for x in (args.sessions or "1,8").split(",")]
        factory = None
        if args.sglang_url:
            url, export = args.sglang_url, Path(args.sglang_export)

            def factory() -> SGLangLM:
                return SGLangLM(model, url, export)

        report = measure(
            model, levels, args.turns, args.lead_ms, int((args.max_speech_s or 60.0) * 25), factory
        )
        text = _table(report)
    print(json.dumps(report) if args.json else text)
    sys.stdout.flush()
    return 0
