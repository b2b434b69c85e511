"""The WebSocket side shared by the streaming drop-in APIs (Cartesia's `/tts/websocket`,
ElevenLabs' multi-context input streaming): one socket carries several utterances, each
named by the client ("contexts"), synthesized side by side and sent as fast as they are
made.

The dialect (cartesia.py, elevenlabs.py) parses messages and formats replies; this module
owns what every socket needs: the connection and session slots (it is a session for
admission, drain and quotas), the message rate, the idle timeout, the slow reader, and
one pump task per context that is dropped on cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any

import numpy as np
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..auth.gate import Principal, principal_of
from ..ops.logs import bind
from ..protocol.errors import CloseCode, ErrorCode
from ..session.port import SessionHost
from ..text.timing import SpokenSegment
from ..transport.guard import Deadlines, MessageGate, Verdict
from .utterance import ApiError, SpeechOptions, Utterance

log = logging.getLogger(__name__)


class ContextSocket(ABC):
    api: str  # the metrics' transport label
    drains_when_idle = True  # a draining server closes the socket once no context is live
    # The longest the socket may have nothing to do (no message, no context with work)
    # when guard.idle_timeout_s is longer or off; None: the dialect watches that itself.
    quiet_limit_s: float | None = None

    def __init__(self, host: SessionHost, ws: WebSocket, principal: Principal) -> None:
        self.host = host
        self.ws = ws
        self.principal = principal
        self.contexts: dict[str, Utterance] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self.stalled = False
        self.reader: asyncio.Task[Any] | None = None  # the socket's read loop
        self._idle_at = asyncio.get_running_loop().time()  # when the last context ended

    # -- for the dialect ------------------------------------------------------------------

    @abstractmethod
    async def on_text(self, text: str) -> None:
        """One text message from the client."""

    @abstractmethod
    async def send_audio(self, context_id: str, pcm: np.ndarray) -> None:
        """Audio of a context, float32 at the context's rate, as soon as it is made."""

    @abstractmethod
    async def send_timing(self, context_id: str, segment: SpokenSegment) -> None:
        """Where a segment's words fall in the context's audio (if the client asked)."""

    @abstractmethod
    async def send_done(self, context_id: str) -> None:
        """The context's last audio has been sent."""

    @abstractmethod
    async def write_error(self, context_id: str | None, error: ApiError) -> None:
        """A refusal or failure, of one context or of the socket, in the API's shape."""

    def http_error(self, error: ApiError) -> Response:
        """A refusal before the upgrade, in the API's shape (the dialect's)."""
        return JSONResponse(error.body(), status_code=error.status)

    async def send_error(self, context_id: str | None, error: ApiError) -> None:
        if not error.counted:
            self.host.engine.metrics.errors.labels(str(error.code)).inc()
        await self.write_error(context_id, error)

    def open(self, context_id: str, options: SpeechOptions) -> Utterance:
        """A new context (raises ApiError: unknown voice, server busy, ...)."""
        utterance = Utterance(self.host, self.principal, options, self.api, context_id)
        self.contexts[context_id] = utterance
        self._pumps[context_id] = asyncio.get_running_loop().create_task(
            self._pump(context_id, utterance)
        )
        return utterance

    def cancel(self, context_id: str) -> bool:
        """Stop a context at once: nothing more of it is sent. False: no such context."""
        utterance = self.contexts.pop(context_id, None)
        pump = self._pumps.pop(context_id, None)
        if pump is not None:
            pump.cancel()
        if utterance is None:
            return False
        utterance.close()
        self._note_if_idle()
        return True

    async def send_json(self, message: dict[str, Any]) -> None:
        """Send one message; a client that stopped reading for `send_timeout_s` ends the
        socket (its buffers are full: nothing more reaches it)."""
        try:
            async with asyncio.timeout(self.host.guard.send_timeout_s):
                await self.ws.send_text(json.dumps(message))
        except TimeoutError:
            self.stalled = True
            if self.reader not in (None, asyncio.current_task()):
                self.reader.cancel()  # it waits for the client's next message
            raise ConnectionError("the client stopped reading") from None
        except (RuntimeError, WebSocketDisconnect) as exc:
            raise ConnectionError("the connection is closed") from exc

    # -- for admission and drain (a LiveSession) ------------------------------------------

    @property
    def idle(self) -> bool:
        return not self.contexts

    @property
    def idle_since(self) -> float | None:
        """Since when (the event loop's clock) the socket has had nothing to do: its last
        context ended, or every live one has said all its text so far and waits for more.
        None while one has work."""
        if self.idle:
            return self._idle_at
        waits = [self.waiting_since(context_id) for context_id in self.contexts]
        return None if None in waits else max(w for w in waits if w is not None)

    def waiting_since(self, context_id: str) -> float | None:
        """Since when a live context has waited for more text with nothing left to send
        (None: it has work)."""
        return self.contexts[context_id].turn.waiting_since

    def _note_if_idle(self) -> None:
        if self.idle:
            self._idle_at = asyncio.get_running_loop().time()

    @property
    def transport(self) -> ContextSocket:
        return self

    async def close(self, code: int, reason: str) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close(code, reason)

    # -- inside ---------------------------------------------------------------------------

    async def _pump(self, context_id: str, utterance: Utterance) -> None:
        try:
            async for piece in utterance.pieces():
                if isinstance(piece, SpokenSegment):
                    await self.send_timing(context_id, piece)
                else:
                    await self.send_audio(context_id, piece)
            await self.send_done(context_id)
        except ApiError as exc:
            with contextlib.suppress(ConnectionError):
                await self.send_error(context_id, exc)
        except ConnectionError:
            pass  # the socket is going; the loop below ends it
        except Exception:
            log.exception("%s context %r failed", self.api, context_id[:64])
        finally:
            utterance.close()
            if self._pumps.get(context_id) is asyncio.current_task():
                del self._pumps[context_id]
                del self.contexts[context_id]
                self._note_if_idle()

    def close_all(self) -> None:
        for context_id in list(self.contexts):
            self.cancel(context_id)


