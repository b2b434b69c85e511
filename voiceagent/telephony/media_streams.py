"""Media-stream dialects without I/O: Twilio, Telnyx and Vonage WebSocket messages in,
carrier events out (events.py), and the messages voiceagent sends back.

Twilio and Telnyx share one JSON shape with different field names; Vonage sends audio
as raw binary frames and control as `websocket:*` JSON events. Wire facts: docs/telephony.md.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..audio.codecs import alaw_decode, mulaw_decode
from .events import (
    CallerAudio,
    CallInfo,
    CarrierError,
    CarrierEvent,
    Dtmf,
    Ignored,
    Invalid,
    MarkEchoed,
    Started,
    Stopped,
)

# Wire encodings -> our codec names.
_ENCODINGS = {
    "audio/x-mulaw": "mulaw",
    "pcmu": "mulaw",
    "pcma": "alaw",
    "l16": "pcm16",
    "audio/x-l16": "pcm16",
}
_DTMF = re.compile(r"^[0-9*#A-Da-d]\Z")
MAX_PARAMS = 64  # custom parameters kept per call (a carrier sends a handful)


def to_pcm16(codec: str, payload: bytes, big_endian: bool = False) -> bytes:
    """Caller audio as PCM16 little-endian, from the call's codec."""
    if codec == "mulaw":
        return mulaw_decode(payload).astype("<i2").tobytes()
    if codec == "alaw":
        return alaw_decode(payload).astype("<i2").tobytes()
    if len(payload) % 2:
        raise ValueError("L16 audio needs an even number of bytes")
    return swap16(payload) if big_endian else payload


def swap16(data: bytes) -> bytes:
    return np.frombuffer(data, dtype="<i2").astype(">i2").tobytes()


class Dialect(ABC):
    """One platform's messages. Holds what `start` said (ids, codec) for the replies."""

    carrier: str
    info: CallInfo | None = None

    @abstractmethod
    def parse_text(self, text: str) -> CarrierEvent: ...

    def parse_bytes(self, data: bytes) -> CarrierEvent:
        return Invalid(f"{self.carrier} sends no binary messages ({len(data)} bytes)")

    @abstractmethod
    def media(self, payload: bytes) -> str | bytes:
        """One frame of our audio (the call's codec, PCM16 little-endian) as a message."""

    @abstractmethod
    def mark(self, name: str) -> str | None:
        """A message the platform echoes once the audio before it has played (None: the
        platform has no such message)."""

    @abstractmethod
    def clear(self) -> str:
        """Drop the audio the platform still buffers."""


@dataclass(frozen=True)
class JsonFields:
    """Where Twilio and Telnyx put the same things."""

    carrier: str
    stream: str  # the stream id, on every message
    call: str  # the call id inside `start`
    params: str  # custom parameters inside `start`
    media_format: str
    rate: str
    stream_in_replies: bool  # outbound messages carry the stream id
    l16_big_endian: bool


TWILIO = JsonFields(
    "twilio", "streamSid", "callSid", "customParameters", "mediaFormat", "sampleRate", True, False
)
TELNYX = JsonFields(
    "telnyx",
    "stream_id",
    "call_control_id",
    "custom_parameters",
    "media_format",
    "sample_rate",
    False,
    True,  # L16 travels in network byte order, as in RTP
)


class JsonStream(Dialect):
    """Twilio Media Streams and Telnyx media streaming: JSON text messages with an
    `event` key, audio base64 inside `media`."""

    def __init__(self, fields: JsonFields) -> None:
        self.f = fields
        self.carrier = fields.carrier

    def parse_text(self, text: str) -> CarrierEvent:
        msg = _event_message(text)
        if isinstance(msg, Invalid):
            return msg
        event = msg["event"]
        if event == "start":
            return self._start(msg)
        if event == "connected":
            return Ignored(event)
        if event == "error":
            return CarrierError(_detail(msg.get("payload", msg.get("error"))))
        if self.info is None:
            return Invalid(f"'{event[:32]}' before 'start'")
        if event == "media":
            return self._media(msg)
        if event == "dtmf":
            digit = _get(msg, "dtmf", "digit")
            if not isinstance(digit, str) or not _DTMF.match(digit):
                return Invalid("dtmf without a valid 'digit'")
            return Dtmf(digit)
        if event == "mark":
            name = _get(msg, "mark", "name")
            return MarkEchoed(name) if isinstance(name, str) else Invalid("mark without a name")
        if event == "stop":
            return Stopped("stop")
        return Invalid(f"unknown event '{event[:32]}'")

    def _start(self, msg: dict[str, Any]) -> CarrierEvent:
        start = msg.get("start")
        if self.info is not None:
            # the stream's own start again: a bot that forwards Twilio's messages to a
            # session (twilio framing) sends it after the session knows the stream
            stream = msg.get(self.f.stream) or _get(msg, "start", self.f.stream)
            same = stream == self.info.stream_id
            return Ignored("start") if same else Invalid("a second 'start'")
        if not isinstance(start, dict):
            return Invalid("'start' without its 'start' object")
        fmt = start.get(self.f.media_format)
        stream = msg.get(self.f.stream) or start.get(self.f.stream)
        if not isinstance(fmt, dict) or not isinstance(stream, str) or not stream:
            return Invalid(f"'start' needs {self.f.stream} and {self.f.media_format}")
        codec = _ENCODINGS.get(str(fmt.get("encoding", "")).lower())
        try:
            rate = int(fmt.get(self.f.rate, 8000))
        except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON 1e400
            rate = 0
        if codec is None or rate not in ((8000,) if codec != "pcm16" else (8000, 16000)):
            return Invalid(f"unsupported media format {json.dumps(fmt)[:80]}")
        params = start.get(self.f.params) or {}
        if not isinstance(params, dict):
            return Invalid(f"'{self.f.params}' must be an object")
        call = start.get(self.f.call)
        self.info = CallInfo(
            self.carrier,
            call if isinstance(call, str) and call else stream,
            stream,
            codec,
            rate,
            _string_params(params),
        )
        return Started(self.info)

    def _media(self, msg: dict[str, Any]) -> CarrierEvent:
        assert self.info is not None
        payload = _get(msg, "media", "payload")
        track = _get(msg, "media", "track")
        if track not in (None, "inbound", "inbound_track"):
            return Ignored(f"{track} media")  # only the caller's side is ours to hear
        if not isinstance(payload, str):
            return Invalid("media without a 'payload'")
        try:
            raw = base64.b64decode(payload, validate=True)
            return CallerAudio(to_pcm16(self.info.codec, raw, self.f.l16_big_endian))
        except (binascii.Error, ValueError) as exc:
            return Invalid(f"media payload: {exc}")

    def _reply(self, event: str, **body: Any) -> str:
        msg: dict[str, Any] = {"event": event}
        if self.f.stream_in_replies and self.info is not None:
            msg[self.f.stream] = self.info.stream_id
        msg.update(body)
        return json.dumps(msg, separators=(",", ":"))

    def media(self, payload: bytes) -> str:
        assert self.info is not None
        if self.info.codec == "pcm16" and self.f.l16_big_endian:
            payload = swap16(payload)
        return self._reply("media", media={"payload": base64.b64encode(payload).decode()})

    def mark(self, name: str) -> str:
        return self._reply("mark", mark={"name": name})

    def clear(self) -> str:
        return self._reply("clear")


