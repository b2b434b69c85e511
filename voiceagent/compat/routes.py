"""Every drop-in API's routes, for the server to mount."""

from __future__ import annotations

from starlette.routing import BaseRoute

from ..session.port import SessionHost
from ..voices.registry import VoiceRegistry
from .cartesia import cartesia_routes
from .cloning import Cloning
from .elevenlabs import elevenlabs_routes
from .openai import openai_routes


def compat_routes(host: SessionHost, registry: VoiceRegistry) -> list[BaseRoute]:
    return [
        *openai_routes(host),
        *cartesia_routes(host),
        *elevenlabs_routes(host),
        *Cloning(host, registry).routes(),
    ]
