"""The gate: which entries need a credential, and who a credential says the caller is.

A credential is an API key (keys.py) or a session token (tokens.py), sent as
`Authorization: Bearer …`, or as the `token` query parameter where a header cannot be
set (a browser's WebSocket, a carrier's stream URL). The drop-in APIs' clients send it
their own way, and are understood: `X-API-Key` or `?api_key=` (Cartesia), `xi-api-key`
or `?xi_api_key=` (ElevenLabs). `AuthMiddleware` checks it before
any route runs, so a refused WebSocket is answered with an HTTP 401/403 before the
upgrade; the caller's `Principal` is left in the scope for the route.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from ..protocol.errors import ErrorCode
from . import tokens
from .keys import DEFAULT_TENANT, KeyStore

log = logging.getLogger(__name__)

Mode = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class AuthConfig:
    mode: Mode = "auto"  # auto: on unless the server binds a loopback address
    keys_file: Path | None = None
    token_secret: str = ""  # empty: a random one per process (tokens die with it)
    token_ttl_s: int = 3600  # the longest a minted token lives
    metrics: Literal["open", "required"] = "open"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything


def auth_enabled(mode: Mode, host: str) -> bool:
    return mode == "on" or (mode == "auto" and not is_loopback(host))


def exposure_warning(config: AuthConfig, host: str) -> str | None:
    """The warning to log at start when anyone who reaches the port may use it, or when
    auth is on with no way to get a credential."""
    if auth_enabled(config.mode, host) and config.keys_file is None and not config.token_secret:
        return (
            f'authentication is on ({host} is not loopback, or auth.mode = "on") but '
            "neither auth.keys_file nor auth.token_secret is set: every /v1/ entry will "
            "answer 401 (see docs/security.md)"
        )
    if config.mode == "off" and not is_loopback(host):
        return (
            f"AUTHENTICATION IS OFF on {host}, which is not a loopback address: anyone who "
            "can reach this port can open sessions, use every voice and read metrics "
            '(auth.mode = "off"; see docs/security.md)'
        )
    return None


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant, by an API key or a token (which may be voice-scoped)."""

    tenant: str = DEFAULT_TENANT
    kind: Literal["key", "token", "none"] = "none"  # none: auth is off
    voice: str | None = None


ANONYMOUS = Principal()
SCOPE_KEY = "voiceagent.principal"


def principal_of(conn: HTTPConnection) -> Principal:
    found = conn.scope.get(SCOPE_KEY)
    return found if isinstance(found, Principal) else ANONYMOUS


@dataclass(frozen=True)
class Denial:
    status: int  # 401: no or a wrong credential; 403: a valid one outside its scope
    message: str

    @property
    def code(self) -> ErrorCode:
        return ErrorCode.UNAUTHORIZED if self.status == 401 else ErrorCode.FORBIDDEN

    def response(self, path: str, shape: Shape | None = None) -> Response:
        """Ours, or the shape of the API `path` belongs to (its clients read theirs)."""
        body = {"type": "error", "code": str(self.code), "message": self.message}
        shaped = shape(path, self.code, self.message, self.status) if shape else None
        response = shaped or JSONResponse(body, status_code=self.status)
        if self.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response


# A refusal in the error shape of the API a path belongs to (None: voiceagent's own).
Shape = Callable[[str, ErrorCode, str, int], Response | None]


class Gate:
    def __init__(self, config: AuthConfig, host: str) -> None:
        self.config = config
        self.enabled = auth_enabled(config.mode, host)
        self.keys = KeyStore(config.keys_file if self.enabled else None)
        self.secret = (config.token_secret or secrets.token_hex(32)).encode()
        self._reported: str | None = None
        path = self.keys.path
        if path is not None and not path.exists():  # (a typo'd path, most likely)
            log.warning(
                "keys file %s does not exist: no API key is accepted until it is made "
                "(voiceagent key add --keys-file %s)",
                path,
                path,
            )
        elif self.keys.error:
            self._reported = self.keys.error
            log.error("%s: no API key is accepted until it is fixed", self.keys.error)

    def authenticate(self, credential: str | None) -> Principal | Denial:
        if not self.enabled:
            return ANONYMOUS
        if not credential:
            return Denial(401, "a credential is required: Authorization: Bearer KEY_OR_TOKEN")
        if credential.startswith(tokens.PREFIX):
            try:
                claims = tokens.verify(self.secret, credential)
            except tokens.BadToken as exc:
                return Denial(401, str(exc))
            return Principal(claims.tenant, "token", claims.voice)
        keys = self.keys.refresh()
        if self.keys.error != self._reported:
            self._reported = self.keys.error
            if self.keys.error:
                log.error("%s; still using the keys read before", self.keys.error)
        tenant = keys.tenant_of(credential)
        if tenant is None:
            return Denial(401, "unknown or revoked API key")
        return Principal(tenant, "key")

    def mint(self, tenant: str, ttl_s: float, voice: str | None = None) -> str:
        return tokens.mint(self.secret, tenant, ttl_s, voice)


