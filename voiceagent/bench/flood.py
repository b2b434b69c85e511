"""`voiceagent bench --scenario flood`: does one greedy client hold up everyone else?

The server and the flooders run as processes of their own (so that neither the flood
nor the server delays the victim's clock). A victim session speaks the same turns twice
in the same run: once with nobody else connected, once while flooders send small
messages (pings and broken JSON) as fast as they can without reading anything,
reconnecting whenever the server closes them. For each phase: the victim's time to first audio,
its frames that arrived later than real time (on the client's clock: frame k is due
k x 20 ms after the first), and how long /healthz takes to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import websockets

from ..server.background import free_port
from .clients import Client, connect
from .webrtc import start_server
from .ws import TEXTS, percentile

FLOOD = ['{"type": "ping"}', '{"type": "speak", "text": ', "{not json"]


@dataclass
class Phase:
    ttfa_ms: list[float] = field(default_factory=list)
    frames: int = 0
    late_frames: int = 0
    max_late_ms: float = 0.0
    health_ms: list[float] = field(default_factory=list)
    flood_messages: int = 0

    def report(self) -> dict[str, Any]:
        return {
            "ttfa_ms_p50": round(percentile(self.ttfa_ms, 0.5), 1),
            "ttfa_ms_max": round(max(self.ttfa_ms), 1),
            "frames": self.frames,
            "late_frames": self.late_frames,
            "max_late_ms": round(self.max_late_ms, 1),
            "health_ms_p50": round(percentile(self.health_ms, 0.5), 1),
            "health_ms_max": round(max(self.health_ms), 1),
            "flood_messages": self.flood_messages,
        }


async def victim(url: str, turns: int, phase: Phase) -> None:
    async with connect(url) as ws:
        c = Client(ws)
        await c.start(format={"codec": "pcm16"})
        for i in range(turns):
            sent = time.perf_counter()
            await c.send({"type": "speak", "text": TEXTS[i % len(TEXTS)]})
            arrivals = []
            while True:
                message = await asyncio.wait_for(ws.recv(), 60)
                if isinstance(message, bytes):
                    arrivals.append(time.perf_counter())
                elif '"turn.done"' in message or '"error"' in message:
                    break
            phase.ttfa_ms.append((arrivals[0] - sent) * 1000)
            phase.frames += len(arrivals)
            for k, t in enumerate(arrivals):
                late = (t - arrivals[0] - k * 0.02) * 1000
                if late > 0:
                    phase.late_frames += 1
                    phase.max_late_ms = max(phase.max_late_ms, late)


async def flooder(url: str, stop: asyncio.Event, sent: list[int]) -> None:
    """Send without reading; when the server closes the connection, connect again."""
    while not stop.is_set():
        with contextlib.suppress(websockets.ConnectionClosed, OSError):
            async with websockets.connect(url, max_queue=1) as ws:
                while not stop.is_set():
                    for text in FLOOD * 50:
                        await ws.send(text)
                    sent[0] += 150
                    await asyncio.sleep(0)  # the other flooders' turn
        await asyncio.sleep(0.05)


async def flood_until_stopped(url: str, connections: int) -> int:
    """Run `connections` flooders until SIGTERM; the messages sent."""
    stop, sent = asyncio.Event(), [0]
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("flooding", flush=True)  # the parent waits for this line before it measures
    tasks = [asyncio.create_task(flooder(url, stop, sent)) for _ in range(connections)]
    await stop.wait()
    for task in tasks:  # a flooder may be blocked in a send the server does not read
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return sent[0]


async def health(base: str, stop: asyncio.Event, phase: Phase) -> None:
    async with httpx.AsyncClient() as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            await http.get(f"{base}/healthz", timeout=30)
            phase.health_ms.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.2)


async def run_phase(base: str, url: str, turns: int, flooders: int) -> Phase:
    phase = Phase()
    stop = asyncio.Event()
    pinger = asyncio.create_task(health(base, stop, phase))
    flood = None
    if flooders:
        code = "import asyncio, sys; from voiceagent.bench.flood import flood_until_stopped; "
        code += "print(asyncio.run(flood_until_stopped(sys.argv[1], int(sys.argv[2]))))"
        cmd = [sys.executable, "-c", code, url, str(flooders)]
        flood = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert flood.stdout is not None
        started = await asyncio.wait_for(asyncio.to_thread(flood.stdout.readline), 120)
        assert started.strip() == "flooding", started
        await asyncio.sleep(1.0)  # the flood is on before the victim speaks
    try:
        await victim(url, turns, phase)
    finally:
        stop.set()
        await pinger
        if flood is not None:
            flood.terminate()
            try:
                out, _ = flood.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                flood.kill()
                out, _ = flood.communicate()
            phase.flood_messages = int(out.strip() or 0)
    return phase


def measure(model: str | None, turns: int = 5, flooders: int = 4) -> dict[str, Any]:
    port = free_port()
    proc = start_server(model, port, max_speech_s=3.0, max_ahead_ms=5000)
    base, url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/v1/ws"
    try:
        quiet = asyncio.run(run_phase(base, url, turns, 0))
        flood = asyncio.run(run_phase(base, url, turns, flooders))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"turns": turns, "flooders": flooders, "quiet": quiet.report(), "flood": flood.report()}


def table(report: dict[str, Any]) -> str:
    keys = list(report["quiet"])
    lines = [f"{'':<16}{'quiet':>12}{'flood':>12}"]
    for key in keys:
        lines.append(f"{key:<16}{report['quiet'][key]:>12}{report['flood'][key]:>12}")
    lines.append(f"({report['turns']} turns per phase, {report['flooders']} flooding connections)")
    return "\n".join(lines)
