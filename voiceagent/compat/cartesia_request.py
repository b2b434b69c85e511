"""Cartesia's request body, checked, and its output formats: what `/tts/websocket` and
`/tts/bytes` share (cartesia.py serves them; docs/compat.md, "Cartesia", lists the fields).

A request names a Cartesia model (`sonic-3`, ...), a voice (`{"mode": "id", "id": ...}`
or the id alone), an output format (`{container, encoding, sample_rate}`), and optional
controls. Fields that change nothing here (phoneme timestamps, pronunciation dictionaries,
emotion, ...) are accepted and ignored, so a client that sends them still works; values
that would be wrong (an unknown voice, encoding or rate) are refused with a stable code.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..audio.codecs import alaw_encode, float_to_int16, mulaw_encode
from ..audio.containers import make_stream_encoder, mp3_bitrates
from ..audio.format import MODEL_RATE
from ..model.sampling import SamplingParams
from ..protocol.errors import ErrorCode
from ..protocol.messages import LANGUAGES
from .utterance import ApiError, Encoder, SpeechOptions

ENCODINGS = ("pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")
SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
WS_CONTAINERS = ("raw",)  # the socket streams raw samples, as Cartesia's does
BYTES_CONTAINERS = ("raw", "wav", "mp3")
# Cartesia's named speeds (`speed`, and LiveKit's `generation_config.speed`), as factors.
NAMED_SPEEDS = {"slowest": 0.6, "slow": 0.8, "normal": 1.0, "fast": 1.25, "fastest": 1.5}
DEFAULT_BUFFER_DELAY_MS = 3000  # Cartesia's default `max_buffer_delay_ms`
MAX_BUFFER_DELAY_MS = 5000


def is_cartesia_model(name: str) -> bool:
    """`sonic`, `sonic-2`, `sonic-3`, `sonic-latest`, dated ones: each means this server's
    model (there is only one)."""
    return name == "sonic" or name.startswith("sonic-")


def _invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_PARAMETER, message)


@dataclass(frozen=True)
class OutputFormat:
    container: str
    encoding: str  # "mp3" in an mp3 container
    sample_rate: int
    bit_rate: int | None = None  # mp3 only

    @property
    def pcm_rate(self) -> int:
        """The rate to ask of the utterance: mp3's stream encoder resamples itself."""
        return MODEL_RATE if self.container == "mp3" else self.sample_rate

    def stream_encoder(self) -> Encoder:
        """One utterance's audio (float32 at `pcm_rate`) -> this format's bytes."""
        if self.container == "mp3":
            return make_stream_encoder("mp3", self.sample_rate, self.bit_rate)
        return _RawStream(self)

    @property
    def sample_bytes(self) -> int:
        return {"pcm_s16le": 2, "pcm_f32le": 4}.get(self.encoding, 1)

    @property
    def content_type(self) -> str:
        types = {"wav": "audio/wav", "mp3": "audio/mpeg"}
        return types.get(self.container, "application/octet-stream")

    def encode(self, pcm: np.ndarray) -> bytes:
        """float32 mono at `sample_rate` -> this encoding's little-endian bytes."""
        if self.encoding == "pcm_f32le":
            return np.clip(pcm, -1.0, 1.0).astype("<f4").tobytes()
        samples = float_to_int16(pcm)
        if self.encoding == "pcm_s16le":
            return samples.astype("<i2").tobytes()
        if self.encoding == "pcm_mulaw":
            return mulaw_encode(samples).tobytes()
        return alaw_encode(samples).tobytes()

    def wav_header(self) -> bytes:
        """A WAV header for a stream of unknown length: the RIFF and data sizes are
        0xFFFFFFFF, which players and decoders read as "until the end"."""
        tag = {"pcm_s16le": 1, "pcm_f32le": 3, "pcm_alaw": 6, "pcm_mulaw": 7}[self.encoding]
        width = self.sample_bytes
        rate = self.sample_rate
        fmt = struct.pack("<HHIIHH", tag, 1, rate, rate * width, width, width * 8)
        if tag != 1:
            fmt += struct.pack("<H", 0)  # cbSize: formats other than integer PCM have it
        unknown = 0xFFFFFFFF
        return (
            b"RIFF"
            + struct.pack("<I", unknown)
            + b"WAVEfmt "
            + struct.pack("<I", len(fmt))
            + fmt
            + b"data"
            + struct.pack("<I", unknown)
        )


