"""Requests that bring reference audio with them:

POST /v1/tts           one request, one utterance: text, language, and a voice by name or
                       a few seconds of reference audio (a one-off voice, never kept) ->
                       the audio file, streamed as it is made (or whole, `stream: false`)
POST /v1/audio/voices  OpenAI's "create voice" (`client.audio.voices.create`): a voice of
                       the caller's tenant in the registry, usable by its id everywhere

Both read JSON (audio in base64) or multipart/form-data (audio in a file part).
"""

from __future__ import annotations

import asyncio
import logging
import math
import tempfile
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from ..audio.containers import FORMATS, StreamEncoder, make_stream_encoder
from ..auth.gate import Principal, principal_of
from ..model.sampling import SamplingParams
from ..model.voice_store import NAME
from ..protocol.errors import ErrorCode
from ..protocol.messages import LANGUAGES
from ..server.voices_api import answering, read_audio_request
from ..session.port import SessionHost
from ..voices.reference import MAX_UPLOAD_BYTES
from ..voices.registry import VoiceError, VoiceRegistry
from .openai import openai_error
from .utterance import (
    ApiError,
    SpeechOptions,
    Utterance,
    streamed,
)

log = logging.getLogger(__name__)

TTS_FIELDS = {
    "text", "voice", "transcript", "language", "format", "sample_rate", "speed", "seed",
    "stream",
}  # fmt: skip


def _invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_PARAMETER, message)


def _number(fields: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    """A number from JSON, or from a form's text field."""
    value = fields.get(key, default)
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int | float) or math.isnan(number):
        raise _invalid(f"'{key}' must be a number")
    if not lo <= number <= hi:
        raise _invalid(f"'{key}' must be within {lo:g} and {hi:g}")
    return float(number)


class TtsRequest:
    """A checked `/v1/tts` body (JSON, or the text fields of a form)."""

    def __init__(self, fields: dict[str, Any], has_audio: bool) -> None:
        unknown = sorted(set(fields) - TTS_FIELDS)
        if unknown:
            raise _invalid(f"unknown field(s): {', '.join(unknown)}")
        text = fields.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _invalid("'text' must be a non-empty string")
        self.text = text
        voice = fields.get("voice")
        if voice is not None and (not isinstance(voice, str) or not voice):
            raise _invalid("'voice' must be a voice or role name")
        if (voice is None) == (not has_audio):
            raise _invalid("give either 'voice' (a name) or reference audio, not both")
        self.voice = voice
        self.transcript = fields.get("transcript")
        if self.transcript is not None and not isinstance(self.transcript, str):
            raise _invalid("'transcript' must be a string")
        self.language = fields.get("language", "auto")
        if self.language not in LANGUAGES:
            raise _invalid(f"'language' must be one of {', '.join(LANGUAGES)}")
        self.format = fields.get("format", "wav")
        if self.format not in FORMATS:
            raise _invalid(f"'format' must be one of {', '.join(FORMATS)}")
        rate = fields.get("sample_rate")
        self.sample_rate = None if rate is None else int(_number(fields, "sample_rate", 0, 1, 1e6))
        try:
            make_stream_encoder(self.format, self.sample_rate)
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        self.speed = _number(fields, "speed", 1.0, 0.5, 2.0)
        self.seed = int(_number(fields, "seed", 0, 0, 2**31 - 1))
        stream = fields.get("stream", True)
        if isinstance(stream, str):
            stream = {"true": True, "false": False}.get(stream.lower(), stream)
        if not isinstance(stream, bool):
            raise _invalid("'stream' must be true or false")
        self.stream = stream


def _refusal(exc: ApiError) -> JSONResponse:
    headers = {"Retry-After": "2"} if exc.status in (429, 503) else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


