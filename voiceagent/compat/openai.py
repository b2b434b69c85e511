"""OpenAI-compatible speech: `POST /v1/audio/speech` and `GET /v1/models`, so the OpenAI
SDK (and anything built on it) works with only its base URL, key and voice changed.

The body is OpenAI's: `model`, `input`, `voice` (a name or `{"id": ...}`),
`response_format`, `speed`, `instructions`, `stream_format` (`audio` | `sse`); plus
`language` and `seed`, ours. Audio streams as it is synthesized, encoded on the fly
(audio/containers.py). What differs from OpenAI is in docs/compat.md.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..audio.containers import make_stream_encoder
from ..auth.gate import principal_of
from ..model.sampling import SamplingParams
from ..protocol.errors import ErrorCode
from ..protocol.messages import LANGUAGES
from ..session.port import SessionHost
from .utterance import (
    ApiError,
    Encoder,
    SpeechOptions,
    Utterance,
    json_body,
    streamed,
)

log = logging.getLogger(__name__)

MAX_INPUT_CHARS = 4096  # OpenAI's limit
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
# Model names OpenAI clients send; each means the model this server runs.
MODEL_ALIASES = (
    "tts-1",
    "tts-1-hd",
    "gpt-4o-mini-tts",
    "gpt-4o-mini-tts-2025-03-20",
    "gpt-4o-mini-tts-2025-12-15",
)
# What the request may carry; anything else is refused, so a typo does not pass silently.
FIELDS = {
    "model",
    "input",
    "voice",
    "response_format",
    "speed",
    "instructions",
    "stream_format",
    "language",
    "seed",
}
IGNORED_HEADER = "X-Voiceagent-Ignored"


def openai_routes(host: SessionHost) -> list[BaseRoute]:
    api = OpenAISpeech(host)
    return [
        Route("/v1/audio/speech", api.speech, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
    ]


def openai_error(error: ApiError) -> JSONResponse:
    """The error shape OpenAI's SDKs parse (`error.message`, `error.code`), with our
    stable code."""
    kind = "server_error" if error.status >= 500 else "invalid_request_error"
    body = {"error": {"message": error.message, "type": kind, "param": None, "code": error.code}}
    headers = {"Retry-After": "2"} if error.status in (429, 503) else None
    return JSONResponse(body, status_code=error.status, headers=headers)


def _invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_PARAMETER, message)


class SpeechRequest:
    """A checked `/v1/audio/speech` body."""

    def __init__(self, body: Any, model_names: tuple[str, ...]) -> None:
        if not isinstance(body, dict):
            raise ApiError(ErrorCode.INVALID_MESSAGE, "the body must be a JSON object")
        # null means "not set" (clients that forward every parameter send None for those
        # left unset): its default, or the role's
        body = {k: v for k, v in body.items() if v is not None}
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise _invalid(f"unknown field(s): {', '.join(unknown)}")
        model = body.get("model")
        if model not in model_names:
            raise ApiError(
                ErrorCode.UNKNOWN_MODEL,
                f"unknown model {str(model)[:80]!r}; available: {', '.join(model_names)}",
                404,
            )
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise _invalid("input must be a non-empty string")
        if len(text) > MAX_INPUT_CHARS:
            raise ApiError(
                ErrorCode.TEXT_TOO_LONG, f"input has {len(text)} characters; at most 4096"
            )
        self.input = text
        voice = body.get("voice")
        if isinstance(voice, dict):
            voice = voice.get("id")
        if not isinstance(voice, str) or not voice:
            raise _invalid('voice must be a voice name or {"id": "..."}')
        self.voice = voice
        self.format = body.get("response_format", "mp3")
        if self.format not in FORMATS:
            raise _invalid(f"response_format must be one of {', '.join(FORMATS)}")
        self.stream_format = body.get("stream_format", "audio")
        if self.stream_format not in ("audio", "sse"):
            raise _invalid("stream_format must be audio or sse")
        speed = body.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, int | float):
            raise _invalid("speed must be a number")
        if not 0.5 <= speed <= 2.0:  # OpenAI takes 0.25-4; the model sounds right in this
            raise _invalid(f"speed {speed} is outside what this server supports: 0.5 to 2.0")
        self.speed = float(speed)
        self.language = body.get("language", "auto")
        if self.language not in LANGUAGES:
            raise _invalid(f"language must be one of {', '.join(LANGUAGES)}")
        seed = body.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise _invalid("seed must be an integer from 0 to 2147483647 (as in a session)")
        self.seed = seed
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise _invalid("instructions must be a string")
        # CosyVoice2 speaks as its voice prompt does; it has no instruction input.
        self.ignored = ["instructions"] if instructions else []
        self.given = frozenset(body)

    def options(self) -> SpeechOptions:
        """The request's options (a role it names fills in what it does not set)."""
        sampling = SamplingParams(seed=self.seed)
        return SpeechOptions(self.voice, self.language, self.speed, sampling, given=self.given)


class OpenAISpeech:
    def __init__(self, host: SessionHost) -> None:
        self.host = host

    @property
    def model_names(self) -> tuple[str, ...]:
        return (str(self.host.catalog.model["name"]), *MODEL_ALIASES)

    async def models(self, request: Request) -> JSONResponse:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "voiceagent"}
            for name in self.model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def speech(self, request: Request) -> Response:
        try:
            body = await json_body(request)
            req = SpeechRequest(body, self.model_names)
            who = principal_of(request)
            options = req.options()
            utterance = Utterance(self.host, who, options, "openai")
        except ApiError as exc:
            return openai_error(exc)
        try:
            utterance.push(req.input)
            utterance.end()
        except ApiError as exc:
            utterance.close()
            return openai_error(exc)
        encoder = make_stream_encoder(req.format)
        headers = {IGNORED_HEADER: ",".join(req.ignored)} if req.ignored else {}
        if req.stream_format == "audio":
            return await streamed(utterance, encoder, encoder.content_type, openai_error, headers)
        sse = SseEncoder(encoder, utterance)
        return await streamed(
            utterance, sse, "text/event-stream", openai_error, headers, failed=sse.error
        )


class SseEncoder:
    """OpenAI's speech events around an encoder's bytes: `speech.audio.delta` (base64
    audio), then `speech.audio.done`; an `error` event if synthesis fails on the way."""

    def __init__(self, inner: Encoder, utterance: Utterance) -> None:
        self.inner = inner
        self.utterance = utterance

    def encode(self, pcm: np.ndarray) -> bytes:
        return self._delta(self.inner.encode(pcm))

    def finish(self) -> bytes:
        tokens = self.utterance.turn.stats.tokens
        chars = self.utterance.chars  # (input characters stand in for text tokens)
        usage = {"input_tokens": chars, "output_tokens": tokens, "total_tokens": chars + tokens}
        done = _event({"type": "speech.audio.done", "usage": usage})
        return self._delta(self.inner.finish()) + done

    def error(self, exc: ApiError) -> bytes:
        return _event({"type": "error", "error": {"code": exc.code, "message": exc.message}})

    def _delta(self, data: bytes) -> bytes:
        if not data:
            return b""
        return _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})


def _event(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()
