"""The clients the benches and the tests drive a server with, over real connections:

- `Client` (with `connect`, `TurnResult`): a session over a `websockets` connection;
- `Peer` (with `open_peer`): an aiortc peer connection, control on its data channel,
  every frame of the server's audio track recorded with its level and arrival time;
- `MicTrack`: the peer's microphone, silence and then a clip, paced in real time.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import numpy as np
import websockets
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from ..protocol import frames
from ..transport.webrtc_media import (
    FRAME_BYTES,
    FRAME_SAMPLES,
    RATE,
    mono_float,
    set_audio_prefetch,
)

# -- WebSocket --------------------------------------------------------------------------


@dataclass
class TurnResult:
    events: list[dict[str, Any]] = field(default_factory=list)
    frames: list[frames.AudioFrame] = field(default_factory=list)
    levels: list[dict[str, Any]] = field(default_factory=list)  # audio.levels events
    first_frame_at: float | None = None  # time.perf_counter() when the first frame came

    def event(self, kind: str) -> dict[str, Any]:
        matches = [e for e in self.events if e["type"] == kind]
        assert matches, f"no {kind} event in {[e['type'] for e in self.events]}"
        return matches[0]


class Client:
    """A thin client over a real websockets connection."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(json.dumps(message) if isinstance(message, dict) else message)

    async def event(self, timeout: float | None = 10.0) -> dict[str, Any]:
        """Next JSON event other than audio.levels (fails on a binary frame)."""
        while True:
            msg = await asyncio.wait_for(self.ws.recv(), timeout)
            assert isinstance(msg, str), "expected a JSON event, got a binary frame"
            event = dict(json.loads(msg))
            if event["type"] != "audio.levels":
                return event

    async def start(self, **settings: Any) -> dict[str, Any]:
        await self.send({"type": "session.start", **settings})
        event = await self.event()
        assert event["type"] == "session.created", event
        return event

    async def turn(
        self,
        until: tuple[str, ...] = ("turn.done",),
        timeout: float | None = 60,
        into: TurnResult | None = None,
    ) -> TurnResult:
        """Collect events and frames until an event of a type in `until` (or an error
        for a turn) arrives; `timeout` None waits as long as it takes. `into`: collect
        there (a caller whose wait times out still sees what came)."""
        result = TurnResult() if into is None else into
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is None:
                msg = await self.ws.recv()
            else:
                left = max(0.1, deadline - time.monotonic())
                msg = await asyncio.wait_for(self.ws.recv(), left)
            if isinstance(msg, bytes):
                if result.first_frame_at is None:
                    result.first_frame_at = time.perf_counter()
                result.frames.append(frames.unpack(msg))
                continue
            event = json.loads(msg)
            if event["type"] == "audio.levels":  # lip-sync data: kept apart from events
                result.levels.append(event)
                continue
            result.events.append(event)
            if event["type"] in until or (event["type"] == "error" and "turn_id" in event):
                return result

    async def speak(self, text: str, **extra: Any) -> TurnResult:
        await self.send({"type": "speak", "text": text, **extra})
        return await self.turn()


def connect(url: str, credential: str | None = None) -> Any:
    """`async with connect(url) as ws:`, without a message size limit; `credential` (an
    API key or a session token) goes in the handshake's Authorization header."""
    headers = {"Authorization": f"Bearer {credential}"} if credential else None
    return websockets.connect(url, max_size=None, additional_headers=headers)


# -- WebRTC -----------------------------------------------------------------------------


class MicTrack(MediaStreamTrack):
    """A client's microphone: silence, then `pcm` (48 kHz mono float) once from frame
    `clip_at` (or from when `play_now()` is called), then silence; 20 ms frames paced in
    real time (aiortc's sender pulls as fast as recv() returns). `onset` is when the first
    frame of the clip whose peak (int16) exceeds `onset_level` went out (-1: the clip's
    first frame)."""

    kind = "audio"

    def __init__(self, pcm: np.ndarray, clip_at: int | None = 0, onset_level: int = 1000) -> None:
        super().__init__()
        self.pcm = (np.clip(pcm, -1, 1) * 32767).astype("<i2")
        self.clip_at = clip_at
        self.onset_level = onset_level
        self.index = 0
        self.start: float | None = None
        self.onset: float | None = None

    def play_now(self) -> None:
        self.clip_at = self.index

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.start is None:
            self.start = time.monotonic()
        delay = self.start + self.index * 0.02 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        k = -1 if self.clip_at is None else self.index - self.clip_at
        chunk = self.pcm[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES] if k >= 0 else None
        if (
            self.onset is None
            and chunk is not None
            and chunk.size
            and int(np.abs(chunk.astype(np.int32)).max()) > self.onset_level
        ):
            self.onset = time.monotonic()
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        data = b"" if chunk is None else chunk.tobytes()
        frame.planes[0].update(data.ljust(FRAME_BYTES, b"\0"))
        frame.pts = self.index * FRAME_SAMPLES
        frame.sample_rate = RATE
        frame.time_base = fractions.Fraction(1, RATE)
        self.index += 1
        return frame


