"""Client messages: parse JSON text into typed commands, with stable error codes.

Nothing here does I/O; a `ProtocolError` carries the code the client sees.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ..audio.format import (
    CODEC_RATES,
    CODECS,
    DEFAULT_OPUS_BITRATE,
    DEFAULT_RATES,
    PCM16_RATES,
)
from .errors import ErrorCode, ProtocolError
from .json_text import parse_json

LANGUAGES = ("auto", "en", "zh", "ja", "ko", "yue", "de", "fr", "es", "it", "ru")
INPUT_RATES = (0, *PCM16_RATES)  # 0: no microphone


# Settings whose default is the model's, as its files state it (a voice knows how its
# tokens are best drawn); `Sampling`'s values are CosyVoice2's.
MODEL_DEFAULTS = ("sampling.temperature", "sampling.top_k", "sampling.top_p")


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 25
    top_p: float = 0.8
    seed: int = 0


@dataclass(frozen=True)
class Format:
    codec: str = "opus"
    sample_rate: int = DEFAULT_RATES["opus"]
    bitrate: int = DEFAULT_OPUS_BITRATE
    # How frames travel on a WebSocket: with our header, bare, or as Twilio messages
    # that a bot keeping its own media stream forwards as they are (docs/telephony.md).
    framing: str = "header"
    stream_sid: str = ""  # the Twilio streamSid written into `twilio` framing


@dataclass(frozen=True)
class Input:
    """Microphone audio the client streams up as binary PCM16 mono messages."""

    sample_rate: int = 0  # 0: no microphone on WebSocket; binary messages are refused
    vad_aggressiveness: int = 2
    # Voice activity: onset after this much voiced audio (short: barge-in is felt as
    # latency), offset after this much silence.
    min_speech_ms: int = 60
    hangover_ms: int = 300


@dataclass(frozen=True)
class BargeIn:
    mode: str = "off"  # off | cancel (speech onset cancels the live turns) | duck
    guard_ms: int = 300  # no barge-in this early in a turn's playback (echo of its start)
    duck_gain: float = 0.25  # duck: output gain while the person speaks


@dataclass(frozen=True)
class Playback:
    """The listener's playout reports (`playback` messages), like Twilio's echoed marks."""

    reports: bool = False  # True: a cancel waits for the listener to say what it played
    timeout_ms: int = 500  # ... at most this long, then the server's estimate is used


@dataclass(frozen=True)
class Settings:
    """What a session keeps between turns."""

    voice: str = ""
    language: str = "auto"
    speed: float = 1.0
    chunking: str = "fast"
    sampling: Sampling = field(default_factory=Sampling)
    format: Format = field(default_factory=Format)
    input: Input = field(default_factory=Input)
    barge_in: BargeIn = field(default_factory=BargeIn)
    playback: Playback = field(default_factory=Playback)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Setting:
    """One session setting, described once: validation, `session.created` and the table
    in docs/protocol.md all come from SETTINGS."""

    key: str  # dotted: "format.codec"
    kind: type  # str, int, float or bool
    doc: str
    choices: tuple[Any, ...] = ()
    lo: float | None = None
    hi: float | None = None

    @property
    def default(self) -> Any:
        value: Any = Settings()
        for part in self.key.split("."):
            value = getattr(value, part)
        return value

    def check(self, value: Any) -> Any:
        name = f"'{self.key}'"
        if self.kind is bool:
            if not isinstance(value, bool):
                raise _invalid(f"{name} must be true or false")
        elif self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _invalid(f"{name} must be an integer (got {json.dumps(value)[:32]})")
        elif self.kind is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _invalid(f"{name} must be a number")
            try:
                value = float(value)
            except OverflowError:  # an integer past 1e308: out of any range
                value = math.inf if value > 0 else -math.inf
        elif not isinstance(value, str):
            raise _invalid(f"{name} must be a string")
        if self.choices and value not in self.choices:
            raise _invalid(f"{name} must be one of {', '.join(map(str, self.choices))}")
        if self.lo is not None and self.hi is not None and not self.lo <= value <= self.hi:
            raise _invalid(f"{name} must be between {_num(self.lo)} and {_num(self.hi)}")
        return value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


SETTINGS: tuple[Setting, ...] = (
    Setting("voice", str, "voice (role) of turns that open from now on"),
    Setting("language", str, "text normalization before tokenizing (see below)", LANGUAGES),
    Setting("speed", float, "speaking rate; 2.0 is twice as fast", lo=0.5, hi=2.0),
    Setting(
        "chunking",
        str,
        "`fast`: the server's chunk schedule, small chunks first (the earliest first audio); "
        "`reference`: chunks on the model's 25-token grid, the audio its authors' streaming "
        "gives (a later first audio); see docs/cosyvoice2.md",
        ("fast", "reference"),
    ),
    Setting("sampling.temperature", float, "0 always picks the likeliest token", lo=0, hi=2),
    Setting("sampling.top_k", int, "0 turns top-k off", lo=0, hi=1000),
    Setting("sampling.top_p", float, "1.0 turns top-p off", lo=0.01, hi=1.0),
    Setting("sampling.seed", int, "same text and seed, same audio", lo=0, hi=2**31 - 1),
    Setting("format.codec", str, "codec of the binary audio frames", CODECS),
    Setting(
        "format.sample_rate",
        int,
        "opus: 48000; pcm16: any listed (its default 24000); mulaw, alaw: 8000. It follows "
        "the "
        "codec: see below",
        tuple(sorted({r for rates in CODEC_RATES.values() for r in rates})),
    ),
    Setting("format.bitrate", int, "bit/s, used only by Opus", lo=6000, hi=510000),
    Setting(
        "format.framing",
        str,
        "WebSocket only. `header`: binary frames with the header below; `raw`: binary, the "
        "payload alone; `twilio`: Twilio `media`/`mark`/`clear` text messages to forward to "
        "a Twilio media stream (mulaw only; docs/telephony.md)",
        ("header", "raw", "twilio"),
    ),
    Setting("format.stream_sid", str, "the Twilio streamSid that `twilio` framing writes"),
    Setting(
        "input.sample_rate", int, "microphone PCM16 rate; 0: no microphone (WebSocket)", INPUT_RATES
    ),
    Setting("input.vad_aggressiveness", int, "0 lenient … 3 strict", lo=0, hi=3),
    Setting("input.min_speech_ms", int, "voiced audio needed for `speech_started`", lo=20, hi=2000),
    Setting("input.hangover_ms", int, "silence needed for `speech_stopped`", lo=20, hi=5000),
    Setting(
        "barge_in.mode",
        str,
        "`off`: speech is only reported; `cancel`: its onset cancels the live turns; "
        "`duck`: its onset lowers the bot's volume until the speech stops",
        ("off", "cancel", "duck"),
    ),
    Setting(
        "barge_in.guard_ms",
        int,
        "no barge-in before the listener has heard this much of the turn (its own echo)",
        lo=0,
        hi=5000,
    ),
    Setting("barge_in.duck_gain", float, "output gain while ducked (0.25 is −12 dB)", lo=0, hi=1),
    Setting(
        "playback.reports",
        bool,
        "the client sends `playback` reports; a cancel sends `audio.clear` and waits for the "
        "client's final one",
    ),
    Setting("playback.timeout_ms", int, "longest wait for that report", lo=0, hi=5000),
)
SETTING = {s.key: s for s in SETTINGS}


# -- commands ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StartSession:
    changes: dict[str, Any]


@dataclass(frozen=True)
class UpdateSession:
    changes: dict[str, Any]


@dataclass(frozen=True)
class TextDelta:
    text: str
    turn_id: str | None
    voice: str | None
    kind: Literal["delta", "flush", "end", "speak"]  # speak = a whole turn's text


@dataclass(frozen=True)
class Cancel:
    turn_id: str | None


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class PlaybackReport:
    """The listener has played `played_ms` of a turn's audio; `stopped`: and no more (its
    answer to `audio.clear`)."""

    turn_id: str
    played_ms: int
    stopped: bool


Command = StartSession | UpdateSession | TextDelta | Cancel | Ping | PlaybackReport


def _invalid(msg: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_PARAMETER, msg)


def _str(
    obj: dict[str, Any], key: str, *, required: bool = False, max_len: int = 128
) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"'{key}' is required")
        return None
    if not isinstance(value, str):
        raise _invalid(f"'{key}' must be a string")
    if len(value) > max_len:
        raise _invalid(f"'{key}' is longer than {max_len} characters")
    return value


_TEXT_KINDS: dict[str, Literal["delta", "flush", "end", "speak"]] = {
    "text.delta": "delta",
    "text.flush": "flush",
    "text.end": "end",
    "speak": "speak",
}
_WITH_TEXT = ("text.delta", "speak")


def parse(data: str) -> Command:
    try:
        obj = parse_json(data)
    except ValueError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"message is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "message must be a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "message needs a string 'type'")
    if kind in ("session.start", "session.update"):
        changes = {k: v for k, v in obj.items() if k != "type"}
        return StartSession(changes) if kind == "session.start" else UpdateSession(changes)
    if kind in _TEXT_KINDS:
        # Text length is limited per turn by the session (text_too_long), not here.
        text = _str(obj, "text", required=True, max_len=2**31) if kind in _WITH_TEXT else ""
        assert text is not None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _invalid("'text' holds a lone surrogate (not valid Unicode)") from None
        return TextDelta(
            text=text,
            turn_id=_str(obj, "turn_id"),
            voice=_str(obj, "voice"),
            kind=_TEXT_KINDS[kind],
        )
    if kind == "cancel":
        return Cancel(turn_id=_str(obj, "turn_id"))
    if kind == "ping":
        return Ping()
    if kind == "playback":
        turn_id = _str(obj, "turn_id", required=True)
        assert turn_id is not None
        played = obj.get("played_ms")
        if isinstance(played, bool) or not isinstance(played, int) or not 0 <= played < 2**31:
            raise _invalid("'played_ms' must be an integer from 0")
        stopped = obj.get("stopped", False)
        if not isinstance(stopped, bool):
            raise _invalid("'stopped' must be true or false")
        return PlaybackReport(turn_id, played, stopped)
    raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type '{kind[:64]}'")


# -- settings validation ----------------------------------------------------------------


def apply_settings(current: Settings, changes: dict[str, Any], voices: set[str]) -> Settings:
    """Validate `changes` against `current`; raise ProtocolError, or return new settings.
    Nothing is applied unless everything is valid."""
    flat = flatten_settings(changes)
    values = {key: SETTING[key].check(value) for key, value in flat.items()}
    if "voice" in values:
        check_voice(values["voice"], voices)
    # The rate follows the codec unless given: a codec change alone takes its default.
    codec = values.get("format.codec", current.format.codec)
    if "format.sample_rate" not in values and codec != current.format.codec:
        values["format.sample_rate"] = DEFAULT_RATES[codec]
    rate = values.get("format.sample_rate", current.format.sample_rate)
    if rate not in CODEC_RATES[codec]:
        rates = ", ".join(map(str, CODEC_RATES[codec]))
        raise _invalid(f"'format.sample_rate' for {codec} must be one of {rates}")
    sid = values.get("format.stream_sid", current.format.stream_sid)
    if len(sid) > 64:
        raise _invalid("'format.stream_sid' is longer than 64 characters")
    if values.get("format.framing", current.format.framing) == "twilio" and (
        codec != "mulaw" or not sid
    ):
        raise _invalid("'twilio' framing needs format.codec mulaw and format.stream_sid")
    groups: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in values.items():
        group, _, name = key.partition(".")
        if name:
            groups.setdefault(group, {})[name] = value
        else:
            top[key] = value
    for group, fields in groups.items():
        top[group] = replace(getattr(current, group), **fields)
    return replace(current, **top)


def setting_value(settings: Settings, key: str) -> Any:
    """The value of a flat key ("speed", "sampling.seed") in `settings`."""
    group, _, name = key.partition(".")
    return getattr(getattr(settings, group), name) if name else getattr(settings, key)


def flatten_settings(changes: dict[str, Any]) -> dict[str, Any]:
    """{"format": {"codec": x}} -> {"format.codec": x}, refusing unknown keys."""
    groups = {key.partition(".")[0] for key in SETTING if "." in key}
    unknown = [k for k in changes if k not in SETTING and k not in groups]
    if unknown:
        raise _invalid(f"unknown setting(s): {', '.join(sorted(unknown))}")
    flat: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in groups:
            flat[key] = value
            continue
        if not isinstance(value, dict):
            raise _invalid(f"'{key}' must be an object")
        bad = [k for k in value if f"{key}.{k}" not in SETTING]
        if bad:
            raise _invalid(f"unknown key(s) in '{key}': {', '.join(sorted(map(str, bad)))}")
        flat.update({f"{key}.{k}": v for k, v in value.items()})
    return flat


def check_voice(voice: str, voices: set[str]) -> None:
    if voice not in voices:
        raise ProtocolError(
            ErrorCode.UNKNOWN_VOICE,
            f"unknown voice '{voice[:64]}'; available: {', '.join(sorted(voices))}",
        )


def settings_table() -> str:
    """The settings table of docs/protocol.md, from SETTINGS (a test keeps them equal)."""
    rows = ["| key | type | allowed | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        if s.key == "voice":
            allowed = "a name in `voices`"
        elif s.choices:
            allowed = ", ".join(f"`{json.dumps(c)}`" for c in s.choices)
        elif s.lo is not None and s.hi is not None:
            allowed = f"{_num(s.lo)} to {_num(s.hi)}"
        else:
            allowed = "true, false" if s.kind is bool else "any"
        default = f"`{json.dumps(s.default)}`"
        if s.key == "voice":
            default = "the model's first voice"
        elif s.key in MODEL_DEFAULTS:
            default = f"the model's ({default} for CosyVoice2)"
        kind = {str: "string", int: "integer", float: "number", bool: "boolean"}[s.kind]
        rows.append(f"| `{s.key}` | {kind} | {allowed} | {default} | {s.doc} |")
    return "\n".join(rows) + "\n"
