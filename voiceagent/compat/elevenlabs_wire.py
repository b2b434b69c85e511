"""ElevenLabs' wire, as this server reads and writes it: the `output_format` values it
makes and their encoding, the character alignment built from the turn's word timing, and
the parameters of a request (query string, `voice_settings`). The sockets and endpoints
that use them are in elevenlabs.py.

Alignment is approximate: a segment's span is exact (the model's 25 Hz token clock), its
words share it by length in characters (text/timing.py), and each word's characters (and
the space after it) share the word's time equally. The two clients read the times
differently, and this server follows each: with `sync_alignment=true` (LiveKit sends it)
the times count from the context's first sample; without it (Pipecat) each alignment's
times count from the start of the speech it covers, and consecutive alignments tile the
context's audio, so adding up their spans (Pipecat's running clock) gives the context's
timeline.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.responses import JSONResponse

from ..audio.codecs import alaw_encode, float_to_int16, mulaw_encode
from ..audio.containers import CONTENT_TYPES, make_stream_encoder
from ..audio.format import MODEL_RATE
from ..auth.gate import Principal
from ..protocol.errors import ErrorCode
from ..protocol.messages import LANGUAGES
from ..session.port import SessionHost
from ..text.timing import SpokenSegment
from .utterance import ApiError, Encoder, find_voice

DEFAULT_FORMAT = "mp3_44100_128"  # ElevenLabs' default when none is asked for
PCM_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
# Encoded formats: `mp3_RATE_KBPS`, `opus_48000_KBPS` (Ogg Opus), `wav_RATE` (16-bit).
ENCODED = re.compile(r"(mp3|opus)_(\d{4,5})_(\d{1,3})|(wav)_(\d{4,5})")

DEFAULT_INACTIVITY_S = 20  # ElevenLabs' default `inactivity_timeout`
MAX_INACTIVITY_S = 180
CHUNK_MS = 500  # the most audio in one message (an aiohttp line reader takes 128 KiB)


def invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_PARAMETER, message)


# -- output formats ---------------------------------------------------------------------


@dataclass(frozen=True)
class OutputFormat:
    """One of ElevenLabs' `output_format` values this server makes."""

    name: str  # as the client asked: pcm_16000, ulaw_8000, mp3_44100_128, ...
    # pcm (int16 little-endian), ulaw or alaw (G.711, one byte a sample): raw samples;
    # mp3, opus (Ogg) or wav: a stream encoder of audio/containers.py
    codec: str
    sample_rate: int
    bitrate: int | None = None  # bit/s, mp3 and opus

    @property
    def raw(self) -> bool:
        return self.codec in ("pcm", "ulaw", "alaw")

    @property
    def content_type(self) -> str:
        if not self.raw:
            return CONTENT_TYPES[self.codec]
        kind = {"pcm": "audio/pcm", "ulaw": "audio/basic", "alaw": "audio/x-alaw-basic"}
        return f"{kind[self.codec]};rate={self.sample_rate}"

    @property
    def utterance_rate(self) -> int:
        """The PCM rate to ask of the utterance (a stream encoder takes the model's rate
        and resamples itself)."""
        return self.sample_rate if self.raw else MODEL_RATE

    def encoder(self) -> Encoder:
        """A new encoder for one utterance."""
        if self.raw:
            return RawEncoder(self.codec)
        return make_stream_encoder(self.codec, self.sample_rate, self.bitrate)

    def chunk_samples(self) -> int:
        """The most PCM (at the utterance's rate) one message carries."""
        return self.utterance_rate * CHUNK_MS // 1000


class RawEncoder:
    """16-bit PCM, or G.711 μ-law or A-law: one sample in, one sample out."""

    def __init__(self, codec: str) -> None:
        self.codec = codec

    def encode(self, pcm: np.ndarray) -> bytes:
        pcm16 = float_to_int16(pcm)
        if self.codec == "ulaw":
            return mulaw_encode(pcm16).tobytes()
        if self.codec == "alaw":
            return alaw_encode(pcm16).tobytes()
        return pcm16.astype("<i2").tobytes()

    def finish(self) -> bytes:
        return b""


