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
import fractions
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from .bench import TEXTS, _percentile
from .server.background import free_port
from .transport.webrtc import FRAME_SAMPLES, RATE, mono_float, set_audio_prefetch

SILENT_RMS = 1e-3  # decoded Opus of digital silence is (near) zero; the bot's audio is not
CUT_FRAMES = 10  # the bot counts as silenced at the first of this many silent frames


def vowel(seconds: float = 1.5, rate: int = RATE) -> np.ndarray:
    """A voiced, speech-like sound (120 Hz with three formants, syllable-rate loudness)
    that webrtcvad takes for speech; no recording or TTS needed."""
    t = np.arange(int(rate * seconds)) / rate
    phase = 2 * np.pi * np.cumsum(120 + 10 * np.sin(2 * np.pi * 3 * t)) / rate
    sig = np.zeros_like(t)
    for k in range(1, 30):
        env = sum(
            np.exp(-((((120 * k) - f) / bw) ** 2))
            for f, bw in ((700, 130), (1200, 150), (2600, 250))
        )
        sig += env * np.sin(k * phase)
    sig *= 0.3 / np.abs(sig).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    return sig.astype(np.float32)


class MicTrack(MediaStreamTrack):
    """The client's microphone: silence, then the vowel once when `speak()` is called;
    20 ms frames paced in real time. `onset` is when its first speech frame went out."""

    kind = "audio"

    def __init__(self, clip: np.ndarray) -> None:
        super().__init__()
        self.clip = (np.clip(clip, -1, 1) * 32767).astype("<i2")
        self.index = 0
        self.start: float | None = None
        self.clip_at: int | None = None
        self.onset: float | None = None

    def speak(self) -> None:
        self.clip_at = self.index

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        self.start = self.start or now
        delay = self.start + self.index * 0.02 - now
        if delay > 0:
            await asyncio.sleep(delay)
        k = -1 if self.clip_at is None else self.index - self.clip_at
        chunk = self.clip[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES] if k >= 0 else None
        if k == 0:
            self.onset = time.monotonic()
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        data = b"" if chunk is None else chunk.tobytes()
        frame.planes[0].update(data.ljust(FRAME_SAMPLES * 2, b"\0"))
        frame.pts = self.index * FRAME_SAMPLES
        frame.sample_rate = RATE
        frame.time_base = fractions.Fraction(1, RATE)
        self.index += 1
        return frame


@dataclass
class Client:
    pc: RTCPeerConnection
    channel: RTCDataChannel
    mic: MicTrack
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    heard: list[tuple[float, float]] = field(default_factory=list)  # (arrival, rms)
    syncs: list[dict[str, Any]] = field(default_factory=list)  # audio.sync events
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def event(self, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = await asyncio.wait_for(self.events.get(), deadline - time.monotonic())
            if event["type"] == "error":
                raise RuntimeError(f"server error: {event}")
            if event["type"] == kind:
                return event


async def connect(base: str, mic: MicTrack, prefetch: int) -> Client:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    client = Client(pc, pc.createDataChannel("control"), mic)

    @client.channel.on("message")
    def on_message(message: str) -> None:
        event = json.loads(message)
        if event["type"] == "audio.sync":
            client.syncs.append(event)
        client.events.put_nowait(event)

    pc.addTransceiver(mic, direction="sendrecv")

    async def listen(track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                x = mono_float(frame)
                client.heard.append((time.monotonic(), float(np.sqrt(np.mean(x**2)))))

    pc.on("track", lambda t: client.tasks.append(asyncio.get_running_loop().create_task(listen(t))))
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient() as http:
        r = await http.post(
            base + "/v1/webrtc/offer",
            json={"sdp": pc.localDescription.sdp, "type": "offer"},
            timeout=30,
        )
    r.raise_for_status()
    await pc.setRemoteDescription(RTCSessionDescription(r.json()["sdp"], "answer"))
    set_audio_prefetch(pc, prefetch)
    deadline = time.monotonic() + 20
    while client.channel.readyState != "open":
        if time.monotonic() > deadline:
            raise RuntimeError("data channel did not open")
        await asyncio.sleep(0.01)
    return client


@dataclass
class SessionResult:
    underrun_frames: int  # silent frames inside the turn's audio, before the barge-in
    server_gaps: int  # audio.sync events inside the turn: the server's track ran dry
    bargein_ms: float | None  # None: the turn was not cut off


@dataclass(frozen=True)
class Options:
    listen_s: float = 3.0  # audio heard before the client talks over it
    # Frames the client's jitter buffer holds: aiortc's default is 4 (80 ms); a browser
    # on loopback adapts down to about one.
    client_prefetch: int = 1
    max_ahead_ms: int = 5000  # the server's --max-ahead-ms


async def one_session(base: str, index: int, opts: Options) -> SessionResult:
    client = await connect(base, MicTrack(vowel()), opts.client_prefetch)
    try:
        client.channel.send(
            json.dumps(
                {
                    "type": "session.start",
                    "sampling": {"seed": index},
                    "barge_in": {"mode": "cancel", "guard_ms": 300},
                }
            )
        )
        await client.event("session.created", 20)
        # Two sentences, capped by the server's --max-speech-s: speech outlasts listen_s.
        client.channel.send(json.dumps({"type": "speak", "text": " ".join(TEXTS[:2])}))
        await client.event("turn.first_audio", 60)
        while not any(rms > SILENT_RMS for _, rms in client.heard):
            await asyncio.sleep(0.01)
        first = next(i for i, (_, rms) in enumerate(client.heard) if rms > SILENT_RMS)
        await asyncio.sleep(opts.listen_s)
        underruns = sum(rms <= SILENT_RMS for _, rms in client.heard[first:])
        client.mic.speak()
        await client.event("turn.cancelled", 10)
        await asyncio.sleep(0.2 + CUT_FRAMES * 0.02)
        onset = client.mic.onset
        assert onset is not None
        after = [rms for t, rms in client.heard if t >= onset]
        times = [t for t, _ in client.heard if t >= onset]
        cut = next(
            (
                i
                for i in range(len(after) - CUT_FRAMES + 1)
                if all(r <= SILENT_RMS for r in after[i : i + CUT_FRAMES])
            ),
            None,
        )
        latency = None if cut is None else (times[cut] - onset) * 1000
        gaps = sum(e["offset_ms"] > 0 for e in client.syncs)
        return SessionResult(underruns, gaps, latency)
    finally:
        for task in client.tasks:
            task.cancel()
        client.mic.stop()
        await client.pc.close()


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
        "bargein_ms_p95": round(_percentile(latencies, 0.95), 1) if latencies else None,
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
        "model": model or "tiny",
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
