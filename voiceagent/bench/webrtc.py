"""`voiceagent bench --scenario webrtc`: real-time capacity and barge-in latency over WebRTC.

The server runs as its own process (`voiceagent serve`), so its CPU time can be read from
/proc; the clients are aiortc peers in this process, on loopback. At each concurrency
level every client speaks one long turn, listens for `listen_s` seconds of it (counting
underruns: silent frames inside the turn's audio), then talks over it with a synthetic
voiced vowel. Barge-in latency is measured at the client, from the first frame of its
speech to the first frame of silence of the bot's audio. Clients share this machine's
cores with the server, as they would not in production, so the numbers are conservative.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..server.background import free_port
from .clients import MicTrack, open_peer
from .clips import vowel
from .ws import TEXTS, percentile

SILENT_RMS = 1e-3  # decoded Opus of digital silence is (near) zero; the bot's audio is not
CUT_FRAMES = 10  # the bot counts as silenced at the first of this many silent frames


@dataclass
class SessionResult:
    underrun_frames: int  # silent frames inside the turn's audio, before the barge-in
    server_gaps: int  # audio.sync events inside the turn: the server's track ran dry
    bargein_ms: float | None  # None: the turn was not cut off while it was heard


@dataclass(frozen=True)
class Options:
    listen_s: float = 3.0  # audio heard before the client talks over it
    # Frames the client's jitter buffer holds: aiortc's default is 4 (80 ms); a browser
    # on loopback adapts down to about one.
    client_prefetch: int = 1
    max_ahead_ms: int = 5000  # the server's --max-ahead-ms


def cut_time(levels: list[float]) -> int | None:
    """Index of the frame (of those heard from the person's onset on, by RMS) where the
    bot was cut off: the first of `CUT_FRAMES` silent ones after it was heard. The bot
    must be heard after the onset to be cut: a track that had run dry at the onset (a
    busy machine) was not cut by the person, and its barge-in cannot be timed (None)."""
    heard = next((i for i, r in enumerate(levels) if r > SILENT_RMS), len(levels))
    return next(
        (
            i
            for i in range(heard, len(levels) - CUT_FRAMES + 1)
            if all(r <= SILENT_RMS for r in levels[i : i + CUT_FRAMES])
        ),
        None,
    )


async def one_session(base: str, index: int, opts: Options) -> SessionResult:
    mic = MicTrack(vowel(), clip_at=None, onset_level=-1)
    peer = await open_peer(
        base, mic, prefetch=opts.client_prefetch, offer_timeout=30, open_timeout=20
    )
    try:
        peer.send(
            {
                "type": "session.start",
                "sampling": {"seed": index},
                "barge_in": {"mode": "cancel", "guard_ms": 300},
            }
        )
        await peer.event(("session.created",), 20)
        # Two sentences, capped by the server's --max-speech-s: speech outlasts listen_s.
        peer.send({"type": "speak", "text": " ".join(TEXTS[:2])})
        await peer.event(("turn.first_audio",), 60)
        while not any(rms > SILENT_RMS for _, rms, _ in peer.frames):
            await asyncio.sleep(0.01)
        first = next(i for i, (_, rms, _) in enumerate(peer.frames) if rms > SILENT_RMS)
        await asyncio.sleep(opts.listen_s)
        underruns = sum(rms <= SILENT_RMS for _, rms, _ in peer.frames[first:])
        mic.play_now()
        await peer.event(("turn.cancelled",), 10)
        await asyncio.sleep(0.2 + CUT_FRAMES * 0.02)
        onset = mic.onset
        assert onset is not None
        after = [(t, rms) for _, rms, t in peer.frames if t >= onset]
        cut = cut_time([rms for _, rms in after])
        latency = None if cut is None else (after[cut][0] - onset) * 1000
        gaps = sum(e["offset_ms"] > 0 for e in peer.syncs())
        return SessionResult(underruns, gaps, latency)
    finally:
        await peer.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def level(base: str, pid: int, sessions: int, opts: Options) -> dict[str, Any]:
    cpu0, t0 = cpu_seconds(pid), time.monotonic()

    async def staggered(i: int) -> SessionResult:
        await asyncio.sleep(0.05 * i)  # sessions arrive over time, as in life
        return await one_session(base, i, opts)

    results = await asyncio.gather(*(staggered(i) for i in range(sessions)))
    cpu, wall = cpu_seconds(pid) - cpu0, time.monotonic() - t0
    latencies = [r.bargein_ms for r in results if r.bargein_ms is not None]
    underruns = sum(r.underrun_frames for r in results)
    gaps = sum(r.server_gaps for r in results)
    return {
        "sessions": sessions,
        "underrun_frames": underruns,
        "server_gaps": gaps,
        "bargeins": len(latencies),
        "realtime": underruns == 0 and len(latencies) == sessions,
        "bargein_ms_p50": round(statistics.median(latencies), 1) if latencies else None,
        "bargein_ms_p95": round(percentile(latencies, 0.95), 1) if latencies else None,
        "server_cpu_pct_per_session": round(100 * cpu / wall / sessions, 1),
    }


def start_server(
    model: str | None, port: int, max_speech_s: float, max_ahead_ms: int
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "voiceagent.cli", "--log-level", "warning", "serve"]
    cmd += ["--port", str(port), "--max-speech-s", str(max_speech_s)]
    cmd += ["--max-ahead-ms", str(max_ahead_ms)]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not become ready in 180 s")


def measure(
    model: str | None, levels: list[int], opts: Options, max_speech_s: float = 3.0
) -> dict[str, Any]:
    """Ramp through `levels` until one is not real time; report the last one that was."""
    port = free_port()
    proc = start_server(model, port, max_speech_s, opts.max_ahead_ms)
    base = f"http://127.0.0.1:{port}"
    runs: list[dict[str, Any]] = []
    try:
        served = httpx.get(f"{base}/health", timeout=10).json()["model"]  # without --model too
        asyncio.run(level(base, proc.pid, 1, Options(1.0, opts.client_prefetch)))  # warm-up
        for n in levels:
            runs.append(asyncio.run(level(base, proc.pid, n, opts)))
            if not runs[-1]["realtime"]:
                break
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
    ok = [r for r in runs if r["realtime"]]
    best = ok[-1] if ok else runs[0]
    return {
        "model": served,
        "sessions_realtime": best["sessions"] if ok else 0,
        "bargein_ms_p50": best["bargein_ms_p50"],
        "bargein_ms_p95": best["bargein_ms_p95"],
        "server_cpu_pct_per_session": best["server_cpu_pct_per_session"],
        "cores": os.cpu_count(),
        "client_prefetch_frames": opts.client_prefetch,
        "runs": runs,
    }


def table(report: dict[str, Any]) -> str:
    cols = (
        "sessions",
        "realtime",
        "underrun_frames",
        "server_gaps",
        "bargein_ms_p50",
        "bargein_ms_p95",
        "server_cpu_pct_per_session",
    )
    lines = ["".join(f"{c:>28}" for c in cols)]
    lines += ["".join(f"{r[c]!s:>28}" for c in cols) for r in report["runs"]]
    lines.append(
        f"{report['sessions_realtime']} sessions in real time on {report['cores']} cores "
        f"(clients on the same machine); barge-in p50/p95 "
        f"{report['bargein_ms_p50']}/{report['bargein_ms_p95']} ms"
    )
    return "\n".join(lines)
