"""Simulated Asterisk calls that tests and benches drive a telephony server with, byte for
byte as Asterisk behaves (res_audiosocket.c, app_audiosocket.c, chan_websocket.c):

- `SimulatedAudioSocketCall`: Asterisk's AudioSocket() dialing our TCP server. It sends
  the UUID, then a slin frame every 20 ms (the caller's audio, silence between clips)
  and plays what the server sends the moment it arrives (Asterisk has no queue there);
- `SimulatedAsteriskWebSocketCall`: chan_websocket dialing our WebSocket server. It
  sends MEDIA_START, streams the caller, queues the server's media and plays one frame
  per 20 ms, with XOFF/XON, FLUSH_MEDIA, marks, GET_STATUS and QUEUE_DRAINED (the queue
  itself, sans I/O, is asterisk_queue.MediaQueue).

Both record what the caller hears (`playback`, with play times) and an `events` list;
times are time.monotonic(). Use them as `async with SimulatedXxxCall(...) as call:`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import urlencode

import numpy as np
import websockets
from numpy.typing import NDArray
from websockets.typing import Subprotocol

from ..audio.codecs import mulaw_decode, mulaw_encode
from ..telephony import asterisk_ws_control as ctl
from ..telephony import audiosocket_frames as af
from .asterisk_queue import QUEUE_COMMANDS, MediaQueue

FRAME_S = 0.02
Int16Array = NDArray[np.int16]


@dataclass(frozen=True)
class CallEvent:
    at: float  # time.monotonic()
    kind: str
    detail: Any = None


@dataclass(frozen=True)
class PlayedFrame:
    at: float  # when the caller hears it
    pcm: Int16Array
    sample_rate: int

    @property
    def duration(self) -> float:
        return self.pcm.size / self.sample_rate


@dataclass
class Playback:
    """What the caller heard, frame by frame (silence Asterisk made up is not a frame)."""

    frames: list[PlayedFrame] = field(default_factory=list)

    def add(self, at: float, pcm: Int16Array, sample_rate: int) -> None:
        self.frames.append(PlayedFrame(at, pcm, sample_rate))

    def played_pcm(self) -> Int16Array:
        if not self.frames:
            return np.zeros(0, np.int16)
        return np.concatenate([f.pcm for f in self.frames]).astype(np.int16)

    @property
    def first_frame_at(self) -> float | None:
        return self.frames[0].at if self.frames else None

    def first_audio_at(self, level: int = 0) -> float | None:
        """Play time of the first frame whose peak exceeds `level`."""
        for f in self.frames:
            if f.pcm.size and int(np.abs(f.pcm.astype(np.int32)).max()) > level:
                return f.at
        return None

    def gaps(self, threshold: float = 0.03) -> list[tuple[float, float]]:
        """(start, length) of each silence longer than `threshold` between two frames:
        the next frame came later than the previous one finished playing."""
        out = []
        for prev, cur in itertools.pairwise(self.frames):
            end = prev.at + prev.duration
            if cur.at - end > threshold:
                out.append((end, cur.at - end))
        return out


class _Call:
    """What both peers share: the caller's clips, paced frames, events, tasks, close."""

    def __init__(self, sample_rate: int, caller_pcm: Int16Array | None) -> None:
        self.sample_rate = sample_rate
        self.frame_samples = int(sample_rate * FRAME_S)
        self.events: list[CallEvent] = []
        self.playback = Playback()
        self.started_at: float | None = None
        self.ended = asyncio.Event()
        self.server_hung_up = False
        self._clips: deque[tuple[Int16Array, int]] = deque()  # (clip, samples sent)
        self._tasks: list[asyncio.Task[None]] = []
        if caller_pcm is not None:
            self.say(caller_pcm)

    # -- the caller's side
    def say(self, pcm: Int16Array) -> None:
        """Queue a clip (int16 at the call's rate) to speak after any queued before."""
        self._clips.append((np.asarray(pcm, dtype=np.int16), 0))

    def _next_caller_frame(self, now: float) -> Int16Array:
        out = np.zeros(self.frame_samples, np.int16)
        filled = 0
        while filled < out.size and self._clips:
            clip, sent = self._clips[0]
            if sent == 0:
                self._event("say_start", clip.size, now)
            take = min(out.size - filled, clip.size - sent)
            out[filled : filled + take] = clip[sent : sent + take]
            filled += take
            if sent + take >= clip.size:
                self._clips.popleft()
                self._event("say_end", clip.size, now)
            else:
                self._clips[0] = (clip, sent + take)
        return out

    async def _pace(self, send_frame: Any) -> None:
        """Call `send_frame(pcm)` every 20 ms on an absolute clock (a channel never stops)."""
        start = time.monotonic()
        for k in itertools.count():
            delay = start + k * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await send_frame(self._next_caller_frame(time.monotonic()))
            except (ConnectionError, websockets.ConnectionClosed):
                return  # the reader sees the close and ends the call

    # -- bookkeeping
    def _event(self, kind: str, detail: Any = None, at: float | None = None) -> None:
        self.events.append(CallEvent(time.monotonic() if at is None else at, kind, detail))

    def times(self, kind: str) -> list[float]:
        return [e.at for e in self.events if e.kind == kind]

    def played_pcm(self) -> Int16Array:
        return self.playback.played_pcm()

    @property
    def first_audio_at(self) -> float | None:
        return self.playback.first_audio_at()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coro))

    def _end(self, kind: str, detail: Any = None) -> None:
        """The call is over: stop every task but the caller's own."""
        if self.ended.is_set():
            return
        self._event(kind, detail)
        self.ended.set()
        me = asyncio.current_task()
        for task in self._tasks:
            if task is not me:
                task.cancel()

    async def wait_ended(self, timeout: float = 10.0) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ended.wait(), timeout)
        return self.ended.is_set()

    async def _stop_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def start(self) -> Self:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# -- AudioSocket -------------------------------------------------------------------------


