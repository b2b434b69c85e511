"""POST /v1/tokens: a backend holding an API key mints a short-lived session token for
a browser. Body (JSON, optional): {"voice": NAME, "ttl_s": SECONDS}; the lifetime is
capped by `auth.token_ttl_s`. The token names the key's tenant."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..protocol.errors import ErrorCode
from ..protocol.json_text import parse_json
from ..transport.http_body import BodyTooLarge, read_body
from .gate import Gate, Principal, principal_of

MAX_BODY_BYTES = 4096


def _error(code: ErrorCode, message: str, status: int = 400) -> JSONResponse:
    body = {"type": "error", "code": str(code), "message": message}
    return JSONResponse(body, status_code=status)


async def mint_token(
    request: Request,
    gate: Gate,
    voices_of: Callable[[Principal], Sequence[str]],
    ttl_cap_s: float,
) -> JSONResponse:
    """POST /v1/tokens: a session token for the caller's tenant (`voices_of`: what the
    caller may use, to check a voice scope)."""
    try:
        body = await read_body(request, MAX_BODY_BYTES)
    except BodyTooLarge:
        return _error(ErrorCode.MESSAGE_TOO_LARGE, f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        asked: Any = parse_json(body) if body.strip() else {}
    except ValueError:
        return _error(ErrorCode.INVALID_JSON, "body must be JSON: {voice?, ttl_s?}")
    if not isinstance(asked, dict):
        return _error(ErrorCode.INVALID_MESSAGE, "body must be a JSON object: {voice?, ttl_s?}")
    cap = ttl_cap_s
    ttl = asked.get("ttl_s", cap)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
        return _error(ErrorCode.INVALID_PARAMETER, "'ttl_s' must be a number of seconds > 0")
    ttl = min(float(ttl), cap)
    principal = principal_of(request)
    voice = asked.get("voice")
    if voice is not None and (not isinstance(voice, str) or voice not in voices_of(principal)):
        return _error(ErrorCode.UNKNOWN_VOICE, f"unknown voice {str(voice)[:64]!r}")
    token = gate.mint(principal.tenant, ttl, voice)
    expires_at = int(time.time() + ttl)
    return JSONResponse(
        {"token": token, "tenant": principal.tenant, "voice": voice, "expires_at": expires_at}
    )
