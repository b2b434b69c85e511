"""Every drop-in API's routes, for the server to mount."""

from __future__ import annotations

from starlette.routing import BaseRoute

from ..session.port import SessionHost
from .elevenlabs import elevenlabs_routes


def compat_routes(host: SessionHost) -> list[BaseRoute]:
    return [*elevenlabs_routes(host)]
