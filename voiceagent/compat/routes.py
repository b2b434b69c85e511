"""Every drop-in API's routes, for the server to mount."""

from __future__ import annotations

from starlette.responses import Response
from starlette.routing import BaseRoute

from ..protocol.errors import ErrorCode
from ..session.port import SessionHost
from ..voices.registry import VoiceRegistry
from . import cartesia, elevenlabs_wire
from .cartesia import cartesia_routes
from .cloning import Cloning
from .elevenlabs import elevenlabs_routes
from .openai import openai_error, openai_routes
from .utterance import ApiError


def compat_routes(host: SessionHost, registry: VoiceRegistry) -> list[BaseRoute]:
    return [
        *openai_routes(host),
        *cartesia_routes(host),
        *elevenlabs_routes(host),
        *Cloning(host, registry).routes(),
    ]


def refusal(path: str, code: ErrorCode, message: str, status: int) -> Response | None:
    """A refusal before a drop-in API's handler runs (no credential, a bad one) in that
    API's error shape, which its clients parse; None for voiceagent's own paths."""
    error = ApiError(code, message, status)
    if path.startswith("/v1/audio/") or path == "/v1/models":
        return openai_error(error)
    if path.startswith("/v1/text-to-speech/"):
        return elevenlabs_wire.http_error(error)
    if path.startswith("/tts/"):
        return cartesia.http_error(error)
    return None
