"""Simulated phone carriers (Twilio Media Streams, Telnyx media streaming, Vonage Voice
WebSockets) that place calls on a voiceagent telephony URL the way each platform does.

Modelled, not mocked: the caller's audio goes out every 20 ms on an absolute clock for the
whole call (silence included); what the server sends is buffered and played in real time
on the carrier's own 20 ms clock, marks (Vonage: notify) echo when the audio queued before
them has played (at once when nothing is queued or playing), `clear` drops the buffer and
echoes pending marks at once. Messages that break the platform's schema land in
`violations` (Twilio: binary frames are refused, warning 31950; unknown events, a wrong
streamSid and unexpected fields, 31951). Telnyx L16 is big-endian (network order, as
pipecat reads it), Vonage L16 little-endian; Vonage buffers at most 3072 frames (~60 s).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import secrets
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Self

import numpy as np
import websockets
from websockets.asyncio.client import ClientConnection, connect

from ..audio.codecs import mulaw_decode, mulaw_encode
from ..audio.resample import StreamResampler
from .playout import FRAME_S, Int16, MarkEcho, Played, Playout, Violation

Headers = dict[str, str] | None
Message = dict[str, Any]


class _Call(ABC):
    """What the carriers share: the socket, the 20 ms clock, the caller's audio out and
    the playback of the server's; subclasses word the messages."""

    platform = ""
    rate = 8000  # the call's sample rate, both directions
    codec = "mulaw"  # or a numpy dtype for L16: ">i2" (big-endian), "<i2"
    max_buffer_frames: int | None = None

    def __init__(self, url: str, extra_headers: Headers = None) -> None:
        self.url, self.extra_headers = url, extra_headers or {}
        self.ws: ClientConnection | None = None
        frames = self.max_buffer_frames
        self.playout = Playout(self.rate, frames and frames * int(self.rate * FRAME_S))
        self.violations: list[Violation] = []
        self.marks: list[MarkEcho] = []
        self.media_at: list[float] = []  # arrival of each audio message from the server
        self.clears: list[float] = []  # arrival of each clear
        self.said_at: list[float] = []  # when the first frame of each said clip went out
        self.bytes_before_start = 0
        self.started_at: float | None = None
        self.closed_at: float | None = None
        self.close_code: int | None = None
        self._seq = self._chunk = self._say_pos = 0
        self._say: deque[Int16] = deque()
        self._hung_up = False
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self, start: bool = True) -> None:
        """Dial in and, unless `start` is False, send the opening messages."""
        headers = self.extra_headers
        self.ws = await connect(self.url, additional_headers=headers, max_size=None, proxy=None)
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._clock())]
        if start:
            await self.send_start()

    async def send_start(self) -> None:
        for message in self._hello():
            await self._send(message)
        self.started_at = time.monotonic()

    async def hangup(self) -> None:
        """End the call as the platform does (Twilio/Telnyx: `stop`, then close)."""
        if self._hung_up or self.ws is None:
            return
        self._hung_up = True
        stop = self._stop()
        with contextlib.suppress(websockets.ConnectionClosed):
            if stop is not None:
                await self._send(stop)
        await self.ws.close()

    async def close(self) -> None:
        await self.hangup()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.platform} call: condition not met in {timeout} s")
            await asyncio.sleep(0.01)

    def say(self, pcm: np.ndarray, rate: int | None = None) -> None:
        """Queue a clip (int16, or float in [-1, 1]; at `rate`, default the call's) to go
        out from the next frame, after any clip still being said."""
        if rate is not None and rate != self.rate:
            r = StreamResampler(rate, self.rate)
            x = pcm.astype(np.float32) / (32768 if pcm.dtype == np.int16 else 1)
            pcm = np.concatenate([r.process(x), r.flush()])
        if pcm.dtype != np.int16:
            pcm = np.rint(np.clip(pcm, -1, 1) * 32767).astype(np.int16)
        if pcm.size:
            self._say.append(pcm)

    async def send_dtmf(self, digit: str) -> None:
        await self._send(self._dtmf(digit))

    def _caller_frame(self) -> Int16:
        n = self.playout.n
        if not self._say:
            return np.zeros(n, np.int16)
        if self._say_pos == 0:
            self.said_at.append(time.monotonic())
        clip = self._say[0]
        frame = clip[self._say_pos : self._say_pos + n]
        self._say_pos += n
        if self._say_pos >= clip.size:
            self._say.popleft()
            self._say_pos = 0
        return np.pad(frame, (0, n - frame.size))

    @property
    def played(self) -> list[Played]:
        return self.playout.played

    @property
    def underruns(self) -> int:
        return self.playout.underruns

    @property
    def first_media_at(self) -> float | None:
        return self.media_at[0] if self.media_at else None

    def played_pcm(self, gaps: bool = False) -> Int16:
        """All the caller heard, in order; with `gaps`, the silences between (and inside)
        the audio frames too, each frame padded to 20 ms, trailing silence cut."""
        parts = [p.pcm for p in self.played]
        if gaps:
            last = max((i for i, p in enumerate(parts) if p.size), default=-1)
            parts = [np.pad(p, (0, self.playout.n - p.size)) for p in parts[: last + 1]]
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    # -- bad input, for the server's tests ----------------------------------------------

    async def send_raw(self, message: str | bytes) -> None:
        assert self.ws is not None
        await self.ws.send(message)

    async def send_media_now(self) -> None:
        """One frame of silence now, started or not (after `open(start=False)`: media
        before start)."""
        await self._send(self._media(self._encode(np.zeros(self.playout.n, np.int16))))

    async def send_wrong_size(self) -> None:
        """A media message of 5 ms instead of 20 ms."""
        await self._send(self._media(self._encode(np.zeros(self.playout.n // 4, np.int16))))

    @abstractmethod
    async def send_bad_base64(self) -> None: ...

    async def send_unknown_event(self) -> None:
        await self.send_raw(json.dumps({"event": "bogus", "bogus": {}}))

    # -- the loops ----------------------------------------------------------------------

    async def _clock(self) -> None:
        """One tick per 20 ms on an absolute clock (late ticks catch up at once)."""
        t0, k = time.monotonic(), 0
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                t = t0 + k * FRAME_S
                if (delay := t - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                if self.started_at is not None and not self._hung_up:
                    self._chunk += 1
                    await self._send(self._media(self._encode(self._caller_frame())))
                for name in self.playout.tick(t):
                    await self._echo(name, "play")
                k += 1

    async def _receive(self) -> None:
        assert self.ws is not None
        with contextlib.suppress(websockets.ConnectionClosed):
            async for message in self.ws:
                await self._on_message(message, time.monotonic())
        self.closed_at, self.close_code = time.monotonic(), self.ws.close_code

    async def _on_message(self, message: str | bytes, now: float) -> None:
        if self.started_at is None:
            self.bytes_before_start += len(message)
            self._violate("before-start", f"{len(message)} bytes before the call started", now)
            return
        parsed = self._parse(message, now)
        if isinstance(parsed, np.ndarray):
            self.media_at.append(now)
            if not self.playout.push_audio(parsed, now):
                self._violate("overflow", "the carrier's buffer is full: audio dropped", now)
        elif isinstance(parsed, str) and self.playout.push_mark(parsed, now):
            await self._echo(parsed, "play")
        elif parsed is CLEAR:
            self.clears.append(now)
            for name in self.playout.clear():
                await self._echo(name, "clear")
            if (ack := self._cleared()) is not None:
                await self._send(ack)

    async def _echo(self, name: str, by: str) -> None:
        message = self._mark_echo(name, by)
        self.marks.append(MarkEcho(name, time.monotonic(), by if message else "dropped"))
        if message:
            await self._send(message)

    async def _send(self, message: str | bytes | Message) -> None:
        assert self.ws is not None
        await self.ws.send(json.dumps(message) if isinstance(message, dict) else message)

    def _violate(self, kind: str, detail: str, now: float) -> object:
        self.violations.append(Violation(kind, detail, now))
        return None  # what _parse returns for a message it refuses

    def _next_seq(self) -> str:
        self._seq += 1
        return str(self._seq)  # numbers travel as strings on both JSON platforms

    def _encode(self, pcm: Int16) -> bytes:
        return (
            mulaw_encode(pcm).tobytes()
            if self.codec == "mulaw"
            else pcm.astype(self.codec).tobytes()
        )

    def _decode(self, payload: bytes) -> Int16:
        if self.codec == "mulaw":
            return mulaw_decode(payload)
        return np.frombuffer(payload, self.codec).astype(np.int16)

    def _cleared(self) -> Message | None:
        return None

    @abstractmethod
    def _hello(self) -> list[Message]: ...
    @abstractmethod
    def _media(self, payload: bytes) -> bytes | Message: ...
    @abstractmethod
    def _dtmf(self, digit: str) -> Message: ...
    @abstractmethod
    def _stop(self) -> Message | None: ...
    @abstractmethod
    def _mark_echo(self, name: str, by: str) -> Message | None: ...
    @abstractmethod
    def _parse(self, message: str | bytes, now: float) -> object:
        """What a message from the server carries: audio (int16), a mark's name, CLEAR,
        or None (a violation, recorded)."""


CLEAR = object()


class _JsonCall(_Call):
    """Twilio and Telnyx: JSON text messages both ways, base64 payloads."""

    SEQ = SID = ""  # the keys of the sequence number and of the stream id
    sid_required = True  # in what the server sends
    extra_fields_ok = False
    chunk_limits_s = (0.0, float("inf"))  # allowed duration of one media message

    def __init__(self, url: str, custom_parameters: Headers, extra_headers: Headers) -> None:
        super().__init__(url, extra_headers)
        self.custom_parameters = dict(custom_parameters or {})
        self.stream_id = ""

    def _msg(self, event: str, **body: Any) -> Message:
        """A message in the platform's words: sequence number, `body`, stream id."""
        return {"event": event, self.SEQ: self._next_seq(), **body, self.SID: self.stream_id}

    def _media(self, payload: bytes) -> Message:
        ms, b64 = str(max(0, self._chunk - 1) * 20), base64.b64encode(payload).decode()
        media = {"track": "inbound", "chunk": str(self._chunk), "timestamp": ms, "payload": b64}
        return self._msg("media", media=media)

    def _mark_echo(self, name: str, by: str) -> Message:
        return self._msg("mark", mark={"name": name})

    async def send_bad_base64(self) -> None:
        message = self._media(b"")
        message["media"]["payload"] = "@@not base64@@"
        await self._send(message)

    def _parse(self, message: str | bytes, now: float) -> object:
        if isinstance(message, bytes):
            return self._violate("binary", f"{len(message)}-byte binary frame (JSON only)", now)
        try:
            msg = json.loads(message)
        except ValueError:
            return self._violate("json", f"not JSON: {message[:80]!r}", now)
        event = msg.get("event") if isinstance(msg, dict) else None
        if event not in ("media", "mark", "clear"):
            return self._violate("unknown-event", f"event {event!r}", now)
        sid = msg.get(self.SID)
        if (sid is None and self.sid_required) or (sid is not None and sid != self.stream_id):
            self._violate("stream-id", f"{self.SID} {sid!r} in {event}", now)
        key, field = {"media": ("media", "payload"), "mark": ("mark", "name")}.get(event, ("", ""))
        if (extra := set(msg) - {"event", self.SID, key}) and not self.extra_fields_ok:
            self._violate("schema", f"unexpected fields {sorted(extra)} in {event}", now)
        if not key:
            return CLEAR
        inner = msg.get(key)
        if not isinstance(inner, dict) or not isinstance(inner.get(field), str):
            return self._violate("schema", f"{event} needs {key}.{field} (a string)", now)
        if set(inner) != {field} and not self.extra_fields_ok:
            self._violate("schema", f"unexpected fields {sorted(inner)} in {key}", now)
        if key == "mark":
            return str(inner["name"])
        try:
            payload = base64.b64decode(inner["payload"], validate=True)
        except (binascii.Error, ValueError):
            return self._violate("base64", f"bad base64 {inner['payload'][:40]!r}", now)
        frame = len(self._encode(np.zeros(self.playout.n, np.int16)))
        width = frame // self.playout.n
        if not payload or len(payload) % width:
            return self._violate("frame-size", f"{len(payload)}-byte payload", now)
        lo, hi = self.chunk_limits_s
        if len(payload) % frame or not lo <= len(payload) / width / self.rate <= hi:
            # Twilio plays any size; whole 20 ms frames are our own rule
            self._violate("frame-size", f"{len(payload)} bytes, frames are {frame}", now)
        return self._decode(payload)


class SimulatedTwilioCall(_JsonCall):
    """A Twilio `<Connect><Stream>` call: μ-law 8 kHz, `customParameters` from the test."""

    platform = "twilio"
    SEQ, SID = "sequenceNumber", "streamSid"

    def __init__(self, url: str, custom_parameters: Headers = None, extra_headers: Headers = None):
        super().__init__(url, custom_parameters, extra_headers)
        self.stream_id = "MZ" + secrets.token_hex(16)
        self.call_sid = "CA" + secrets.token_hex(16)
        self.account_sid = "AC" + secrets.token_hex(16)

    def _hello(self) -> list[Message]:
        start = {
            "accountSid": self.account_sid,
            "streamSid": self.stream_id,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "customParameters": self.custom_parameters,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        hello = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        return [hello, self._msg("start", start=start)]

    def _dtmf(self, digit: str) -> Message:
        return self._msg("dtmf", dtmf={"track": "inbound_track", "digit": digit})

    def _stop(self) -> Message:
        return self._msg("stop", stop={"accountSid": self.account_sid, "callSid": self.call_sid})


class SimulatedTelnyxCall(_JsonCall):
    """A Telnyx call with `stream_bidirectional_mode=rtp`: PCMU 8 kHz or L16 8/16 kHz, the
    same codec both ways; `custom_parameters` from the test."""

    platform = "telnyx"
    SEQ, SID = "sequence_number", "stream_id"
    sid_required = False
    extra_fields_ok = True  # the docs do not say Telnyx refuses extra fields
    chunk_limits_s = (0.02, 30.0)  # "20 milliseconds to 30 seconds of audio"

    def __init__(
        self,
        url: str,
        custom_parameters: Headers = None,
        extra_headers: Headers = None,
        encoding: str = "PCMU",
        rate: int = 8000,
    ) -> None:
        if (encoding, rate) not in {("PCMU", 8000), ("L16", 8000), ("L16", 16000)}:
            raise ValueError(f"unsupported Telnyx media format {encoding}/{rate}")
        self.encoding, self.rate = encoding, rate
        self.codec = "mulaw" if encoding == "PCMU" else ">i2"  # L16 in network byte order
        super().__init__(url, custom_parameters, extra_headers)
        self.stream_id, self.call_session_id, self.user_id = (str(uuid.uuid4()) for _ in "abc")
        self.call_control_id = "v3:" + secrets.token_urlsafe(40)

    def _hello(self) -> list[Message]:
        start = {
            "user_id": self.user_id,
            "call_control_id": self.call_control_id,
            "call_session_id": self.call_session_id,
            "from": "+13125550100",
            "to": "+13125550199",
            "custom_parameters": self.custom_parameters,
            "media_format": {"encoding": self.encoding, "sample_rate": self.rate, "channels": 1},
        }
        return [{"event": "connected", "version": "1.0.0"}, self._msg("start", start=start)]

    def _dtmf(self, digit: str) -> Message:
        at = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        return self._msg("dtmf", occurred_at=at, dtmf={"digit": digit})

    def _stop(self) -> Message:
        stop = {"user_id": self.user_id, "call_control_id": self.call_control_id}
        return self._msg("stop", stop=stop)


class SimulatedVonageCall(_Call):
    """A Vonage NCCO `connect` to a websocket endpoint: L16 little-endian binary frames at
    16 or 8 kHz both ways; the NCCO `headers` come back in `websocket:connected`."""

    platform = "vonage"
    codec = "<i2"
    max_buffer_frames = 3072  # "Vonage will only buffer 3072 messages" (~60 s)
    notify_on_clear = False  # the docs do not say a clear sends pending notifies back

    def __init__(
        self,
        url: str,
        headers: dict[str, Any] | None = None,
        extra_headers: Headers = None,
        rate: int = 16000,
    ) -> None:
        if rate not in (8000, 16000):
            raise ValueError(f"Vonage L16 runs at 8000 or 16000 Hz, got {rate}")
        self.rate = rate
        super().__init__(url, extra_headers)
        self.headers = dict(headers or {})

    def _hello(self) -> list[Message]:
        content = f"audio/l16;rate={self.rate}"
        return [{"event": "websocket:connected", "content-type": content, **self.headers}]

    def _media(self, payload: bytes) -> bytes:
        return payload

    def _dtmf(self, digit: str) -> Message:
        return {"event": "websocket:dtmf", "digit": digit, "duration": 260}

    def _stop(self) -> None:
        return None  # Vonage ends the call by closing the socket

    def _mark_echo(self, name: str, by: str) -> Message | None:
        if by == "clear" and not self.notify_on_clear:
            return None
        return {"event": "websocket:notify", "payload": json.loads(name)}

    def _cleared(self) -> Message:
        return {"event": "websocket:cleared"}

    async def send_bad_base64(self) -> None:
        await self.send_raw("{not json")  # Vonage has no base64: a broken control message

    async def send_unknown_event(self) -> None:
        await self.send_raw(json.dumps({"event": "websocket:bogus"}))

    def _parse(self, message: str | bytes, now: float) -> object:
        if isinstance(message, bytes):
            n, frame = len(message), self.playout.n * 2
            if n % 2 or not n:
                return self._violate("frame-size", f"{n}-byte frame (L16: whole samples)", now)
            if n != frame:
                self._violate("frame-size", f"{n}-byte frame, expected {frame} (20 ms)", now)
            return self._decode(message)
        try:
            msg = json.loads(message)
        except ValueError:
            return self._violate("json", f"not JSON: {message[:80]!r}", now)
        action = msg.get("action") if isinstance(msg, dict) else None
        if action == "clear":
            return CLEAR
        if action != "notify":
            return self._violate("unknown-event", f"action {action!r} in {message[:80]}", now)
        if not isinstance(msg.get("payload"), dict):
            return self._violate("schema", "notify needs a payload object", now)
        return json.dumps(msg["payload"], sort_keys=True)
