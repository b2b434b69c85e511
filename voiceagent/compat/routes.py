"""Every drop-in API's routes, for the server to mount."""

from __future__ import annotations

from starlette.routing import BaseRoute

from ..session.port import SessionHost
from .cartesia import cartesia_routes

# The OpenAI speech routes (openai.py) join once audio/containers.py, their streaming
# encoders, is in this branch: `from .openai import openai_routes`, `*openai_routes(host)`.


def compat_routes(host: SessionHost) -> list[BaseRoute]:
    return [*cartesia_routes(host)]