class Cloning:
    def __init__(self, host: SessionHost, registry: VoiceRegistry) -> None:
        self.host = host
        self.registry = registry

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/tts", answering(self.tts), methods=["POST"]),
            Route("/v1/audio/voices", answering(self.openai_voice, openai_error), methods=["POST"]),
        ]

    async def tts(self, request: Request) -> Response:
        principal = principal_of(request)
        audio, fields = await read_audio_request(request)
        req = TtsRequest(fields, audio is not None)
        options = SpeechOptions(
            req.voice or "",
            req.language,
            req.speed,
            SamplingParams(seed=req.seed),
            given=frozenset(fields),
        )
        if audio is None:
            utterance = Utterance(self.host, principal, options, "tts")
        else:
            if principal.kind == "token":  # a browser's token may be bound to one voice
                raise ApiError(ErrorCode.FORBIDDEN, "reference audio needs an API key", 403)
            _check_size(audio)
            utterance = await self._with_one_off(principal, options, audio, req)
        try:
            utterance.push(req.text)
            utterance.end()
        except ApiError:
            utterance.close()
            raise
        encoder = make_stream_encoder(req.format, req.sample_rate)
        if req.stream:
            return await streamed(utterance, encoder, encoder.content_type, _refusal)
        return await _whole(request, utterance, encoder, encoder.content_type)

    async def _with_one_off(
        self, principal: Principal, options: SpeechOptions, audio: bytes, req: TtsRequest
    ) -> Utterance:
        """The request's utterance in a voice made from its reference audio. Admitted
        first (a live-turn slot, the tenant's turn quota): a request that would be refused
        costs no decoding and no voice."""
        admission = self.host.admission
        if (refusal := admission.admit_request(principal.tenant)) is not None:
            raise ApiError(refusal.code, refusal.message)
        try:
            voice = await self.registry.one_off(principal, audio, req.transcript, req.language)
            utterance = Utterance(self.host, principal, options, "tts", voice=voice, slot=False)
        except BaseException:
            admission.turn_ended()
            raise
        forget = self.host.engine.acoustic.forget_voice  # its cached flow state goes with it
        utterance.on_close += [admission.turn_ended, lambda: forget(voice.name)]
        return utterance

    async def openai_voice(self, request: Request) -> Response:
        """OpenAI's `POST /v1/audio/voices` (multipart: `audio_sample`, `name`, `consent`):
        a voice of the caller's tenant. A `name` that is a valid voice id is the id; any
        other name gets a generated id (the response says which)."""
        principal = principal_of(request)
        if principal.kind == "token":
            raise ApiError(ErrorCode.FORBIDDEN, "voices are made with an API key", 403)
        audio, fields = await read_audio_request(request, file_part="audio_sample")
        if fields.get("type", "audio_sample") != "audio_sample" or audio is None:
            raise _invalid("only voices from an 'audio_sample' are supported here")
        name = fields.get("name")
        if not isinstance(name, str) or not name:
            raise _invalid("'name' is required")
        _check_size(audio)
        hint = fields.get("script_hint")  # what the sample says, if the caller knows
        info = await self.registry.create(
            principal,
            audio,
            name if NAME.match(name) else None,
            hint if isinstance(hint, str) else None,
        )
        body = {
            "id": info.id,
            "object": "audio.voice",
            "name": name,
            "type": "audio_sample",
            "created_at": info.created_at,
        }
        return JSONResponse(body, status_code=201)


SPOOL_IN_MEMORY = 1 << 20  # bytes of a whole file kept in memory before it goes to disk
HEADER_BYTES = 64  # where a container's length fields are (WAV's, FLAC's STREAMINFO)


def _check_size(audio: bytes) -> None:
    if len(audio) > MAX_UPLOAD_BYTES:
        raise VoiceError(
            ErrorCode.AUDIO_TOO_LARGE,
            f"the audio is {len(audio) / 2**20:.1f} MiB; at most "
            f"{MAX_UPLOAD_BYTES / 2**20:g} MiB is accepted",
        )


async def _whole(
    request: Request, utterance: Utterance, encoder: StreamEncoder, media_type: str
) -> Response:
    """The whole file in one body, with its length (for clients that want a file). A
    client that hangs up meanwhile stops the synthesis, as a streaming one does. The
    file is kept on disk past its first MiB (minutes of speech: tens of MB each, and
    many such requests may run at once), then sent from there."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115 (body closes it)

    async def collect() -> None:
        async for pcm in utterance.pcm():
            spool.write(encoder.encode(pcm))
        spool.write(encoder.finish())

    async def hung_up() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(0.2)

    try:
        work = asyncio.ensure_future(collect())
        watch = asyncio.ensure_future(hung_up())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, watch):
                task.cancel()
        if not work.done() or work.cancelled():
            spool.close()
            return Response(status_code=499)  # nobody to answer: the turn is cancelled
        work.result()  # (its ApiError, if it failed)
    except ApiError as exc:
        spool.close()
        return _refusal(exc)
    finally:
        utterance.close()
    size = spool.tell()
    spool.seek(0)
    head = spool.read(HEADER_BYTES)
    spool.seek(0)
    spool.write(encoder.seal(head, size))  # its lengths, unknown while it was made
    spool.seek(0)

    async def body() -> AsyncIterator[bytes]:
        with spool:
            while piece := spool.read(1 << 16):
                yield piece

    headers = {"Content-Length": str(size)}
    return StreamingResponse(body(), media_type=media_type, headers=headers)