class VonageStream(Dialect):
    """Vonage Voice API WebSockets: a `websocket:connected` text message with the
    content type and the NCCO's headers, then binary L16 frames both ways."""

    carrier = "vonage"

    def parse_text(self, text: str) -> CarrierEvent:
        msg = _event_message(text)
        if isinstance(msg, Invalid):
            return msg
        event = msg["event"]
        if event == "websocket:connected":
            return self._start(msg)
        if self.info is None:
            return Invalid(f"'{event[:32]}' before 'websocket:connected'")
        if event == "websocket:dtmf":
            digit = msg.get("digit")
            if not isinstance(digit, str) or not _DTMF.match(digit):
                return Invalid("websocket:dtmf without a valid 'digit'")
            return Dtmf(digit)
        if event == "websocket:notify":
            name = _get(msg, "payload", "name")
            return MarkEchoed(name) if isinstance(name, str) else Ignored(event)
        if event == "websocket:error":
            return CarrierError(_detail({k: v for k, v in msg.items() if k != "event"}))
        if event == "websocket:cleared":
            return Ignored(event)
        return Invalid(f"unknown event '{event[:32]}'")

    def _start(self, msg: dict[str, Any]) -> CarrierEvent:
        if self.info is not None:
            return Invalid("a second 'websocket:connected'")
        ctype = str(msg.get("content-type", ""))
        found = re.fullmatch(r"audio/l16;\s*rate=(8000|16000)", ctype.strip().lower())
        if found is None:
            return Invalid(f"unsupported content-type '{ctype[:64]}'")
        headers = {k: v for k, v in msg.items() if k not in ("event", "content-type")}
        params = _string_params(headers)
        call = params.get("call_id") or params.get("uuid") or uuid.uuid4().hex
        self.info = CallInfo(self.carrier, call, call, "pcm16", int(found.group(1)), params)
        return Started(self.info)

    def parse_bytes(self, data: bytes) -> CarrierEvent:
        if self.info is None:
            return Invalid("audio before 'websocket:connected'")
        if len(data) % 2:
            return Invalid("L16 audio needs an even number of bytes")
        return CallerAudio(data)

    def media(self, payload: bytes) -> bytes:
        return payload  # one 20 ms L16 frame per binary message

    def mark(self, name: str) -> str:
        return json.dumps({"action": "notify", "payload": {"name": name}}, separators=(",", ":"))

    def clear(self) -> str:
        return json.dumps({"action": "clear"}, separators=(",", ":"))


DIALECTS: dict[str, Callable[[], Dialect]] = {
    "twilio": lambda: JsonStream(TWILIO),
    "telnyx": lambda: JsonStream(TELNYX),
    "vonage": VonageStream,
}


def _event_message(text: str) -> dict[str, Any] | Invalid:
    """A JSON object with a string `event`, as both dialects' text messages are."""
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        return Invalid(f"not JSON: {exc}")
    if not isinstance(msg, dict) or not isinstance(msg.get("event"), str):
        return Invalid("a message needs a string 'event'")
    return msg


def _get(msg: dict[str, Any], outer: str, key: str) -> Any:
    inner = msg.get(outer)
    return inner.get(key) if isinstance(inner, dict) else None


def _string_params(params: dict[Any, Any]) -> dict[str, str]:
    """Carriers pass parameters as strings; keep a bounded number of short ones."""
    out: dict[str, str] = {}
    for key, value in list(params.items())[:MAX_PARAMS]:
        if isinstance(key, str) and isinstance(value, str | int | float | bool):
            out[key[:64]] = str(value)[:512]
    return out


def _detail(what: object) -> str:
    """A carrier's error, short enough for a log line and an event (its own words)."""
    return json.dumps(what, default=str)[:300] if what is not None else "no detail"