def parse_format(name: str) -> OutputFormat:
    """Raises ApiError: `unsupported_format` for a format of ElevenLabs' this server does
    not make (yet), `invalid_parameter` for anything else unknown."""
    codec, _, rate = name.partition("_")
    if codec == "pcm" and rate.isdigit() and int(rate) in PCM_RATES:
        return OutputFormat(name, "pcm", int(rate))
    if name in ("ulaw_8000", "alaw_8000"):
        return OutputFormat(name, codec, 8000)
    supported = ", ".join(
        [*(f"pcm_{r}" for r in PCM_RATES), "ulaw_8000", "alaw_8000", "mp3_RATE_KBPS",
         "opus_48000_KBPS", "wav_RATE"]
    )  # fmt: skip
    encoded = ENCODED.fullmatch(name)
    if encoded is None:
        raise invalid(f"unknown output_format {name[:40]!r}; use one of {supported}")
    kind = encoded.group(1) or encoded.group(4)
    hz = int(encoded.group(2) or encoded.group(5))
    kbps = encoded.group(3)
    try:  # the encoder says what it cannot make (a rate, a bitrate)
        fmt = OutputFormat(name, kind, hz, int(kbps) * 1000 if kbps else None)
        fmt.encoder()
    except ValueError as exc:
        raise ApiError(ErrorCode.UNSUPPORTED_FORMAT, f"output_format {name}: {exc}") from None
    return fmt


# -- alignment --------------------------------------------------------------------------


def char_times(segment: SpokenSegment) -> tuple[list[str], list[int]]:
    """The segment's characters, as ElevenLabs aligns them (its words, one space after
    each word that has one and after the last), and their N+1 boundaries in whole ms on
    the turn's timeline: character i spans [bounds[i], bounds[i+1]]. The first boundary
    is the segment's start and the last its end, so consecutive segments tile."""
    start, end = round(segment.start_ms), round(segment.end_ms)
    text = segment.text
    chars: list[str] = []
    bounds: list[int] = []
    at = 0
    words = segment.words
    for i, word in enumerate(words):
        pos = text.find(word.word, at)
        at = (pos if pos >= 0 else at) + len(word.word)
        spaced = i == len(words) - 1 or (at < len(text) and text[at].isspace())
        these = [*word.word, " "] if spaced else list(word.word)
        span = word.end_ms - word.start_ms
        for k, ch in enumerate(these):
            chars.append(ch)
            bounds.append(round(word.start_ms + span * k / len(these)))
    bounds.append(end)
    if bounds:
        bounds[0] = start
    for i in range(1, len(bounds)):  # rounding must not step back, nor pass the end
        bounds[i] = min(max(bounds[i], bounds[i - 1]), end)
    return chars, bounds


@dataclass
class Alignment:
    """Characters whose timing is known but not yet sent, and their boundaries (ms)."""

    chars: list[str] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)

    def add(self, segment: SpokenSegment) -> None:
        chars, bounds = char_times(segment)
        if not chars:
            return
        if self.bounds and bounds[0] == self.bounds[-1]:
            bounds = bounds[1:]
        else:  # the first pending segment (or one that does not follow on: keep its own)
            self.bounds = self.bounds[:-1] if self.bounds else []
        self.chars += chars
        self.bounds += bounds

    def take(self, relative: bool) -> dict[str, list[Any]] | None:
        """The pending characters as ElevenLabs' WebSocket alignment (times in ms from
        the context's start, or from the first pending character's start), or None."""
        if not self.chars:
            return None
        off = self.bounds[0] if relative else 0
        b = self.bounds
        aligned: dict[str, list[Any]] = {
            "chars": self.chars,
            "charStartTimesMs": [t - off for t in b[:-1]],
            "charDurationsMs": [b[i + 1] - b[i] for i in range(len(b) - 1)],
        }
        self.chars, self.bounds = [], []
        return aligned

    def take_seconds(self) -> dict[str, list[Any]] | None:
        """The HTTP with-timestamps shape: seconds from the request's first sample."""
        if not self.chars:
            return None
        b = self.bounds
        aligned: dict[str, list[Any]] = {
            "characters": self.chars,
            "character_start_times_seconds": [t / 1000 for t in b[:-1]],
            "character_end_times_seconds": [t / 1000 for t in b[1:]],
        }
        self.chars, self.bounds = [], []
        return aligned


