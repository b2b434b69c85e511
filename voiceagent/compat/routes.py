"""Every drop-in API's routes, for the server to mount."""

from __future__ import annotations

from starlette.routing import BaseRoute

from ..session.port import SessionHost
from .cartesia import cartesia_routes
from .elevenlabs import elevenlabs_routes
from .openai import openai_routes


def compat_routes(host: SessionHost) -> list[BaseRoute]:
    return [*openai_routes(host), *cartesia_routes(host), *elevenlabs_routes(host)]
