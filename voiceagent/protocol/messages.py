"""Client messages: parse JSON text into typed commands, with stable error codes.

Nothing here does I/O; a `ProtocolError` carries the code the client sees.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .errors import ErrorCode, ProtocolError

LANGUAGES = ("auto", "en", "zh", "ja", "ko", "yue", "de", "fr", "es", "it", "ru")
CODEC_RATES = {"opus": (48000,), "pcm16": (8000, 16000, 24000, 48000), "mulaw": (8000,)}
DEFAULT_RATES = {"opus": 48000, "pcm16": 24000, "mulaw": 8000}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 25
    top_p: float = 0.8
    seed: int = 0


@dataclass(frozen=True)
class Format:
    codec: str = "opus"
    sample_rate: int = 48000
    bitrate: int = 32000


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
class Settings:
    """What a session keeps between turns."""

    voice: str = ""
    language: str = "auto"
    speed: float = 1.0
    sampling: Sampling = field(default_factory=Sampling)
    format: Format = field(default_factory=Format)
    input: Input = field(default_factory=Input)
    barge_in: BargeIn = field(default_factory=BargeIn)

    def to_dict(self) -> dict[str, Any]:
        return {
            "voice": self.voice,
            "language": self.language,
            "speed": self.speed,
            "sampling": vars(self.sampling).copy(),
            "format": vars(self.format).copy(),
            "input": vars(self.input).copy(),
            "barge_in": vars(self.barge_in).copy(),
        }


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


Command = StartSession | UpdateSession | TextDelta | Cancel | Ping


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
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:  # ValueError: also over-long integers
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
    raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type '{kind[:64]}'")


# -- settings validation ----------------------------------------------------------------

_SETTING_KEYS = {"voice", "language", "speed", "sampling", "format", "input", "barge_in"}
INPUT_RATES = (0, 8000, 16000, 24000, 48000)


def _number(value: Any, name: str, lo: float, hi: float, integer: bool = False) -> Any:
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type:
        raise _invalid(f"'{name}' must be {'an integer' if integer else 'a number'}")
    if not lo <= value <= hi:
        raise _invalid(f"'{name}' must be between {lo} and {hi}")
    return value


def apply_settings(current: Settings, changes: dict[str, Any], voices: set[str]) -> Settings:
    """Validate `changes` against `current`; raise ProtocolError, or return new settings."""
    unknown = set(changes) - _SETTING_KEYS
    if unknown:
        raise _invalid(f"unknown setting(s): {', '.join(sorted(unknown))}")
    new = current
    if "voice" in changes:
        voice = changes["voice"]
        if not isinstance(voice, str):
            raise _invalid("'voice' must be a string")
        check_voice(voice, voices)
        new = replace(new, voice=voice)
    if "language" in changes:
        if changes["language"] not in LANGUAGES:
            raise _invalid(f"'language' must be one of {', '.join(LANGUAGES)}")
        new = replace(new, language=changes["language"])
    if "speed" in changes:
        new = replace(new, speed=float(_number(changes["speed"], "speed", 0.5, 2.0)))
    if "sampling" in changes:
        s = _object(changes["sampling"], "sampling", {"temperature", "top_k", "top_p", "seed"})
        sampling = new.sampling
        if "temperature" in s:
            t = float(_number(s["temperature"], "sampling.temperature", 0.0, 2.0))
            sampling = replace(sampling, temperature=t)
        if "top_k" in s:
            sampling = replace(sampling, top_k=_number(s["top_k"], "sampling.top_k", 0, 1000, True))
        if "top_p" in s:
            top_p = float(_number(s["top_p"], "sampling.top_p", 0.01, 1.0))
            sampling = replace(sampling, top_p=top_p)
        if "seed" in s:
            sampling = replace(
                sampling, seed=_number(s["seed"], "sampling.seed", 0, 2**31 - 1, True)
            )
        new = replace(new, sampling=sampling)
    if "format" in changes:
        f = _object(changes["format"], "format", {"codec", "sample_rate", "bitrate"})
        codec = f.get("codec", new.format.codec)
        if not isinstance(codec, str) or codec not in CODEC_RATES:
            raise _invalid(f"'format.codec' must be one of {', '.join(CODEC_RATES)}")
        default_rate = new.format.sample_rate if codec == new.format.codec else DEFAULT_RATES[codec]
        rate = f.get("sample_rate", default_rate)
        if isinstance(rate, bool) or not isinstance(rate, int) or rate not in CODEC_RATES[codec]:
            rates = ", ".join(map(str, CODEC_RATES[codec]))
            raise _invalid(f"'format.sample_rate' for {codec} must be one of {rates}")
        bitrate = _number(
            f.get("bitrate", new.format.bitrate), "format.bitrate", 6000, 510000, True
        )
        new = replace(new, format=Format(codec, rate, bitrate))
    if "input" in changes:
        i = _object(
            changes["input"],
            "input",
            {"sample_rate", "vad_aggressiveness", "min_speech_ms", "hangover_ms"},
        )
        rate = i.get("sample_rate", new.input.sample_rate)
        if isinstance(rate, bool) or rate not in INPUT_RATES:
            raise _invalid(f"'input.sample_rate' must be one of {', '.join(map(str, INPUT_RATES))}")
        aggr = _number(
            i.get("vad_aggressiveness", new.input.vad_aggressiveness),
            "input.vad_aggressiveness",
            0,
            3,
            True,
        )
        onset = _number(
            i.get("min_speech_ms", new.input.min_speech_ms), "input.min_speech_ms", 20, 2000, True
        )
        hangover = _number(
            i.get("hangover_ms", new.input.hangover_ms), "input.hangover_ms", 20, 5000, True
        )
        new = replace(new, input=Input(rate, aggr, onset, hangover))
    if "barge_in" in changes:
        b = _object(changes["barge_in"], "barge_in", {"mode", "guard_ms", "duck_gain"})
        mode = b.get("mode", new.barge_in.mode)
        if mode not in ("off", "cancel", "duck"):
            raise _invalid("'barge_in.mode' must be off, cancel or duck")
        guard = _number(
            b.get("guard_ms", new.barge_in.guard_ms), "barge_in.guard_ms", 0, 5000, True
        )
        gain = _number(b.get("duck_gain", new.barge_in.duck_gain), "barge_in.duck_gain", 0, 1)
        new = replace(new, barge_in=BargeIn(mode, guard, float(gain)))
    return new


def check_voice(voice: str, voices: set[str]) -> None:
    if voice not in voices:
        raise ProtocolError(
            ErrorCode.UNKNOWN_VOICE,
            f"unknown voice '{voice[:64]}'; available: {', '.join(sorted(voices))}",
        )


def _object(value: Any, name: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(f"'{name}' must be an object")
    unknown = set(value) - keys
    if unknown:
        raise _invalid(f"unknown key(s) in '{name}': {', '.join(sorted(unknown))}")
    return value