# -- which entry needs what -----------------------------------------------------------------

Need = Literal["nothing", "credential", "api_key"]


def need(path: str, gate: Gate, twilio_signed: bool) -> Need:
    """What `path` asks of a caller. Probes and the page are open; /metrics as configured;
    a Twilio stream proves itself by its signature where the Twilio token is set."""
    if path == "/v1/tokens":
        return "api_key"  # a token cannot mint tokens (nor outlive its own expiry)
    if path == "/v1/telephony/twilio" and twilio_signed:
        return "nothing"  # X-Twilio-Signature is checked by the stream server
    if path.startswith(("/v1/", "/tts/")):  # /tts/: the Cartesia-compatible entries
        return "credential"
    if path == "/metrics" and gate.config.metrics == "required":
        return "credential"
    return "nothing"


def query_names(path: str) -> tuple[str, ...]:
    """The query parameters a credential may come in: `access_token` (RFC 6750's name)
    anywhere, and `token` too except on a carrier's stream, whose `token` is the call's
    (the one its bot attaches with)."""
    if path.startswith("/v1/telephony/"):
        return ("access_token",)
    return ("access_token", "token", "api_key", "xi_api_key")


KEY_HEADERS = (b"x-api-key", b"xi-api-key")  # Cartesia's and ElevenLabs' clients


def credential_of(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            kind, _, credential = value.decode("latin-1").partition(" ")
            if kind.lower() == "bearer" and credential.strip():
                return credential.strip()
        elif name in KEY_HEADERS and value.strip():
            return value.decode("latin-1").strip()
    names = query_names(scope["path"])
    for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
        if name in names:
            return value
    return None


def _without_credential(path: str, query: bytes) -> bytes:
    """The query string less the credential: it must not reach logs, call parameters or
    a bot."""
    names = query_names(path)
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return urlencode([(k, v) for k, v in pairs if k not in names]).encode("latin-1")


class AuthMiddleware:
    def __init__(
        self, app: ASGIApp, gate: Gate, twilio_signed: bool, shape: Shape | None = None
    ) -> None:
        self.app = app
        self.gate = gate
        self.twilio_signed = twilio_signed
        self.shape = shape

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        needs = need(scope["path"], self.gate, self.twilio_signed)
        if needs == "nothing" or not self.gate.enabled:
            await self.app(scope, receive, send)
            return
        found = self.gate.authenticate(credential_of(scope))
        if isinstance(found, Principal) and needs == "api_key" and found.kind != "key":
            found = Denial(403, "only an API key may do this, not a session token")
        if isinstance(found, Denial):
            await _deny(scope, receive, send, found, self.shape)
            return
        scope = {
            **scope,
            SCOPE_KEY: found,
            "query_string": _without_credential(scope["path"], scope.get("query_string", b"")),
        }
        await self.app(scope, receive, send)


class _RefusalLog:
    """One INFO line a second at most for refused credentials (a client guessing keys
    must not fill the log), each with how many were left out since the last."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.last = -every_s
        self.left_out = 0

    def say(self, scope: Scope, denial: Denial) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s:
            self.left_out += 1
            return
        self.last, left_out, self.left_out = now, self.left_out, 0
        client = (scope.get("client") or ("?",))[0]
        more = f" ({left_out} more refused since the last such line)" if left_out else ""
        log.info(
            "%s %s from %s refused: %s%s",
            scope["type"],
            scope["path"],
            client,
            denial.message,
            more,
        )


_refusals = _RefusalLog()


async def _deny(
    scope: Scope, receive: Receive, send: Send, denial: Denial, shape: Shape | None
) -> None:
    _refusals.say(scope, denial)
    response = denial.response(scope["path"], shape)
    if scope["type"] == "http":
        await response(scope, receive, send)
        return
    ws = WebSocket(scope, receive, send)
    if "websocket.http.response" in scope.get("extensions", {}):
        await ws.send_denial_response(response)  # HTTP 401/403, no upgrade
    else:  # a server without the extension answers 403 to a close before accept
        await ws.close(1008, json.dumps({"code": str(denial.code)}))
