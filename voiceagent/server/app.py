"""HTTP + WebSocket server on one port (Starlette on uvicorn, uvloop, websockets).

GET  /healthz      the process is alive
GET  /readyz       ready for new sessions (model, LM engine, not draining, below limits)
GET  /metrics      Prometheus metrics
GET  /health       readiness and load, as JSON (older; /readyz is for probes)
GET  /v1/voices    voices of the loaded model (shared, and the caller's tenant's)
POST /v1/voices    a new voice from reference audio; GET, DELETE /v1/voices/{id} (voices_api.py)
POST /v1/tokens    a short-lived session token for a browser (with an API key)
WS   /v1/ws        sessions (docs/protocol.md)
POST /v1/webrtc/offer  WebRTC sessions: SDP offer in, answer out (transport/webrtc.py)
WS   /v1/telephony/{twilio,telnyx,vonage}  phone calls' media streams (docs/telephony.md)
WS   /v1/telephony/asterisk  Asterisk's WebSocket channel (and AudioSocket on its TCP port)
WS   /v1/calls     a bot attaches to a call and drives it
POST /v1/audio/speech, GET /v1/models   OpenAI-compatible speech (compat/, docs/compat.md)
WS   /tts/websocket  Cartesia-compatible streaming speech (compat/cartesia.py)
POST /tts/bytes    Cartesia-compatible speech in one request
WS   /v1/text-to-speech/{voice}/multi-stream-input  ElevenLabs-style speech (compat/elevenlabs.py)
POST /v1/tts, POST /v1/audio/voices  speech and voices from reference audio (compat/cloning.py)
GET  /             the browser demo (web/), when that folder exists

Every /v1/ and /tts/ entry needs a credential when auth is on (auth/gate.py, docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from ..auth.endpoint import mint_token
from ..auth.gate import (
    AuthConfig,
    AuthMiddleware,
    Gate,
    Principal,
    exposure_warning,
)
from ..compat.routes import compat_routes, refusal
from ..engine.embedded import EmbeddedEngine
from ..ops.metrics import CONTENT_TYPE
from ..protocol.errors import ErrorCode
from ..protocol.session import Catalog, Limits
from ..session.admission import Admission
from ..session.playout import PlayoutConfig
from ..telephony.asterisk_ws import serve_asterisk_ws
from ..telephony.audiosocket import serve_audiosocket
from ..telephony.bot_server import serve_bot
from ..telephony.call import CallRegistry, TelephonyConfig
from ..telephony.media_streams import DIALECTS
from ..telephony.stream_server import serve_media_stream
from ..transport.guard import ClientNoise, ConnectionGate, GuardConfig, NoQueryStrings
from ..transport.webrtc import WebRtcConfig, WebRtcGateway
from ..transport.websocket import serve_websocket
from .catalogs import Catalogs
from .voices_api import make_registry, voice_routes

log = logging.getLogger(__name__)

# The demo page ships beside the package in a source checkout (pip install -e).
DEFAULT_WEB_DIR = Path(__file__).resolve().parents[2] / "web"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_sessions: int = 64
    # Live turns across all sessions; a turn beyond it is refused at once (`server_busy`).
    max_live_turns: int = 128
    # SIGTERM: live turns may finish for this long, then sessions are closed (1001).
    drain_timeout_s: float = 30.0
    # Transport cap: a bigger WebSocket message is a protocol violation (close 1009).
    # Messages between limits.max_message_bytes and this get a `message_too_large` event.
    hard_max_message_bytes: int = 4 * 1024 * 1024
    limits: Limits = field(default_factory=Limits)
    playout: PlayoutConfig = field(default_factory=PlayoutConfig)
    voices_dir: Path | None = None  # voices added with `voiceagent voice add`
    voices_rescan_s: float = 2.0
    roles_file: Path | None = None  # roles: a voice and its defaults (protocol/roles.py)
    webrtc: WebRtcConfig = field(default_factory=WebRtcConfig)
    telephony: TelephonyConfig = field(default_factory=TelephonyConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    web_dir: Path | None = DEFAULT_WEB_DIR  # served at / (None: no page)
    auth: AuthConfig = field(default_factory=AuthConfig)


class VoiceServer:
    def __init__(self, engine: EmbeddedEngine, config: ServerConfig = ServerConfig()) -> None:
        self.engine = engine
        self.config = config
        self.metrics = engine.metrics
        self.gate = Gate(config.auth, config.host)
        warning = exposure_warning(config.auth, config.host)
        if warning is not None:
            log.warning(warning)
        self.admission = Admission(
            config.max_sessions,
            config.max_live_turns,
            self.metrics,
            quota=lambda tenant: self.gate.keys.refresh().quota(tenant),
        )
        self.calls = CallRegistry()
        self.connections = ConnectionGate(config.guard)
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, once it runs
        self.catalogs = Catalogs(engine, config.voices_dir, config.roles_file)
        self.catalog = self.catalogs.shared  # kept current in place by each rescan
        self.webrtc = WebRtcGateway(self, config.webrtc)
        self.registry = make_registry(self)  # voices made from reference audio
        routes: list[BaseRoute] = [
            Route("/healthz", self.healthz),
            Route("/readyz", self.readyz),
            Route("/metrics", self.metrics_page),
            Route("/health", self.health),
            *voice_routes(self.registry),
            Route("/v1/tokens", self.tokens, methods=["POST"]),
            WebSocketRoute("/v1/ws", self._websocket),
            *compat_routes(self, self.registry),
            Route("/v1/webrtc/offer", self.webrtc.offer, methods=["POST"]),
            WebSocketRoute("/v1/calls", self._bot),
            WebSocketRoute("/v1/telephony/asterisk", self._asterisk),
            *(
                WebSocketRoute(f"/v1/telephony/{carrier}", self._media_stream(carrier))
                for carrier in DIALECTS
            ),
        ]
        web = config.web_dir
        if web is not None and (web / "index.html").is_file():
            routes.append(Mount("/", StaticFiles(directory=web, html=True), name="web"))
        elif web is not None:
            log.info("no demo page at / (%s has no index.html; see serve --web)", web)
        twilio_signed = bool(config.telephony.twilio_auth_token)
        guard = Middleware(
            AuthMiddleware, gate=self.gate, twilio_signed=twilio_signed, shape=refusal
        )
        self.app = Starlette(
            routes=routes,
            lifespan=self._lifespan,
            middleware=[guard],
            exception_handlers={
                404: coded_http_error,
                405: coded_http_error,
                ClientDisconnect: client_gone,
            },
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        loop = self.loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._rescan_forever()), loop.create_task(self._await_engine())]
        t = self.telephony
        audiosocket = (
            None
            if t.audiosocket_port is None
            else await serve_audiosocket(self, t.audiosocket_host, t.audiosocket_port)
        )
        yield
        for task in tasks:
            task.cancel()
        if audiosocket is not None:
            audiosocket.close()
        await self.webrtc.close_all()  # peer connections hold sockets and tasks

    async def _await_engine(self) -> None:
        """Say clearly, with backoff, while the LM server is not reachable at start-up."""
        delay = 1.0
        while not await self.engine.ready():
            log.warning(
                "LM engine '%s' is not reachable yet; /health says not ready; retrying in %.0f s",
                self.engine.name,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
        self.metrics.ready.set(1)  # from now on each scrape and /readyz keep it current
        if delay > 1.0:
            log.info("LM engine '%s' is ready", self.engine.name)

    async def _rescan_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.voices_rescan_s)
            try:
                self.rescan_voices()  # a glob and a few stats: cheap enough for the loop
            except Exception:
                log.exception("rescanning voices failed")

    def rescan_voices(self) -> None:
        self.catalogs.rescan()

    def catalog_for(self, principal: Principal) -> Catalog:
        return self.catalogs.for_principal(principal)

    async def healthz(self, request: Request) -> JSONResponse:
        """Liveness: the event loop answers. Never depends on the LM server (a restart of
        this process would not bring SGLang back)."""
        return JSONResponse({"status": "alive"})

    async def _unready(self) -> list[str]:
        """Why no new session should come here (empty: it may); sets the ready gauge."""
        reasons = []
        if self.admission.draining:
            reasons.append("draining")
        if not await self.engine.ready():
            reasons.append(f"LM engine '{self.engine.name}' is not reachable")
        reasons += self.admission.full()
        self.metrics.ready.set(0 if reasons else 1)
        return reasons

    async def readyz(self, request: Request) -> JSONResponse:
        """Readiness: whether a new session should be sent here, and if not, why."""
        reasons = await self._unready()
        body = {"ready": not reasons, "reasons": reasons}
        return JSONResponse(body, status_code=503 if reasons else 200)

    async def metrics_page(self, request: Request) -> Response:
        await self._unready()  # the ready gauge as of this scrape
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    async def health(self, request: Request) -> JSONResponse:
        engine_ready = await self.engine.ready()
        draining = self.admission.draining
        ready = engine_ready and not draining
        return JSONResponse(
            {
                "status": "draining" if draining else "ok" if ready else "engine_unavailable",
                "ready": ready,
                "engine": self.engine.name,
                "model": self.catalog.model["name"],
                "sessions": self.admission.sessions,
                "max_sessions": self.config.max_sessions,
                "random_weights": self.catalog.model["random_weights"],
                "lm_load": self.engine.lm.load,
            },
            status_code=200 if ready else 503,  # load balancers route around us
        )

    async def tokens(self, request: Request) -> JSONResponse:
        return await mint_token(
            request,
            self.gate,
            lambda who: self.catalog_for(who).voices,
            self.config.auth.token_ttl_s,
        )

    # -- SessionHost: what transports need to open sessions --------------------------------

    @property
    def limits(self) -> Limits:
        return self.config.limits

    @property
    def playout(self) -> PlayoutConfig:
        return self.config.playout

    @property
    def telephony(self) -> TelephonyConfig:
        return self.config.telephony

    @property
    def guard(self) -> GuardConfig:
        return self.config.guard

    async def _websocket(self, ws: WebSocket) -> None:
        await serve_websocket(self, ws)

    async def _bot(self, ws: WebSocket) -> None:
        await serve_bot(self, ws)

    async def _asterisk(self, ws: WebSocket) -> None:
        await serve_asterisk_ws(self, ws)

    def _media_stream(self, carrier: str) -> Callable[[WebSocket], Awaitable[None]]:
        async def serve(ws: WebSocket) -> None:
            await serve_media_stream(self, ws, carrier)

        return serve


def uvicorn_config(server: VoiceServer, log_level: str = "info") -> uvicorn.Config:
    uvicorn_log = logging.getLogger("uvicorn.error")
    for kind in (ClientNoise, NoQueryStrings):
        if not any(isinstance(f, kind) for f in uvicorn_log.filters):
            uvicorn_log.addFilter(kind())
    return uvicorn.Config(
        server.app,
        host=server.config.host,
        port=server.config.port,
        loop="uvloop",
        ws="websockets-sansio",
        ws_max_size=server.config.hard_max_message_bytes,
        ws_per_message_deflate=False,  # a small deflated frame may inflate to 4 MiB to read
        log_level=log_level,
        log_config=None,  # uvicorn's lines go through our formatter (ops/logs.py)
        access_log=False,  # one line per request on stdout is noise for a WebSocket server
        lifespan="on",
    )


class DrainingServer(uvicorn.Server):
    """Uvicorn, except that SIGTERM drains first: /readyz turns unready, new sessions are
    refused, live turns finish (up to the drain deadline), sessions close with 1001; then
    uvicorn shuts down and the process exits 0. A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, voice: VoiceServer) -> None:
        super().__init__(config)
        self.voice = voice
        self._drain: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self._drain is not None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        # Not super(): uvicorn would re-raise SIGTERM at exit, and the exit code would be
        # 143 for a shutdown that went as planned.
        # The handler runs in whatever the main thread was doing, a session's task maybe:
        # in a context of its own, so the drain's lines carry no session's ids.
        fresh = contextvars.Context()
        timeout = self.voice.config.drain_timeout_s
        fresh.run(log.info, "SIGTERM: draining for up to %.0f s", timeout)
        asyncio.get_event_loop().call_soon_threadsafe(self._start_drain, context=fresh)

    def _start_drain(self) -> None:
        async def drain() -> None:
            try:
                await self.voice.admission.drain(self.voice.config.drain_timeout_s)
            finally:
                self.should_exit = True

        self._drain = asyncio.get_running_loop().create_task(drain())


HTTP_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}


async def coded_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 (no such path, or not that method) as coded JSON
    errors like every other refusal, not plain text."""
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES[exc.status_code]
    message = f"{request.method} {request.url.path[:200]} is not served here ({exc.detail})"
    return JSONResponse(
        {"type": "error", "code": str(code), "message": message},
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def client_gone(request: Request, exc: Exception) -> Response:
    """A client that hung up while its body came in: nothing went wrong here (Starlette
    would log it as an error with a traceback)."""
    log.debug("%s %s: the client went away", request.method, request.url.path[:200])
    return Response(status_code=499)  # (nobody reads it)


async def serve(server: VoiceServer, log_level: str = "info") -> None:
    server.engine.start()
    try:
        await DrainingServer(uvicorn_config(server, log_level), server).serve()
    finally:
        server.engine.stop()
        await asyncio.sleep(0)
