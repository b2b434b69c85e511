"""Asterisk chan_websocket text messages, sans I/O (checked against channels/chan_websocket.c).

Media is binary: each message Asterisk sends is one channel frame (20 ms, e.g. 160 bytes
of ulaw); what we send is cut into `optimal_frame_size` frames, queued, and played one
per ptime on Asterisk's timer. Control is text, in one of two formats chosen by
chan_websocket.conf `control_message_format` or the dial option f(plain-text|json):

    plain-text  MEDIA_START connection_id:c1 channel:WebSocket/c1/0x5 channel_id:17.3 ...
    json        {"event":"MEDIA_START","connection_id":"c1","channel":...}

Commands we send: plain-text "NAME [correlation id]", JSON {"command": NAME, ...}. Asterisk
ignores text messages over 128 bytes and unknown commands. Queue: MEDIA_XOFF when it
reaches 900 frames, MEDIA_XON when below 800 again, and media arriving at 1000 frames is
dropped whole. A hangup is a WebSocket close (no event); HANGUP from us ends the call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

SUBPROTOCOL = "media"  # websocket_client.conf `protocols = media`; Asterisk's own /media/ server
QUEUE_LENGTH_MAX = 1000  # frames; media arriving when the queue is this long is dropped
XOFF_LEVEL = 900
XON_LEVEL = 800
MAX_COMMAND_BYTES = 128  # longer text messages are ignored
# Asterisk reads a whole frame into 65535 bytes; our (unmasked) frames have a 4-byte header.
MAX_MEDIA_MESSAGE_BYTES = 65535 - 4


class ControlFormat(StrEnum):
    PLAIN = "plain-text"
    JSON = "json"


# Commands we may send.
ANSWER = "ANSWER"
HANGUP = "HANGUP"
START_MEDIA_BUFFERING = "START_MEDIA_BUFFERING"
STOP_MEDIA_BUFFERING = "STOP_MEDIA_BUFFERING"  # [correlation id] -> MEDIA_BUFFERING_COMPLETED
MARK_MEDIA = "MARK_MEDIA"  # [correlation id] -> MEDIA_MARK_PROCESSED when played up to it
FLUSH_MEDIA = "FLUSH_MEDIA"
GET_STATUS = "GET_STATUS"
REPORT_QUEUE_DRAINED = "REPORT_QUEUE_DRAINED"
PAUSE_MEDIA = "PAUSE_MEDIA"
CONTINUE_MEDIA = "CONTINUE_MEDIA"
SET_MEDIA_DIRECTION = "SET_MEDIA_DIRECTION"  # JSON only: {"direction": both|in|out}
COMMANDS = frozenset(
    {
        ANSWER,
        HANGUP,
        START_MEDIA_BUFFERING,
        STOP_MEDIA_BUFFERING,
        MARK_MEDIA,
        FLUSH_MEDIA,
        GET_STATUS,
        REPORT_QUEUE_DRAINED,
        PAUSE_MEDIA,
        CONTINUE_MEDIA,
        SET_MEDIA_DIRECTION,
    }
)


@dataclass(frozen=True)
class MediaFormat:
    name: str  # Asterisk's format name, as in MEDIA_START and c(...)
    codec: str  # ours: "mulaw", "alaw", "pcm16" (little-endian), or Asterisk's name
    sample_rate: int
    optimal_frame_size: int  # bytes per 20 ms; 0 for passthrough codecs (no re-framing)

    @property
    def passthrough(self) -> bool:
        return self.optimal_frame_size == 0


def _slin(name: str, rate: int) -> MediaFormat:
    return MediaFormat(name, "pcm16", rate, rate // 50 * 2)


# optimal_frame_size = default_ms * minimum_bytes / minimum_ms (main/codec_builtin.c);
# codecs whose minimum_bytes <= 10 cannot be re-framed and are forced to passthrough.
MEDIA_FORMATS: dict[str, MediaFormat] = {
    f.name: f
    for f in (
        MediaFormat("ulaw", "mulaw", 8000, 160),
        MediaFormat("alaw", "alaw", 8000, 160),
        _slin("slin", 8000),
        _slin("slin12", 12000),
        _slin("slin16", 16000),
        _slin("slin24", 24000),
        _slin("slin32", 32000),
        _slin("slin44", 44100),
        _slin("slin48", 48000),
        _slin("slin96", 96000),
        _slin("slin192", 192000),
        MediaFormat("g722", "g722", 16000, 160),
        MediaFormat("opus", "opus", 48000, 0),
        MediaFormat("g729", "g729", 8000, 0),
        MediaFormat("speex", "speex", 8000, 0),
        MediaFormat("speex16", "speex", 16000, 0),
        MediaFormat("speex32", "speex", 32000, 0),
    )
}


def media_format(name: str) -> MediaFormat:
    try:
        return MEDIA_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown Asterisk media format {name!r}") from None


# -- events Asterisk sends ---------------------------------------------------------------


@dataclass(frozen=True)
class MediaStart:
    connection_id: str
    channel: str
    format: str
    optimal_frame_size: int
    ptime: int
    channel_id: str | None = None  # since 20.17 / 22.7 / 23.1
    channel_variables: dict[str, str] = field(default_factory=dict)  # JSON only

    @property
    def media(self) -> MediaFormat:
        return media_format(self.format)


@dataclass(frozen=True)
class DtmfEnd:
    digit: str
    channel_id: str | None = None


@dataclass(frozen=True)
class MediaXoff:
    channel_id: str | None = None


@dataclass(frozen=True)
class MediaXon:
    channel_id: str | None = None


@dataclass(frozen=True)
class QueueDrained:
    channel_id: str | None = None


@dataclass(frozen=True)
class MediaBufferingCompleted:
    correlation_id: str = ""
    channel_id: str | None = None


@dataclass(frozen=True)
class MediaMarkProcessed:
    correlation_id: str = ""
    channel_id: str | None = None


@dataclass(frozen=True)
class Status:
    queue_length: int
    xon_level: int
    xoff_level: int
    queue_full: bool
    bulk_media: bool
    media_paused: bool
    channel_id: str | None = None


@dataclass(frozen=True)
class Error:
    error_text: str
    channel_id: str | None = None


@dataclass(frozen=True)
class Unknown:
    name: str
    fields: dict[str, Any]


Event = (
    MediaStart
    | DtmfEnd
    | MediaXoff
    | MediaXon
    | QueueDrained
    | MediaBufferingCompleted
    | MediaMarkProcessed
    | Status
    | Error
    | Unknown
)

_NO_DATA: dict[str, type[MediaXoff | MediaXon | QueueDrained]] = {
    "MEDIA_XOFF": MediaXoff,
    "MEDIA_XON": MediaXon,
    "QUEUE_DRAINED": QueueDrained,
}
_WITH_ID: dict[str, type[MediaBufferingCompleted | MediaMarkProcessed]] = {
    "MEDIA_BUFFERING_COMPLETED": MediaBufferingCompleted,
    "MEDIA_MARK_PROCESSED": MediaMarkProcessed,
}


def _flag(value: Any) -> bool:
    return value is True or value == "true"


def _plain_fields(rest: str) -> dict[str, str]:
    """'k1:v1 k2:v2' -> dict. A value runs to the next ' key:' (error_text has spaces);
    the value is everything after the key's first colon (channel names may hold more)."""
    fields: dict[str, str] = {}
    key: str | None = None
    for token in rest.split(" "):
        name, colon, value = token.partition(":")
        if colon and name and (key != "error_text"):
            key = name
            fields[key] = value
        elif key is not None:
            fields[key] += " " + token
    return fields