@dataclass
class Peer:
    pc: RTCPeerConnection
    channel: RTCDataChannel
    mic: MicTrack | None = None
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    seen: list[dict[str, Any]] = field(default_factory=list)  # every event, in order
    # (pts, rms, arrival time) of every frame the track delivered
    frames: list[tuple[int, float, float]] = field(default_factory=list)
    # every frame's mono float samples at 48 kHz, in order, for a peer opened with
    # keep_audio (tests that hear what arrived)
    audio: list[np.ndarray] | None = None
    readers: list[asyncio.Task[None]] = field(default_factory=list)

    def send(self, message: dict[str, Any]) -> None:
        self.channel.send(json.dumps(message))

    async def event(self, kinds: tuple[str, ...], timeout: float = 20) -> dict[str, Any]:
        """The next event of one of `kinds`, skipping others (VAD events, first_audio...);
        an error event raises unless "error" is one of `kinds`."""
        deadline = time.monotonic() + timeout
        while True:
            event = await asyncio.wait_for(self.events.get(), deadline - time.monotonic())
            if event["type"] in kinds:
                return event
            if event["type"] == "error":
                raise RuntimeError(f"server error: {event}")

    def syncs(self) -> list[dict[str, Any]]:
        """The audio.sync events so far."""
        return [e for e in self.seen if e["type"] == "audio.sync"]

    async def close(self) -> None:
        for task in self.readers:
            task.cancel()
        if self.mic is not None:
            self.mic.stop()
        await self.pc.close()


async def open_peer(
    base: str,
    mic: MicTrack | None = None,
    prefetch: int | None = None,
    offer_timeout: float = 10,
    open_timeout: float = 10,
    credential: str | None = None,
    keep_audio: bool = False,
) -> Peer:
    """A peer connected to the server at `base` (http://host:port) with its data channel
    open. Without `mic` the audio is receive-only. `prefetch`: frames the receiver's
    jitter buffer holds (None: aiortc's default, 4). `keep_audio`: keep every received
    frame's samples in `peer.audio`."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("control")
    peer = Peer(pc, channel, mic, audio=[] if keep_audio else None)

    @channel.on("message")
    def on_message(message: str) -> None:
        event = json.loads(message)
        peer.seen.append(event)
        peer.events.put_nowait(event)

    if mic is None:
        pc.addTransceiver("audio", direction="recvonly")
    else:
        pc.addTransceiver(mic, direction="sendrecv")

    async def read(track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            x = mono_float(frame)
            peer.frames.append(
                (int(frame.pts or 0), float(np.sqrt(np.mean(x**2))), time.monotonic())
            )
            if peer.audio is not None:
                peer.audio.append(x)

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        peer.readers.append(asyncio.get_running_loop().create_task(read(track)))

    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient() as http:
        r = await http.post(
            base + "/v1/webrtc/offer",
            json={"sdp": pc.localDescription.sdp, "type": "offer"},
            timeout=offer_timeout,
            headers={"Authorization": f"Bearer {credential}"} if credential else None,
        )
    if r.status_code != 200:
        raise RuntimeError(f"offer refused: {r.status_code} {r.text}")
    answer = r.json()
    if answer["type"] != "answer" or "opus/48000" not in answer["sdp"].lower():
        raise RuntimeError(f"not an Opus answer: {answer}")
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
    if prefetch is not None:
        set_audio_prefetch(pc, prefetch)
    deadline = time.monotonic() + open_timeout
    while channel.readyState != "open":
        if time.monotonic() > deadline:
            raise RuntimeError("data channel did not open")
        await asyncio.sleep(0.01)
    return peer