class _RawStream:
    """Raw samples, after a WAV header in the `wav` container."""

    def __init__(self, fmt: OutputFormat) -> None:
        self.fmt = fmt
        self.header = fmt.wav_header() if fmt.container == "wav" else b""

    def encode(self, pcm: np.ndarray) -> bytes:
        header, self.header = self.header, b""
        return header + self.fmt.encode(pcm)

    def finish(self) -> bytes:
        return self.header


def parse_output_format(value: Any, containers: tuple[str, ...]) -> OutputFormat:
    if not isinstance(value, dict):
        raise _invalid(
            'output_format is required: {"container": "raw", "encoding": ..., "sample_rate": ...}'
        )
    container = value.get("container", "raw")
    if container not in containers:
        raise _invalid(
            f"output_format.container {str(container)[:20]!r} is not supported here; "
            f"use one of {', '.join(containers)}"
        )
    if container == "mp3":
        return _mp3(value)
    encoding = value.get("encoding")
    if encoding not in ENCODINGS:
        raise _invalid(f"output_format.encoding must be one of {', '.join(ENCODINGS)}")
    rate = value.get("sample_rate")
    if isinstance(rate, bool) or rate not in SAMPLE_RATES:
        rates = ", ".join(map(str, SAMPLE_RATES))
        raise _invalid(f"output_format.sample_rate must be one of {rates}")
    return OutputFormat(container, encoding, int(rate))


# The bit rates Cartesia's SDK offers at every sample rate; where mp3 has no such rate
# (192 kbit/s at 24 kHz and below), the nearest one below it is used.
SDK_MP3_BIT_RATES = (32_000, 64_000, 96_000, 128_000, 192_000)


def _mp3(value: dict[str, Any]) -> OutputFormat:
    rate, bit_rate = value.get("sample_rate"), value.get("bit_rate")
    if isinstance(rate, bool) or rate not in SAMPLE_RATES:
        rates = ", ".join(map(str, SAMPLE_RATES))
        raise _invalid(f"output_format.sample_rate must be one of {rates}")
    if bit_rate is not None and (isinstance(bit_rate, bool) or not isinstance(bit_rate, int)):
        raise _invalid("output_format.bit_rate must be an integer (bit/s)")
    if bit_rate in SDK_MP3_BIT_RATES:  # MPEG-2 (24 kHz and below) stops at 160 kbit/s
        bit_rate = max(b for b in mp3_bitrates(int(rate)) if b <= bit_rate)
    fmt = OutputFormat("mp3", "mp3", int(rate), bit_rate)
    try:
        fmt.stream_encoder()  # says which bit rates mp3 has at this rate
    except ValueError as exc:
        raise _invalid(f"output_format: {exc}") from None
    return fmt


def _voice_name(value: Any) -> str:
    if isinstance(value, dict):
        mode = value.get("mode", "id")
        if mode != "id":
            raise _invalid(f"voice mode {str(mode)[:20]!r} is not supported; use a voice id")
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise _invalid('voice must be {"mode": "id", "id": "VOICE"} or the id alone')
    return value