def parse_event(text: str) -> Event:
    """One text message from Asterisk, in either format (JSON if it starts with '{').
    Raises ValueError (only) for a message that is not a valid event."""
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except RecursionError:
            raise ValueError("JSON event nested too deeply") from None
        if not isinstance(data, dict):
            raise ValueError("JSON event is not an object")
        name = str(data.pop("event", ""))
        fields: dict[str, Any] = data
    else:
        name, _, rest = text.partition(" ")
        if name in _WITH_ID:  # "NAME [correlation id]": positional, not key:value
            return _WITH_ID[name](rest)
        fields = _plain_fields(rest)
    return _event(name, fields)


def _int(value: Any) -> int:
    """An integer field, as plain-text (a string) or JSON (a number) gives it."""
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ValueError(f"not an integer: {json.dumps(value)[:32]}")
    try:
        return int(value)
    except OverflowError:  # float infinity
        raise ValueError(f"not an integer: {value}") from None


def _scalar(value: Any, what: str) -> str:
    if isinstance(value, dict | list):
        raise ValueError(f"'{what}' must be a string")
    return str(value)


def _variables(value: Any) -> dict[str, str]:
    if not value:
        return {}
    if not isinstance(value, dict):
        raise ValueError("'channel_variables' must be an object")
    return {str(k): _scalar(v, f"channel_variables.{k}") for k, v in value.items()}


def _event(name: str, f: dict[str, Any]) -> Event:
    cid = f.get("channel_id")
    cid = None if cid is None else _scalar(cid, "channel_id")
    try:
        if name == "MEDIA_START":
            return MediaStart(
                connection_id=_scalar(f["connection_id"], "connection_id"),
                channel=_scalar(f["channel"], "channel"),
                format=_scalar(f["format"], "format"),
                optimal_frame_size=_int(f["optimal_frame_size"]),
                ptime=_int(f["ptime"]),
                channel_id=cid,
                channel_variables=_variables(f.get("channel_variables")),
            )
        if name == "DTMF_END":
            return DtmfEnd(_scalar(f["digit"], "digit"), cid)
        if name in _NO_DATA:
            return _NO_DATA[name](cid)
        if name in _WITH_ID:
            return _WITH_ID[name](_scalar(f.get("correlation_id", ""), "correlation_id"), cid)
        if name == "STATUS":
            return Status(
                queue_length=_int(f["queue_length"]),
                xon_level=_int(f["xon_level"]),
                xoff_level=_int(f["xoff_level"]),
                queue_full=_flag(f["queue_full"]),
                bulk_media=_flag(f["bulk_media"]),
                media_paused=_flag(f["media_paused"]),
                channel_id=cid,
            )
        if name == "ERROR":
            return Error(_scalar(f.get("error_text", ""), "error_text"), cid)
    except KeyError as missing:
        raise ValueError(f"{name} without {missing}") from None
    return Unknown(name, f)