# -- request parameters -----------------------------------------------------------------


def flag_of(query: Mapping[str, str], name: str, default: bool) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise invalid(f"{name} must be true or false")


def seed_of(value: Any) -> int:
    if value is None or value == "":
        return 0
    try:
        seed = int(value)
    except (TypeError, ValueError):
        raise invalid("seed must be an integer from 0 to 4294967295") from None
    if isinstance(value, bool | float) or not 0 <= seed <= 2**32 - 1:
        raise invalid("seed must be an integer from 0 to 4294967295")
    return seed


def language_of(code: Any) -> str:
    """ElevenLabs' language_code picks our text normalization where we have one for it;
    other languages are spoken with automatic normalization."""
    if code is None or code == "":
        return "auto"
    if not isinstance(code, str):
        raise invalid("language_code must be a string")
    base = code.split("-")[0].lower()
    return base if base in LANGUAGES else "auto"


def speed_set(voice_settings: Any) -> bool:
    return isinstance(voice_settings, dict) and voice_settings.get("speed") is not None


def given_of(**set_: bool) -> frozenset[str]:
    """The settings a request set itself (a role's defaults fill in the rest)."""
    return frozenset(name for name, is_set in set_.items() if is_set)


def speed_of(voice_settings: Any) -> float:
    """`voice_settings.speed`; the other settings (stability, similarity_boost, style,
    use_speaker_boost) have no counterpart here and are ignored."""
    if voice_settings is None:
        return 1.0
    if not isinstance(voice_settings, dict):
        raise invalid("voice_settings must be an object")
    speed = voice_settings.get("speed")
    if speed is None:
        return 1.0
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise invalid("voice_settings.speed must be a number")
    if not 0.5 <= speed <= 2.0:
        raise invalid(f"voice_settings.speed {speed} is outside what this server supports: 0.5-2")
    return float(speed)


@dataclass(frozen=True)
class StreamParams:
    """A socket's query string. model_id, enable_logging, enable_ssml_parsing,
    apply_text_normalization, apply_language_text_normalization and
    optimize_streaming_latency are accepted and ignored (one model; text is always
    normalized for the language)."""

    voice: str
    format: OutputFormat
    language: str = "auto"
    seed: int = 0
    inactivity_s: float = DEFAULT_INACTIVITY_S
    sync_alignment: bool = False
    auto_mode: bool = False
    given: frozenset[str] = frozenset()  # of language and seed (for a role's defaults)

    @classmethod
    def parse(
        cls, host: SessionHost, principal: Principal, voice: str, query: Mapping[str, str]
    ) -> StreamParams:
        find_voice(host, principal, voice)  # unknown: refused before the upgrade
        fmt = parse_format(query.get("output_format") or DEFAULT_FORMAT)
        timeout = query.get("inactivity_timeout")
        inactivity = float(DEFAULT_INACTIVITY_S)
        if timeout:
            try:
                inactivity = float(timeout)
            except ValueError:
                raise invalid("inactivity_timeout must be a number of seconds") from None
            if not 0 < inactivity <= MAX_INACTIVITY_S:
                raise invalid(f"inactivity_timeout must be within 0 and {MAX_INACTIVITY_S}")
        return cls(
            voice,
            fmt,
            language_of(query.get("language_code")),
            seed_of(query.get("seed")),
            inactivity,
            flag_of(query, "sync_alignment", False),
            flag_of(query, "auto_mode", False),
            given_of(language="language_code" in query, seed="seed" in query),
        )


def http_error(error: ApiError) -> JSONResponse:
    """ElevenLabs' error body (`detail.status`, `detail.message`, which its SDK reads)
    with our stable code beside it."""
    body = {"detail": {"status": str(error.code), "message": error.message}, **error.body()}
    headers = {"Retry-After": "2"} if error.status in (429, 503) else None
    return JSONResponse(body, status_code=error.status, headers=headers)


def message_flag(msg: dict[str, Any], name: str) -> bool:
    """A boolean field of a socket message (absent or null: false)."""
    value = msg.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false")
    return value