async def serve_context_socket(host: SessionHost, ws: WebSocket, socket: ContextSocket) -> None:
    """Accept and run one socket: the same protection as a session's (transport/guard.py)."""
    loop = asyncio.get_running_loop()
    guard = host.guard
    if not host.connections.admit(ws.client.host if ws.client else None, loop.time()):
        host.engine.metrics.refused.labels(str(ErrorCode.RATE_LIMITED)).inc()
        why = "too many new connections from this address"
        refused = socket.http_error(ApiError(ErrorCode.RATE_LIMITED, why, 429))
        refused.headers["Retry-After"] = "1"
        await ws.send_denial_response(refused)
        return
    await ws.accept()
    tenant = principal_of(ws).tenant
    refusal = host.admission.admit(socket.api, tenant)
    if refusal is not None:
        await socket.send_error(None, ApiError(refusal.code, refusal.message))
        await ws.close(CloseCode.TRY_AGAIN_LATER, str(refusal.code))
        return
    host.admission.runners.add(socket)
    bind(session_id=uuid.uuid4().hex[:16])  # the log lines of its contexts name the socket
    socket.reader = asyncio.current_task()
    gate = MessageGate(guard)
    idle_s = guard.idle_timeout_s
    if socket.quiet_limit_s is not None:
        idle_s = min(idle_s, socket.quiet_limit_s) if idle_s > 0 else socket.quiet_limit_s
    deadlines = Deadlines(replace(guard, idle_timeout_s=idle_s), loop.time())
    # These APIs have no session.start: a socket is a started session from its accept.
    # Their clients open one before there is text (Pipecat at the pipeline's start,
    # LiveKit's prewarm), so a quiet socket only meets the idle timeouts.
    started = True
    ended: ErrorCode | None = None
    try:
        while ended is None:
            deadline = deadlines.next(loop.time(), started, socket.idle_since)
            try:
                async with asyncio.timeout_at(deadline):
                    message = await ws.receive()
            except TimeoutError:
                ended = deadlines.expired(loop.time(), started, socket.idle_since)
                continue
            if message["type"] == "websocket.disconnect":
                break
            deadlines.heard(loop.time())
            verdict = gate.check(loop.time())
            if verdict is Verdict.CLOSE:
                ended = ErrorCode.RATE_LIMITED
                continue
            await asyncio.sleep(gate.delay)  # over the rate: TCP holds the client back
            text = message.get("text")
            if text is None:
                error = ApiError(ErrorCode.UNEXPECTED_BINARY, "this socket takes JSON text")
                await socket.send_error(None, error)
                continue
            await socket.on_text(text)
    except (WebSocketDisconnect, ConnectionError):
        pass
    except asyncio.CancelledError:
        if not socket.stalled:
            raise
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
    except Exception:
        log.exception("%s socket failed", socket.api)
    finally:
        socket.close_all()
        host.admission.runners.discard(socket)
        host.admission.release(socket.api, tenant)
    if socket.stalled:
        ended = ErrorCode.SLOW_CONSUMER
    if ended is not None:
        host.engine.metrics.closed.labels(str(ended)).inc()
        if ended is not ErrorCode.SLOW_CONSUMER:
            with contextlib.suppress(Exception):
                await socket.send_error(None, ApiError(ended, f"socket closed: {ended}"))
                await ws.close(CloseCode.POLICY_VIOLATION, str(ended))