# -- writing events, as Asterisk does (the simulated peer's side) ------------------------


def _plain_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def encode_event(event: Event, fmt: ControlFormat | str = ControlFormat.PLAIN) -> str:
    """The text Asterisk would send for `event`: the same fields in the same order."""
    if isinstance(event, Unknown):
        raise ValueError("cannot encode an Unknown event")
    name, fields = _layout(event)
    if ControlFormat(fmt) is ControlFormat.JSON:
        if isinstance(event, DtmfEnd):  # JSON puts the channel id first, plain-text last
            fields = {"channel_id": event.channel_id, "digit": event.digit}
        obj = {"event": name, **{k: v for k, v in fields.items() if v is not None}}
        return json.dumps(obj, separators=(",", ":"))
    if isinstance(event, MediaBufferingCompleted | MediaMarkProcessed):
        return f"{name} {event.correlation_id}" if event.correlation_id else name
    plain = {k: v for k, v in fields.items() if v is not None and k != "channel_variables"}
    if isinstance(event, MediaXoff | MediaXon | QueueDrained):
        plain = {}  # plain-text no-data events carry nothing, not even the channel id
    return " ".join([name, *(f"{k}:{_plain_value(v)}" for k, v in plain.items())])


def _layout(event: Event) -> tuple[str, dict[str, Any]]:
    if isinstance(event, MediaStart):
        return "MEDIA_START", {
            "connection_id": event.connection_id,
            "channel": event.channel,
            "channel_id": event.channel_id,
            "format": event.format,
            "optimal_frame_size": event.optimal_frame_size,
            "ptime": event.ptime,
            "channel_variables": event.channel_variables,
        }
    if isinstance(event, DtmfEnd):
        return "DTMF_END", {"digit": event.digit, "channel_id": event.channel_id}
    if isinstance(event, Status):
        return "STATUS", {
            "channel_id": event.channel_id,
            "queue_length": event.queue_length,
            "xon_level": event.xon_level,
            "xoff_level": event.xoff_level,
            "queue_full": event.queue_full,
            "bulk_media": event.bulk_media,
            "media_paused": event.media_paused,
        }
    if isinstance(event, Error):
        return "ERROR", {"channel_id": event.channel_id, "error_text": event.error_text}
    if isinstance(event, MediaBufferingCompleted | MediaMarkProcessed):
        name = next(n for n, cls in _WITH_ID.items() if isinstance(event, cls))
        return name, {"channel_id": event.channel_id, "correlation_id": event.correlation_id}
    if isinstance(event, MediaXoff | MediaXon | QueueDrained):
        name = next(n for n, cls in _NO_DATA.items() if isinstance(event, cls))
        return name, {"channel_id": event.channel_id}
    raise TypeError(f"not an event: {event!r}")


# -- commands we send --------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    name: str
    correlation_id: str | None = None
    direction: str | None = None  # SET_MEDIA_DIRECTION (JSON only)


def command(
    name: str,
    fmt: ControlFormat | str = ControlFormat.PLAIN,
    correlation_id: str | None = None,
    direction: str | None = None,
) -> str:
    """One command in the connection's format, e.g. command(FLUSH_MEDIA) -> "FLUSH_MEDIA",
    command(MARK_MEDIA, "json", "m1") -> '{"command":"MARK_MEDIA","correlation_id":"m1"}'."""
    if name not in COMMANDS:
        raise ValueError(f"unknown chan_websocket command {name!r}")
    if ControlFormat(fmt) is ControlFormat.JSON:
        obj = {"command": name, "correlation_id": correlation_id, "direction": direction}
        text = json.dumps({k: v for k, v in obj.items() if v is not None}, separators=(",", ":"))
    else:
        if direction is not None:
            raise ValueError(f"{name} with a direction needs the JSON format")
        text = f"{name} {correlation_id}" if correlation_id else name
    if len(text.encode()) > MAX_COMMAND_BYTES:
        raise ValueError(f"command over {MAX_COMMAND_BYTES} bytes (Asterisk would ignore it)")
    return text


def parse_command(text: str, fmt: ControlFormat | str = ControlFormat.PLAIN) -> Command:
    """A command as Asterisk reads it: whitespace stripped, plain-text name up to the first
    space and the rest as the correlation id. Raises ValueError on bad JSON."""
    text = text.strip()
    if ControlFormat(fmt) is ControlFormat.JSON:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("JSON command is not an object")
        return Command(
            str(data.get("command", "")), data.get("correlation_id"), data.get("direction")
        )
    name, _, rest = text.partition(" ")
    return Command(name, rest or None)