def _speed(value: Any, field: str) -> float:
    if isinstance(value, str) and value in NAMED_SPEEDS:
        return NAMED_SPEEDS[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        names = ", ".join(NAMED_SPEEDS)
        raise _invalid(f"{field} must be a number or one of {names}")
    if not 0.5 <= value <= 2.0:
        raise _invalid(f"{field} {value} is outside what this server supports: 0.5 to 2.0")
    return float(value)


def _language(value: Any) -> str:
    """Cartesia's `en`, `en-US`, `zh`, ... -> the text normalization to use. A language
    without one of its own is normalized as `auto` (the model speaks it all the same)."""
    if value is None:
        return "auto"
    if not isinstance(value, str):
        raise _invalid("language must be a string such as en or en-US")
    base = value.replace("_", "-").split("-")[0].lower()
    return base if base in LANGUAGES else "auto"


def _flag(body: dict[str, Any], field: str) -> bool:
    value = body.get(field)
    if value is not None and not isinstance(value, bool):
        raise _invalid(f"{field} must be true or false")
    return bool(value)


@dataclass(frozen=True)
class Generation:
    """What a context's first message (or a `/tts/bytes` body) sets for all its audio."""

    options: SpeechOptions
    output: OutputFormat
    volume: float = 1.0
    add_timestamps: bool = False
    buffer_delay_ms: int = DEFAULT_BUFFER_DELAY_MS


def parse_generation(
    body: dict[str, Any], model_name: str, containers: tuple[str, ...]
) -> Generation:
    """Raises ApiError: unknown model, a voice given another way than by id, an output
    format or control out of range. (An unknown voice is the Utterance's to report.)"""
    model = body.get("model_id", model_name)
    if not isinstance(model, str) or not (model == model_name or is_cartesia_model(model)):
        raise ApiError(
            ErrorCode.UNKNOWN_MODEL,
            f"unknown model_id {str(model)[:80]!r}; use {model_name} or a sonic model name",
            400,
        )
    voice = _voice_name(body.get("voice"))
    output = parse_output_format(body.get("output_format"), containers)
    config = body.get("generation_config") or {}
    if not isinstance(config, dict):
        raise _invalid("generation_config must be an object")
    speed = 1.0
    if body.get("speed") is not None:
        speed = _speed(body["speed"], "speed")
    if config.get("speed") is not None:
        speed = _speed(config["speed"], "generation_config.speed")
    volume = config.get("volume")
    if volume is None:
        volume = 1.0
    elif isinstance(volume, bool) or not isinstance(volume, int | float):
        raise _invalid("generation_config.volume must be a number")
    elif not 0.5 <= volume <= 2.0:
        raise _invalid("generation_config.volume must be within 0.5 and 2.0")
    delay = body.get("max_buffer_delay_ms")
    if delay is None:
        delay = DEFAULT_BUFFER_DELAY_MS
    elif isinstance(delay, bool) or not isinstance(delay, int):
        raise _invalid("max_buffer_delay_ms must be an integer")
    elif not 0 <= delay <= MAX_BUFFER_DELAY_MS:
        raise _invalid(f"max_buffer_delay_ms must be within 0 and {MAX_BUFFER_DELAY_MS}")
    seed = body.get("seed", 0)  # ours: the same text and seed give the same audio
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise _invalid("seed must be a non-negative integer below 2**31")
    language = _language(body.get("language", body.get("locale")))
    given = {
        "speed": body.get("speed") is not None or config.get("speed") is not None,
        "seed": "seed" in body,
        "language": body.get("language", body.get("locale")) is not None,
    }
    options = SpeechOptions(
        voice,
        language,
        speed,
        SamplingParams(seed=seed),
        output.pcm_rate,
        frozenset(k for k, v in given.items() if v),
    )
    return Generation(options, output, float(volume), _flag(body, "add_timestamps"), delay)


def error_body(error: ApiError, context_id: str | None = None, socket: bool = True) -> dict:
    """An `error` as Cartesia's clients read it (`error_code`, `title`, `message`,
    `status_code`), the code one of ours (protocol/errors.py). On the socket it names its
    context (null: the socket's own) and says `done: false`."""
    body: dict[str, Any] = {
        "type": "error",
        "status_code": error.status,
        "error_code": str(error.code),
        "title": str(error.code).replace("_", " ").capitalize(),
        "message": error.message,
    }
    if socket:
        body.update(context_id=context_id, done=False)
    return body
