"""Short-lived session tokens for browsers: `vt1.<payload>.<mac>`, where the payload is
base64url JSON {tenant, voice, exp} and the mac is HMAC-SHA256 of it under the server's
token secret. Nothing is stored: a token is valid until it expires (so keep them short),
and rotating the secret invalidates every token at once. No I/O here."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass

from ..protocol.json_text import parse_json

PREFIX = "vt1."


@dataclass(frozen=True)
class TokenClaims:
    tenant: str
    voice: str | None  # set: the token may only speak with this voice
    expires_at: int  # Unix seconds


class BadToken(ValueError):
    """Malformed, tampered with, or expired: the message says which."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, payload: str) -> str:
    return _b64(hmac.new(secret, payload.encode(), hashlib.sha256).digest())


def mint(
    secret: bytes, tenant: str, ttl_s: float, voice: str | None = None, now: float | None = None
) -> str:
    claims = {"tenant": tenant, "voice": voice, "exp": int((now or time.time()) + ttl_s)}
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    return f"{PREFIX}{payload}.{_mac(secret, payload)}"


def verify(secret: bytes, token: str, now: float | None = None) -> TokenClaims:
    """The token's claims, if `secret` signed it and it has not expired; else BadToken."""
    if not token.startswith(PREFIX) or token.count(".") != 2:
        raise BadToken("not a session token")
    payload, mac = token[len(PREFIX) :].split(".")
    if not hmac.compare_digest(mac, _mac(secret, payload)):
        raise BadToken("session token signature does not match")
    try:
        claims = parse_json(_unb64(payload))
        tenant, voice, exp = claims["tenant"], claims["voice"], claims["exp"]
    except (ValueError, KeyError, TypeError):
        raise BadToken("session token payload is malformed") from None
    if not isinstance(tenant, str) or not isinstance(exp, int) or not isinstance(voice, str | None):
        raise BadToken("session token payload is malformed")
    if exp <= (now or time.time()):
        raise BadToken("session token has expired")
    return TokenClaims(tenant, voice, exp)
