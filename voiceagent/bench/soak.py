"""`voiceagent bench --scenario soak`: does the server's memory, fds, threads or tasks grow?

The server runs as its own process (`voiceagent serve`, as in the WebRTC scenario), so
what /metrics reports is the server's alone. After a short warm-up (a few cycles of each
kind and one mixed-load round: imports, model caches and allocator arenas grow once),
the bench runs two phases while a sampler reads /metrics every `interval_s` seconds
(`process_resident_memory_bytes`, `process_open_fds`, `voiceagent_threads`,
`voiceagent_asyncio_tasks`, `voiceagent_sessions_active`):

- cycles: `cycles` WebSocket sessions opened and closed, `concurrency` at a time, of
  five kinds in rotation (`CYCLE_KINDS`): open and close, start a session, speak a short
  turn to its end, cancel a turn mid-way, disconnect mid-turn;
- mixed: for `minutes`, `sessions` WebSocket sessions at once that speak turns and let
  them finish, cancel them, or talk over them with microphone audio (PCM16 upstream, a
  synthetic vowel the VAD takes for speech; barge-in mode `cancel`), each session
  closing after a few turns and a new one opening; plus `webrtc_sessions` aiortc peers
  that start a turn and talk over it, again and again.

Flatness is judged per phase after its warm-up: the median of the last third of the
phase's samples against the median of its middle third. Fds, threads and tasks are
also compared idle to idle: before the phases and after both, once every session has
closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ..server.background import free_port
from .clients import Client, MicTrack, connect, open_peer
from .clips import vowel
from .webrtc import start_server

CYCLE_KINDS = ("open_close", "start", "speak", "cancel", "disconnect")
SHORT_TEXT = "Hello there."
LONG_TEXT = "Here is a longer answer, with a few clauses. It goes on for a while."
METRICS = {  # CSV column -> metric family in /metrics
    "rss_mb": "process_resident_memory_bytes",
    "fds": "process_open_fds",
    "threads": "voiceagent_threads",
    "tasks": "voiceagent_asyncio_tasks",
    "sessions": "voiceagent_sessions_active",
}
COLUMNS = ("t_s", "phase", "cycles_done", "turns_done", *METRICS)


@dataclass(frozen=True)
class Options:
    cycles: int = 10_000
    minutes: float = 30.0
    sessions: int = 4  # WebSocket sessions at once in the mixed load
    webrtc_sessions: int = 1  # WebRTC peers at once in the mixed load
    concurrency: int = 8  # cycles in flight at once
    interval_s: float = 2.0  # sampling period
    turns_per_session: int = 6  # mixed load: turns before a session closes and reopens
    max_speech_s: float = 1.5  # the server's --max-speech-s (random LMs rarely stop)
    max_ahead_ms: int = 5000


@dataclass
class Progress:
    phase: str = "warmup"
    cycles: int = 0
    turns: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    first_errors: list[str] = field(default_factory=list)

    def error(self, where: str, exc: BaseException) -> None:
        key = f"{where}: {type(exc).__name__}"
        self.errors[key] = self.errors.get(key, 0) + 1
        if len(self.first_errors) < 5:
            self.first_errors.append(f"{key}: {exc}"[:300])


def parse_metrics(text: str) -> dict[str, float]:
    """Column -> value of the sampled families (a labelled gauge: summed over labels)."""
    values: dict[str, float] = {}
    for column, name in METRICS.items():
        found = re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, flags=re.MULTILINE)
        if found:
            values[column] = sum(float(v) for v in found)
    if "rss_mb" in values:
        values["rss_mb"] /= 2**20
    return values


# -- the clients ------------------------------------------------------------------------


async def until_first_frame(ws: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not isinstance(await asyncio.wait_for(ws.recv(), deadline - time.monotonic()), bytes):
        pass


async def cycle(url: str, index: int) -> None:
    """One session of kind CYCLE_KINDS[index % 5], opened and closed."""
    kind = CYCLE_KINDS[index % len(CYCLE_KINDS)]
    async with connect(url) as ws:
        if kind == "open_close":
            return
        c = Client(ws)
        await c.start(sampling={"seed": index})
        if kind == "speak":
            result = await c.speak(SHORT_TEXT)
            result.event("turn.done")
        elif kind in ("cancel", "disconnect"):
            await c.send({"type": "speak", "text": LONG_TEXT, "turn_id": "t"})
            await until_first_frame(ws)
            if kind == "cancel":
                await c.send({"type": "cancel", "turn_id": "t"})
                result = await c.turn(until=("turn.cancelled", "turn.done"), timeout=30)
            # disconnect: leaving the block closes the socket while the turn plays


async def run_cycles(url: str, count: int, concurrency: int, progress: Progress) -> None:
    queue = iter(range(count))

    async def worker() -> None:
        for i in queue:
            try:
                await asyncio.wait_for(cycle(url, i), 60)
            except Exception as exc:  # counted, and the soak goes on
                progress.error(f"cycle {CYCLE_KINDS[i % len(CYCLE_KINDS)]}", exc)
            progress.cycles += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def ws_user(url: str, index: int, deadline: float, opts: Options, p: Progress) -> None:
    """A WebSocket user until `deadline`: turns that finish, are cancelled, or are talked
    over; a new session every `turns_per_session` turns."""
    silence = bytes(16000 // 50 * 2 * 10)  # 200 ms of PCM16 at 16 kHz
    mic = silence + (np.clip(vowel(1.0, 16000), -1, 1) * 32767).astype("<i2").tobytes()
    turn = index
    step = "connect"  # what the user waited for last: named in an error
    while time.monotonic() < deadline:
        try:
            step = "connect"
            async with connect(url) as ws:
                c = Client(ws)
                await c.start(
                    sampling={"seed": index},
                    format={"codec": "pcm16"},
                    input={"sample_rate": 16000},
                    barge_in={"mode": "cancel", "guard_ms": 300},
                )
                for _ in range(opts.turns_per_session):
                    if time.monotonic() >= deadline:
                        break
                    turn += 1
                    how = turn % 3
                    until = ("turn.done", "turn.cancelled")
                    await c.send({"type": "speak", "text": LONG_TEXT, "turn_id": f"t{turn}"})
                    if how:
                        step = "first frame"
                        await until_first_frame(ws)
                        await asyncio.sleep(0.4)  # the listener has heard past the guard
                    if how == 1:
                        await c.send({"type": "cancel", "turn_id": f"t{turn}"})
                    elif how == 2:  # talk over the bot: 20 ms messages, sent at once
                        for i in range(0, len(mic), 640):
                            await ws.send(mic[i : i + 640])
                    step = ("turn.done", "turn.done after cancel", "turn.done after barge-in")[how]
                    await c.turn(until=until, timeout=30)
                    p.turns += 1
                    await asyncio.sleep(0.2)
        except Exception as exc:
            p.error(f"mixed websocket ({step})", exc)
            await asyncio.sleep(1)


async def webrtc_user(base: str, index: int, deadline: float, p: Progress) -> None:
    """A WebRTC user until `deadline`: a peer per turn, talked over after 1 s of audio."""
    while time.monotonic() < deadline:
        mic = MicTrack(vowel(), clip_at=None, onset_level=-1)
        try:
            peer = await open_peer(base, mic, offer_timeout=30, open_timeout=20)
        except Exception as exc:
            p.error("mixed webrtc open", exc)
            await asyncio.sleep(1)
            continue
        step = "session.start"
        try:
            peer.send(
                {
                    "type": "session.start",
                    "sampling": {"seed": index},
                    "barge_in": {"mode": "cancel", "guard_ms": 300},
                }
            )
            step = "session.created"
            await peer.event(("session.created",), 20)
            peer.send({"type": "speak", "text": LONG_TEXT})
            step = "turn.first_audio"
            await peer.event(("turn.first_audio",), 30)
            await asyncio.sleep(1.0)
            mic.play_now()
            step = "turn end after barge-in"
            await peer.event(("turn.cancelled", "turn.done"), 15)
            p.turns += 1
        except Exception as exc:
            p.error(f"mixed webrtc ({step})", exc)
        finally:
            await peer.close()
        await asyncio.sleep(0.3)


async def mixed(base: str, url: str, seconds: float, opts: Options, p: Progress) -> None:
    deadline = time.monotonic() + seconds
    users = [ws_user(url, i, deadline, opts, p) for i in range(opts.sessions)]
    users += [webrtc_user(base, i, deadline, p) for i in range(opts.webrtc_sessions)]
    await asyncio.gather(*users)


# -- sampling ---------------------------------------------------------------------------


async def sample(http: httpx.AsyncClient, base: str, t0: float, p: Progress) -> dict[str, Any]:
    response = await http.get(base + "/metrics", timeout=30)
    row: dict[str, Any] = {
        "t_s": round(time.monotonic() - t0, 1),
        "phase": p.phase,
        "cycles_done": p.cycles,
        "turns_done": p.turns,
    }
    row.update({k: round(v, 2) for k, v in parse_metrics(response.text).items()})
    return row


async def sampler(
    http: httpx.AsyncClient,
    base: str,
    t0: float,
    p: Progress,
    rows: list[dict[str, Any]],
    every: float,
) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError):
            rows.append(await sample(http, base, t0, p))
        await asyncio.sleep(every)


async def idle(http: httpx.AsyncClient, base: str, t0: float, p: Progress) -> dict[str, Any]:
    """A sample once every session has closed and the server has settled (at most 20 s):
    two in a row with no session and the same tasks, threads and fds."""
    previous: dict[str, Any] | None = None
    deadline = time.monotonic() + 20
    while True:
        await asyncio.sleep(1.0)
        row = await sample(http, base, t0, p)
        keys = ("tasks", "threads", "fds")
        settled = previous is not None and all(row.get(k) == previous.get(k) for k in keys)
        if (row.get("sessions") == 0 and settled) or time.monotonic() > deadline:
            return row
        previous = row


# -- judging ----------------------------------------------------------------------------


def growth_after_warmup(values: list[float]) -> float | None:
    """Median of the last third minus median of the middle third (None: too few)."""
    if len(values) < 6:
        return None
    third = len(values) // 3
    return statistics.median(values[-third:]) - statistics.median(values[third : 2 * third])


def phase_summary(rows: list[dict[str, Any]], phase: str) -> dict[str, Any]:
    mine = [r for r in rows if r["phase"] == phase and "rss_mb" in r]
    out: dict[str, Any] = {"samples": len(mine)}
    for column in ("rss_mb", "fds", "threads", "tasks"):
        values = [float(r[column]) for r in mine if column in r]
        g = growth_after_warmup(values)
        out[f"{column}_growth_after_warmup"] = None if g is None else round(g, 1)
        out[f"{column}_max"] = max(values) if values else None
    if phase == "cycles" and len(mine) >= 6:
        third = len(mine) // 3
        mid, last = mine[third : 2 * third], mine[-third:]
        done = statistics.median(r["cycles_done"] for r in last) - statistics.median(
            r["cycles_done"] for r in mid
        )
        g = out["rss_mb_growth_after_warmup"]
        out["rss_kb_per_cycle_after_warmup"] = round(g * 1024 / done, 3) if done > 0 else None
    return out


def write_outputs(rows: list[dict[str, Any]], marks: dict[str, float], out: Path) -> None:
    with open(out / "samples.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, marks, out / "soak.png")


def plot(rows: list[dict[str, Any]], marks: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("rss_mb", "RSS (MiB)"),
        ("fds", "open fds"),
        ("threads", "threads"),
        ("tasks", "asyncio tasks"),
    )
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 9), sharex=True)
    for ax, (column, label) in zip(axes, panels, strict=True):
        points = [(r["t_s"] / 60, r[column]) for r in rows if column in r]
        ax.plot([x for x, _ in points], [y for _, y in points], lw=1)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for name, t in marks.items():
            ax.axvline(t / 60, color="grey", ls="--", lw=0.8)
            if ax is axes[0]:
                ax.annotate(name, (t / 60, 1.0), xycoords=("data", "axes fraction"), va="top")
    axes[0].set_ylim(bottom=0)
    axes[-1].set_xlabel("minutes")
    fig.suptitle("voiceagent soak: server process, sampled from /metrics")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- the bench --------------------------------------------------------------------------


async def soak(base: str, opts: Options, out: Path) -> dict[str, Any]:
    url = base.replace("http://", "ws://") + "/v1/ws"
    p = Progress()
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    load0 = os.getloadavg()
    async with httpx.AsyncClient() as http:
        # warm-up: every kind of cycle, and one short round of the mixed load
        await run_cycles(url, 4 * len(CYCLE_KINDS), min(4, opts.concurrency), p)
        await mixed(base, url, 8.0, opts, p)
        warm_errors = dict(p.errors)
        p.errors.clear()
        p.cycles = p.turns = 0
        start = await idle(http, base, t0, p)
        rows.append(start)
        task = asyncio.get_running_loop().create_task(
            sampler(http, base, t0, p, rows, opts.interval_s)
        )
        marks = {"cycles": time.monotonic() - t0}
        p.phase = "cycles"
        await run_cycles(url, opts.cycles, opts.concurrency, p)
        p.phase = "mixed"
        marks["mixed"] = time.monotonic() - t0
        await mixed(base, url, opts.minutes * 60, opts, p)
        p.phase = "idle"
        marks["idle"] = time.monotonic() - t0
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        end = await idle(http, base, t0, p)
        rows.append(end)
    write_outputs(rows, marks, out)
    rss = [float(r["rss_mb"]) for r in rows if "rss_mb" in r]
    phases = {name: phase_summary(rows, name) for name in ("cycles", "mixed")}
    growths = [s["rss_mb_growth_after_warmup"] for s in phases.values()]
    known = [g for g in growths if g is not None]
    return {
        "cycles": p.cycles,
        "minutes": opts.minutes,
        "mixed_sessions": {"websocket": opts.sessions, "webrtc": opts.webrtc_sessions},
        "turns": p.turns,
        "rss_mb_start": start.get("rss_mb"),
        "rss_mb_end": end.get("rss_mb"),
        "rss_mb_max": max(rss) if rss else None,
        "rss_growth_mb_after_warmup": max(known) if known else None,
        "rss_kb_per_cycle_after_warmup": phases["cycles"].get("rss_kb_per_cycle_after_warmup"),
        "fds_start": start.get("fds"),
        "fds_end": end.get("fds"),
        "threads_start": start.get("threads"),
        "threads_end": end.get("threads"),
        "tasks_start": start.get("tasks"),
        "tasks_end": end.get("tasks"),
        "sessions_end": end.get("sessions"),
        "errors": sum(p.errors.values()),
        "error_kinds": p.errors,
        "first_errors": p.first_errors,
        "warmup_errors": sum(warm_errors.values()),
        "phases": phases,
        "samples": len(rows),
        "wall_s": round(time.monotonic() - t0, 1),
        "cores": os.cpu_count(),
        "load_avg_start": round(load0[0], 2),
        "load_avg_end": round(os.getloadavg()[0], 2),
        "out": str(out),
        "options": asdict(opts),
    }


def measure(model: str | None, opts: Options, out: Path | None = None) -> dict[str, Any]:
    out = Path(out) if out else Path(tempfile.mkdtemp(prefix="voiceagent-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = start_server(model, port, opts.max_speech_s, opts.max_ahead_ms)
    try:
        report = asyncio.run(soak(f"http://127.0.0.1:{port}", opts, out))
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
    report["model"] = model or "default"  # serve without --model
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def table(report: dict[str, Any]) -> str:
    r = report
    lines = [
        f"{r['cycles']} cycles, {r['minutes']} min mixed load ({r['turns']} turns), "
        f"{r['wall_s']} s on {r['cores']} cores (load {r['load_avg_start']} -> "
        f"{r['load_avg_end']}), {r['errors']} errors",
        f"RSS MB: start {r['rss_mb_start']}, end {r['rss_mb_end']}, max {r['rss_mb_max']}, "
        f"growth after warm-up {r['rss_growth_mb_after_warmup']} "
        f"({r['rss_kb_per_cycle_after_warmup']} kB per cycle)",
        f"fds {r['fds_start']} -> {r['fds_end']}, threads {r['threads_start']} -> "
        f"{r['threads_end']}, asyncio tasks {r['tasks_start']} -> {r['tasks_end']}",
        f"samples.csv, soak.png and summary.json in {r['out']}",
    ]
    return "\n".join(lines)