class SimulatedAudioSocketCall(_Call):
    """AudioSocket(<uuid>,host:port) on a channel at `sample_rate` (8000: kind 0x10;
    16000 etc. as Dial(AudioSocket/host:port/<uuid>/c(slin16)) would send).

    `strict` (Asterisk's way): a packet kind Asterisk does not take from a server (UUID,
    DTMF, ERROR), an unknown kind or an empty audio payload ends the call; it is
    recorded in `protocol_errors` either way."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        call_id: str | None = None,
        sample_rate: int = 8000,
        caller_pcm: Int16Array | None = None,
        strict: bool = True,
    ) -> None:
        super().__init__(sample_rate, caller_pcm)
        self.host, self.port = host, port
        self.call_id = call_id or str(uuid.uuid4())
        self.kind = af.slin_kind(sample_rate)
        self.strict = strict
        self.protocol_errors: list[af.Packet | str] = []
        self._decoder = af.AudioSocketDecoder()
        self._writer: asyncio.StreamWriter | None = None

    async def start(self) -> Self:
        reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self.started_at = time.monotonic()
        self._writer.write(af.encode_uuid(self.call_id))
        await self._writer.drain()
        self._spawn(self._pace(self._send_audio))
        self._spawn(self._read(reader))
        return self

    async def _send_audio(self, pcm: Int16Array) -> None:
        assert self._writer is not None
        self._writer.write(af.encode(self.kind, pcm.astype("<i2").tobytes()))
        await self._writer.drain()

    async def send_dtmf(self, digit: str) -> None:
        """A DTMF packet between two audio frames, as Asterisk forwards a digit's end."""
        assert self._writer is not None
        self._writer.write(af.encode_dtmf(digit))
        await self._writer.drain()
        self._event("dtmf", digit)

    async def hangup(self) -> None:
        """The caller hangs up: Asterisk closes the socket (it sends no HANGUP packet)."""
        self._end("caller_hangup")
        await self.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(65536):
                now = time.monotonic()
                for packet in self._decoder.feed(data):
                    if packet.is_audio:
                        pcm = np.frombuffer(packet.payload[: len(packet.payload) // 2 * 2], "<i2")
                        self.playback.add(now, pcm.astype(np.int16), packet.sample_rate)
                    elif packet.kind is af.Kind.HANGUP:
                        self.server_hung_up = True
                        self._end("server_hangup")
                        return
                    else:
                        self.protocol_errors.append(packet)
                        self._event("protocol_error", packet)
                        if self.strict:
                            self._end("hangup_on_protocol_error", packet.kind.name)
                            return
        except af.AudioSocketError as err:
            self.protocol_errors.append(str(err))
            self._end("hangup_on_protocol_error", str(err))
            return
        except ConnectionError as err:
            self._end("connection_lost", str(err))
            return
        self.server_hung_up = True  # socket closure is a hangup too
        self._end("server_closed")

    async def close(self) -> None:
        self.ended.set()
        await self._stop_tasks()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()


# -- chan_websocket ----------------------------------------------------------------------


_uniqueids = itertools.count(1)
_EVENT_KINDS = {
    ctl.MediaXoff: "xoff",
    ctl.MediaXon: "xon",
    ctl.QueueDrained: "queue_drained",
    ctl.MediaMarkProcessed: "mark_processed",
    ctl.MediaBufferingCompleted: "buffering_completed",
    ctl.Status: "status",
    ctl.Error: "error",
}


class SimulatedAsteriskWebSocketCall(_Call):
    """Dial(WebSocket/<connection_id>/c(<format>)) against a server at `url`: Asterisk is
    the WebSocket client, subprotocol "media", no compression, no pings. `queue` is
    chan_websocket's queue (asterisk_queue.MediaQueue: XOFF/XON levels, counts of media
    sent during XOFF or dropped); its levels default to Asterisk's and can be lowered."""

    def __init__(
        self,
        url: str,
        *,
        format: str = "ulaw",
        control_format: ctl.ControlFormat | str = ctl.ControlFormat.PLAIN,
        connection_id: str = "voiceagent",
        uri_params: dict[str, str] | None = None,
        subprotocol: str | None = ctl.SUBPROTOCOL,
        caller_pcm: Int16Array | None = None,
        xoff_level: int = ctl.XOFF_LEVEL,
        xon_level: int = ctl.XON_LEVEL,
        queue_max: int = ctl.QUEUE_LENGTH_MAX,
        channel_variables: dict[str, str] | None = None,
        open_timeout: float = 5.0,
    ) -> None:
        self.media = ctl.media_format(format)
        if self.media.codec not in ("mulaw", "pcm16"):
            raise ValueError(f"the simulator speaks ulaw and slin*, not {format}")
        super().__init__(self.media.sample_rate, caller_pcm)
        if uri_params:
            url += ("&" if "?" in url else "?") + urlencode(uri_params)
        self.url = url
        self.fmt = ctl.ControlFormat(control_format)
        self.subprotocol = subprotocol
        self.open_timeout = open_timeout
        self.channel_id = f"{int(time.time())}.{next(_uniqueids)}"  # like Asterisk's uniqueid
        channel = f"WebSocket/{connection_id}/0x{id(self):x}"
        size = self.media.optimal_frame_size
        self.media_start = ctl.MediaStart(
            connection_id, channel, self.media.name, size, 20, self.channel_id,
            dict(channel_variables or {}),
        )  # fmt: skip
        self.queue = MediaQueue(size, self.channel_id, xoff_level, xon_level, queue_max)
        self.answered = False
        self.close_code: int | None = None
        self._ws: websockets.ClientConnection | None = None

    @property
    def media_while_xoff(self) -> int:
        return self.queue.media_while_xoff

    async def start(self) -> Self:
        protocols = [Subprotocol(self.subprotocol)] if self.subprotocol else None
        self._ws = await websockets.connect(
            self.url,
            subprotocols=protocols,
            compression=None,  # Asterisk offers no extension and fails on one
            max_size=ctl.MAX_MEDIA_MESSAGE_BYTES,
            ping_interval=None,
            user_agent_header=None,
            open_timeout=self.open_timeout,
        )
        self.started_at = time.monotonic()
        await self._send_text(ctl.encode_event(self.media_start, self.fmt))
        self._event("media_start", self.media_start)
        self._spawn(self._read())
        self._spawn(self._playout())
        self._spawn(self._pace(self._send_audio))
        return self

    # -- what Asterisk sends
    async def _send_text(self, text: str) -> None:
        assert self._ws is not None
        with contextlib.suppress(websockets.ConnectionClosed):
            await self._ws.send(text)

    async def _send_events(self, events: list[ctl.Event]) -> None:
        for event in events:
            self._event(_EVENT_KINDS.get(type(event), "event"), event)
            await self._send_text(ctl.encode_event(event, self.fmt))

    async def _send_audio(self, pcm: Int16Array) -> None:
        assert self._ws is not None
        if self.media.codec == "mulaw":
            await self._ws.send(mulaw_encode(pcm).tobytes())
        else:
            await self._ws.send(pcm.astype("<i2").tobytes())

    def _decode(self, data: bytes) -> Int16Array:
        if self.media.codec == "mulaw":
            return mulaw_decode(data)
        return np.frombuffer(data[: len(data) // 2 * 2], "<i2").astype(np.int16)

    async def send_dtmf(self, digit: str) -> None:
        await self._send_text(ctl.encode_event(ctl.DtmfEnd(digit, self.channel_id), self.fmt))
        self._event("dtmf", digit)

    async def report_error(self, text: str) -> None:
        """Asterisk's ERROR event (a command it could not carry out)."""
        await self._send_events([ctl.Error(text, self.channel_id)])

    async def hangup(self) -> None:
        """The caller hangs up: Asterisk closes the WebSocket with 1000."""
        self._end("caller_hangup")
        await self.close()

    # -- what the server sends
    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for message in self._ws:
                if isinstance(message, str):
                    await self._command(message)
                else:
                    dropped = self.queue.dropped_messages
                    await self._send_events(self.queue.media(message))
                    if self.queue.dropped_messages > dropped:
                        self._event("media_dropped", len(message))
        except websockets.ConnectionClosed:
            pass
        self.close_code = self._ws.close_code
        self._end("server_closed", self.close_code)

    async def _command(self, text: str) -> None:
        text = text.strip()
        if not text or len(text.encode()) > ctl.MAX_COMMAND_BYTES:
            self._event("command_ignored", text)  # Asterisk logs and ignores these
            return
        try:
            cmd = ctl.parse_command(text, self.fmt)
        except ValueError:
            await self._send_events([ctl.Error("Unable to parse JSON command", self.channel_id)])
            return
        self._event("command", cmd.name)
        if cmd.name == ctl.FLUSH_MEDIA:
            self._event("flush", self.queue.length)
        if cmd.name in QUEUE_COMMANDS:
            await self._send_events(self.queue.command(cmd))
        elif cmd.name == ctl.ANSWER:
            self.answered = True
        elif cmd.name == ctl.HANGUP:
            self.server_hung_up = True
            self._end("server_hangup")
            assert self._ws is not None
            await self._ws.close(1000)
        else:
            self._event("unknown_command", cmd.name)

    async def _playout(self) -> None:
        """Asterisk's channel timer: one tick per ptime on an absolute clock."""
        start = time.monotonic()
        for k in itertools.count(1):
            delay = start + k * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            frame, events = self.queue.tick()
            await self._send_events(events)
            if frame is not None:
                self.playback.add(time.monotonic(), self._decode(frame), self.sample_rate)

    async def close(self) -> None:
        self.ended.set()
        await self._stop_tasks()
        if self._ws is not None:
            await self._ws.close(1000)
            if self.close_code is None:
                self.close_code = self._ws.close_code
