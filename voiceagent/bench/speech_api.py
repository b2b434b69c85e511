"""--scenario openai: the OpenAI-compatible `POST /v1/audio/speech`, as a client sees it.

For each response format, over several requests: time to the first byte of audio (what a
streaming client waits before it can play) next to the time to the whole file (what a
client that waits for the file, e.g. `.content`, waits), in the same run on the same
server; then the same with several requests at once. Client clock, loopback.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from ..model.checkpoint import SpeechModel
from ..server.app import ServerConfig
from ..server.background import BackgroundServer, free_port
from .served import served_engine, served_playout

TEXT = (
    "Thanks for calling. Your order shipped this morning and should arrive on Thursday. "
    "Is there anything else I can help you with today?"
)
FORMATS = ("pcm", "mp3", "opus", "aac", "flac", "wav")


async def _one(http: httpx.AsyncClient, url: str, voice: str, fmt: str) -> dict[str, float]:
    body = {"model": "tts-1", "input": TEXT, "voice": voice, "response_format": fmt}
    t0 = time.perf_counter()
    first = None
    size = 0
    async with http.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for chunk in response.aiter_bytes():
            if chunk and first is None:
                first = time.perf_counter()
            size += len(chunk)
    end = time.perf_counter()
    assert first is not None, "no audio"
    return {"ttfb_ms": (first - t0) * 1000, "whole_ms": (end - t0) * 1000, "bytes": size}


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def _row(runs: list[dict[str, float]]) -> dict[str, Any]:
    ttfb = [r["ttfb_ms"] for r in runs]
    whole = [r["whole_ms"] for r in runs]
    return {
        "requests": len(runs),
        "ttfb_ms_p50": round(statistics.median(ttfb), 1),
        "ttfb_ms_p95": _p(ttfb, 0.95),
        "whole_file_ms_p50": round(statistics.median(whole), 1),
        "whole_file_ms_p95": _p(whole, 0.95),
        "bytes": int(statistics.median(r["bytes"] for r in runs)),
    }


def measure(model: SpeechModel, turns: int = 5, concurrent: int = 4) -> dict[str, Any]:
    config = ServerConfig(port=free_port(), playout=served_playout())
    voice = next(iter(model.voices))
    with BackgroundServer(model, config, **served_engine(model)) as server:
        url = f"{server.http}/v1/audio/speech"

        async def go() -> dict[str, Any]:
            async with httpx.AsyncClient(timeout=120) as http:
                await _one(http, url, voice, "pcm")  # warm up
                formats = {}
                for fmt in FORMATS:
                    formats[fmt] = _row([await _one(http, url, voice, fmt) for _ in range(turns)])
                together: list[dict[str, float]] = []
                for _ in range(turns):  # `concurrent` mp3 requests at once, `turns` times
                    batch = (_one(http, url, voice, "mp3") for _ in range(concurrent))
                    together += await asyncio.gather(*batch)
                return {
                    "formats": formats,
                    "concurrent": {"requests_at_once": concurrent, **_row(together)},
                }

        report = asyncio.run(go())
    every = report["formats"].values()
    report["streaming"] = {
        "ttfb_ms_p50": round(statistics.median(r["ttfb_ms_p50"] for r in every), 1)
    }
    report["whole_file"] = {
        "ms_p50": round(statistics.median(r["whole_file_ms_p50"] for r in every), 1)
    }
    report["model"] = model.name
    return report


def table(report: dict[str, Any]) -> str:
    lines = [
        f"POST /v1/audio/speech ({report['model']}), client clock, loopback",
        f"{'format':<8}{'first byte p50':>16}{'p95':>8}{'whole file p50':>16}{'p95':>8}"
        f"{'bytes':>9}",
    ]
    rows = [
        *report["formats"].items(),
        (f"mp3 x{report['concurrent']['requests_at_once']}", report["concurrent"]),
    ]
    for name, r in rows:
        lines.append(
            f"{name:<8}{r['ttfb_ms_p50']:>13} ms{r['ttfb_ms_p95']:>8}"
            f"{r['whole_file_ms_p50']:>13} ms{r['whole_file_ms_p95']:>8}{r['bytes']:>9}"
        )
    return "\n".join(lines)
