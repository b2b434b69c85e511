"""HTTP entries of the voice registry (voices/registry.py; docs/voices.md):

GET    /v1/voices        the caller's voices: {"voices": [names], "data": [voice objects]}
POST   /v1/voices        a new voice from reference audio: multipart/form-data (`file`,
                         `name`, `transcript`, `language`) or JSON (`audio` in base64)
GET    /v1/voices/{id}   one voice
DELETE /v1/voices/{id}   204; the caller's own voices only

Errors are `{"type": "error", "code": ..., "message": ...}` with the HTTP status of
STATUS. Making and deleting voices needs an API key when auth is on (a session token is
a browser's, possibly scoped to one voice: 403 `forbidden`).
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message

from ..auth.gate import Principal, principal_of
from ..compat.utterance import ApiError
from ..engine.embedded import EmbeddedEngine
from ..model.speech_model import SpeechModel
from ..protocol.errors import ErrorCode
from ..protocol.json_text import parse_json
from ..protocol.session import Catalog
from ..session.admission import Admission
from ..transport.http_body import BodyTooLarge, read_body
from ..voices.reference import MAX_UPLOAD_BYTES, ReferenceAudioError
from ..voices.registry import VoiceError, VoiceRegistry

log = logging.getLogger(__name__)

# The body may hold the audio in base64 (4/3 of it) and a few form fields.
MAX_BODY_BYTES = math.ceil(MAX_UPLOAD_BYTES * 4 / 3) + 64 * 1024
MAX_FIELD_BYTES = 64 * 1024
HAS_MULTIPART = importlib.util.find_spec("python_multipart") is not None

STATUS = {
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.INVALID_MESSAGE: 400,
    ErrorCode.INVALID_PARAMETER: 400,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNKNOWN_VOICE: 404,
    ErrorCode.VOICE_EXISTS: 409,
    ErrorCode.AUDIO_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.QUOTA_EXCEEDED: 429,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.AUDIO_UNREADABLE: 422,
    ErrorCode.AUDIO_TOO_SHORT: 422,
    ErrorCode.AUDIO_TOO_LONG: 422,
    ErrorCode.AUDIO_CLIPPED: 422,
    ErrorCode.AUDIO_SILENT: 422,
    ErrorCode.INTERNAL_ERROR: 500,
    ErrorCode.VOICE_CLONING_UNSUPPORTED: 501,
    ErrorCode.VOICE_STORAGE_FAILED: 507,
}


def error(code: ErrorCode, message: str) -> JSONResponse:
    body = {"type": "error", "code": str(code), "message": message}
    return JSONResponse(body, status_code=STATUS[code])


@dataclass(frozen=True)
class Upload:
    audio: bytes
    name: str | None
    transcript: str | None
    language: str


class _Config(Protocol):
    @property
    def voices_dir(self) -> Path | None: ...


class VoiceServer(Protocol):
    """What the entries use of server/app.py's VoiceServer."""

    @property
    def engine(self) -> EmbeddedEngine: ...

    @property
    def config(self) -> _Config: ...

    @property
    def admission(self) -> Admission: ...

    def rescan_voices(self) -> None: ...

    def catalog_for(self, principal: Principal) -> Catalog: ...


class _Host:
    """The server as the registry sees it."""

    def __init__(self, server: VoiceServer) -> None:
        self.server = server

    @property
    def model(self) -> SpeechModel:
        return self.server.engine.model

    @property
    def voices_dir(self) -> Path | None:
        return self.server.config.voices_dir

    def rescan_voices(self) -> None:
        self.server.rescan_voices()

    def catalog_for(self, principal: Principal) -> Catalog:
        return self.server.catalog_for(principal)

    def forget_voice(self, key: str) -> None:
        self.server.engine.acoustic.forget_voice(key)

    def voice_quota(self, tenant: str) -> int:
        return self.server.admission.quota(tenant).voices


async def _read_body(request: Request) -> bytes:
    """The whole body, refused as soon as it passes MAX_BODY_BYTES (never buffered past)."""
    try:
        return await read_body(request, MAX_BODY_BYTES)
    except BodyTooLarge:
        raise VoiceError(
            ErrorCode.AUDIO_TOO_LARGE,
            f"the request is larger than {MAX_BODY_BYTES / 2**20:.1f} MiB; the audio may be at "
            f"most {MAX_UPLOAD_BYTES / 2**20:g} MiB",
        ) from None


def _text_field(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise VoiceError(ErrorCode.INVALID_PARAMETER, f"'{field}' must be a string")


def _base64_audio(audio: Any) -> bytes:
    if not isinstance(audio, str) or not audio:
        raise VoiceError(ErrorCode.INVALID_PARAMETER, "'audio' must be base64 audio")
    if audio.startswith("data:") and "," in audio:  # a data: URL, as a browser makes it
        audio = audio.split(",", 1)[1]
    try:  # line breaks allowed: MIME base64 (the `base64` command's) wraps at 76
        return base64.b64decode("".join(audio.split()), validate=True)
    except (binascii.Error, ValueError):
        raise VoiceError(ErrorCode.INVALID_PARAMETER, "'audio' is not valid base64") from None


def _from_json(body: bytes) -> tuple[bytes | None, dict[str, Any]]:
    try:
        data = parse_json(body)
    except ValueError:
        raise VoiceError(ErrorCode.INVALID_JSON, "the body is not JSON") from None
    if not isinstance(data, dict):
        raise VoiceError(ErrorCode.INVALID_MESSAGE, "the body must be a JSON object")
    audio = data.pop("audio", None)
    return (None if audio is None else _base64_audio(audio)), data


async def _from_form(
    request: Request, body: bytes, file_part: str
) -> tuple[bytes | None, dict[str, Any]]:
    if not HAS_MULTIPART:
        raise VoiceError(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "this server cannot read multipart/form-data (python-multipart is not installed); "
            "send application/json with the audio in base64",
        )
    sent = False

    async def replay() -> Message:  # the body again, already read and size-checked
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(
            max_files=1, max_fields=16, max_part_size=MAX_FIELD_BYTES
        )
    except (MultiPartException, HTTPException) as exc:  # Starlette raises the latter in an app
        why = exc.detail if isinstance(exc, HTTPException) else exc.message
        raise VoiceError(ErrorCode.INVALID_MESSAGE, f"malformed multipart body: {why}") from None
    try:
        upload = form.get(file_part)
        audio = await upload.read() if isinstance(upload, UploadFile) else None
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key == file_part:
                continue
            if not isinstance(value, str):
                raise VoiceError(ErrorCode.INVALID_PARAMETER, f"'{key}' must be a text field")
            fields[key] = value
        return audio, fields
    finally:
        await form.close()


async def read_audio_request(
    request: Request, file_part: str = "file"
) -> tuple[bytes | None, dict[str, Any]]:
    """A request carrying reference audio: multipart/form-data (the audio in the
    `file_part` part, the rest text fields) or JSON (`audio` in base64, the rest as they
    are). The audio is None when the request has none; the body is size-checked."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("multipart/form-data", "application/json"):
        raise VoiceError(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type {kind or 'none'!r}: send multipart/form-data (a '{file_part}' part) "
            "or application/json ('audio' in base64)",
        )
    body = await _read_body(request)
    if kind == "application/json":
        return _from_json(body)
    return await _from_form(request, body, file_part)


UPLOAD_FIELDS = frozenset({"name", "transcript", "language"})


async def read_upload(request: Request) -> Upload:
    """A `POST /v1/voices` body."""
    audio, fields = await read_audio_request(request)
    unknown = sorted(set(fields) - UPLOAD_FIELDS)
    if unknown:  # a misspelt field would make a voice other than the one asked for
        raise VoiceError(
            ErrorCode.INVALID_PARAMETER,
            f"unknown field(s) {', '.join(unknown)[:200]}; a voice takes "
            f"{', '.join(sorted(UPLOAD_FIELDS))} and its audio",
        )
    if fields.get("name") == "":
        raise VoiceError(ErrorCode.INVALID_PARAMETER, "'name' is empty: leave it out for an id")
    if audio is None:
        raise VoiceError(
            ErrorCode.INVALID_MESSAGE,
            "the reference audio is required: a 'file' part, or 'audio' in base64",
        )
    return Upload(
        audio,
        _text_field(fields.get("name"), "name"),
        _text_field(fields.get("transcript"), "transcript"),
        _text_field(fields.get("language"), "language") or "auto",
    )


def _may_manage(principal: Principal) -> None:
    if principal.kind == "token":
        raise VoiceError(
            ErrorCode.FORBIDDEN, "voices are made and deleted with an API key, not a session token"
        )


Handler = Callable[[Request], Awaitable[Response]]


def answering(handler: Handler, shape: Callable[[ApiError], Response] | None = None) -> Handler:
    """Coded refusals as JSON errors (in a drop-in API's own `shape` where given);
    anything else logged and a 500."""

    def refuse(exc: ApiError) -> Response:
        if shape is not None:
            return shape(exc)
        headers = {"Retry-After": "2"} if exc.status in (429, 503) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except (VoiceError, ReferenceAudioError) as exc:
            return refuse(ApiError(exc.code, exc.message, STATUS[exc.code]))
        except ApiError as exc:  # the drop-in APIs' refusals (compat/cloning.py)
            return refuse(exc)
        except ClientDisconnect:
            raise  # the server's (app.py): no error of ours
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            message = "the request failed unexpectedly (logged)"
            return refuse(ApiError(ErrorCode.INTERNAL_ERROR, message, 500))

    return answer


def make_registry(server: VoiceServer) -> VoiceRegistry:
    return VoiceRegistry(_Host(server))


def voice_routes(registry: VoiceRegistry) -> list[BaseRoute]:
    async def collection(request: Request) -> Response:
        principal = principal_of(request)
        if request.method == "GET":
            infos = await registry.list(principal)
            return JSONResponse(
                {"voices": [i.id for i in infos], "data": [i.to_json() for i in infos]}
            )
        _may_manage(principal)
        upload = await read_upload(request)
        if len(upload.audio) > MAX_UPLOAD_BYTES:
            raise VoiceError(
                ErrorCode.AUDIO_TOO_LARGE,
                f"the audio is {len(upload.audio) / 2**20:.1f} MiB; at most "
                f"{MAX_UPLOAD_BYTES / 2**20:g} MiB is accepted",
            )
        info = await registry.create(
            principal, upload.audio, upload.name, upload.transcript, upload.language
        )
        return JSONResponse(info.to_json(), status_code=201)

    async def item(request: Request) -> Response:
        principal = principal_of(request)
        voice_id = request.path_params["voice_id"]
        if request.method == "GET":
            return JSONResponse(registry.get(principal, voice_id).to_json())
        _may_manage(principal)
        registry.delete(principal, voice_id)
        return Response(status_code=204)

    return [
        Route("/v1/voices", answering(collection), methods=["GET", "POST"]),
        Route("/v1/voices/{voice_id}", answering(item), methods=["GET", "DELETE"]),
    ]
