"""WebSocket sessions (WS /v1/ws): JSON events as text messages, each audio frame as one
binary message (protocol/frames.py header + payload; or bare, or as Twilio messages: the
`format.framing` setting), microphone PCM16 as binary in."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any

import numpy as np
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..audio.format import MULAW_RATE
from ..auth.gate import principal_of
from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.frames import AudioFrame, pack
from ..protocol.messages import Format
from ..protocol.session import SendAudio, SendEvent, SessionCore, error_event
from ..session.port import SessionHost, Transport
from ..session.runner import SessionRunner
from ..telephony.events import CallerAudio, CallInfo, CarrierEvent, Invalid, MarkEchoed
from ..telephony.marks import MarkBook
from ..telephony.media_streams import TWILIO, JsonStream
from .guard import CLOSING, RATE_MESSAGE, Deadlines, MessageGate, Verdict

log = logging.getLogger(__name__)


class WebSocketTransport(Transport):
    name = "websocket"

    def __init__(self, ws: WebSocket, core: SessionCore, send_timeout_s: float = 10.0) -> None:
        self.ws = ws
        self.core = core
        self.send_timeout_s = send_timeout_s
        self.stalled = False  # a send blocked past send_timeout_s: the client stopped reading
        self.session_task = asyncio.current_task()  # cancelled when the client stalls
        # `twilio` framing: the Twilio messages a bot forwards, and the marks it echoes back
        self.marks = MarkBook()
        self._twilio = JsonStream(TWILIO)
        # each playing turn's framing: its own, though the session's changes meanwhile
        self._framing: dict[int, tuple[str, str]] = {}

    async def _send(self, data: str | bytes) -> None:
        """Send one message; a client that stopped reading ends its session after
        `send_timeout_s` (its buffer is full, so nothing more reaches it anyway)."""
        try:
            async with asyncio.timeout(self.send_timeout_s):
                if isinstance(data, str):
                    await self.ws.send_text(data)
                else:
                    await self.ws.send_bytes(data)
        except TimeoutError:
            self.stalled = True
            if self.session_task not in (None, asyncio.current_task()):
                self.session_task.cancel()  # it waits for the client's next message
            raise ConnectionError("the client stopped reading") from None
        except (RuntimeError, WebSocketDisconnect) as exc:  # closed under us
            raise ConnectionError("the connection is closed") from exc

    async def send_event(self, event: dict[str, Any]) -> None:
        await self._send(json.dumps(event))

    async def send_audio(self, frame: SendAudio) -> None:
        self._framing[frame.num] = (frame.framing, frame.stream_sid)
        if frame.framing == "raw":
            await self._send(frame.payload)
        elif frame.framing == "twilio":
            await self._send(self._twilio_stream(frame.stream_sid).media(frame.payload))
            name = self.marks.sent(frame.num)
            if name is not None:
                await self._send(self._twilio.mark(name))
        else:
            header = AudioFrame(frame.codec, frame.num, frame.seq, frame.pts_ms, frame.payload)
            await self._send(pack(header))

    async def end_turn(self, num: int) -> None:
        framing = self._turn_framing(num)
        name = self.marks.end(num)
        if name is not None and framing == "twilio":
            await self._send(self._twilio.mark(name))

    async def drop_turn(self, num: int) -> None:
        """Nothing is queued here (the runner sends each frame when it is due); with
        `twilio` framing the bot forwards our `clear` to drop what Twilio buffers."""
        framing = self._turn_framing(num)
        if self.marks.has_audio(num) and framing == "twilio":
            self.marks.clear(num)
            await self._send(self._twilio.clear())

    def _turn_framing(self, num: int) -> str:
        """The framing turn `num`'s frames went out in; forgotten now (the turn is done)."""
        framing, _ = self._framing.pop(num, (self._format().framing, ""))
        return framing

    async def close(self, code: int, reason: str) -> None:
        with contextlib.suppress(Exception):  # already closed, or the peer is gone
            await self.ws.close(code, reason)

    def forwarded(self, text: str) -> CarrierEvent | None:
        """A Twilio message the bot forwarded (mark echoes, the caller's media), when the
        session uses `twilio` framing; None for our own protocol's messages."""
        fmt = self._format()
        if fmt.framing != "twilio" or '"event"' not in text or '"type"' in text:
            return None
        return self._twilio_stream(fmt.stream_sid).parse_text(text)

    def _format(self) -> Format:
        return self.core.settings.format if self.core.settings else Format()

    def _twilio_stream(self, sid: str) -> JsonStream:
        if self._twilio.info is None or self._twilio.info.stream_id != sid:
            self._twilio.info = CallInfo("twilio", sid, sid, "mulaw", MULAW_RATE)
        return self._twilio


async def serve_websocket(host: SessionHost, ws: WebSocket) -> None:
    """One WebSocket session, from accept to close."""
    loop = asyncio.get_running_loop()
    guard = host.guard
    if not host.connections.admit(ws.client.host if ws.client else None, loop.time()):
        host.engine.metrics.refused.labels(str(ErrorCode.RATE_LIMITED)).inc()
        await ws.send_denial_response(rate_limited_response())  # HTTP 429, no upgrade
        return
    await ws.accept()
    who = principal_of(ws)  # the credential was checked before the upgrade (auth/gate.py)
    refusal = host.admission.admit(WebSocketTransport.name, who.tenant)
    if refusal is not None:
        host.engine.metrics.errors.labels(str(refusal.code)).inc()
        await ws.send_text(json.dumps(error_event(refusal.code, refusal.message)))
        await ws.close(CloseCode.TRY_AGAIN_LATER, str(refusal.code))
        return
    core = SessionCore(
        uuid.uuid4().hex[:16],
        host.catalog_for(who),
        host.limits,
        budget=host.admission.tenant(who.tenant),
    )
    transport = WebSocketTransport(ws, core, guard.send_timeout_s)
    runner = SessionRunner(core, host.engine, transport, host.playout, host.admission)
    gate = MessageGate(guard)
    deadlines = Deadlines(guard, loop.time())
    ended: ErrorCode | None = None  # why the server ends the session, if it does
    try:
        while ended is None:
            deadline = deadlines.next(loop.time(), core.started, runner.idle_since)
            try:
                async with asyncio.timeout_at(deadline):
                    message = await ws.receive()
            except TimeoutError:
                ended = deadlines.expired(loop.time(), core.started, runner.idle_since)
                continue
            if message["type"] == "websocket.disconnect":
                break
            deadlines.heard(loop.time())
            verdict = gate.check(loop.time())
            if verdict is Verdict.CLOSE:
                ended = ErrorCode.RATE_LIMITED
                continue
            if verdict is Verdict.WARN:
                await runner.execute([SendEvent(error_event(ErrorCode.RATE_LIMITED, RATE_MESSAGE))])
            # Over the rate, wait before the next read: uvicorn reads no more from this
            # socket meanwhile, so TCP holds the client back. Within it, still yield once:
            # a burst already read must not hold up other sessions' paced frames.
            await asyncio.sleep(gate.delay)
            await _handle(runner, transport, message)
    except (WebSocketDisconnect, ConnectionError):
        pass
    except asyncio.CancelledError:
        if not transport.stalled:
            raise
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
    except Exception:
        log.exception("session %s failed", core.session_id)
    finally:
        host.admission.release(WebSocketTransport.name, who.tenant)
        await runner.close()
    if transport.stalled:
        ended = ErrorCode.SLOW_CONSUMER
    if ended is not None:
        await _end(host, transport, ended)


async def _handle(runner: SessionRunner, transport: WebSocketTransport, message: Any) -> None:
    text = message.get("text")
    if text is not None and (event := transport.forwarded(text)) is not None:
        await act_on_forwarded(runner, transport, event)
    elif text is not None:
        await runner.on_text(text)
    elif message.get("bytes") is not None:
        await runner.on_bytes(message["bytes"])


async def _end(host: SessionHost, transport: WebSocketTransport, code: ErrorCode) -> None:
    """The server closes the session: say why (unless the client stopped reading), then
    close with 1008 (a flooder's connection is dropped instead)."""
    host.engine.metrics.closed.labels(str(code)).inc()
    log.info("session %s closed: %s", transport.core.session_id, code)
    if code is ErrorCode.SLOW_CONSUMER:
        return  # nothing more can reach it; the connection goes when the client does
    host.engine.metrics.errors.labels(str(code)).inc()
    with contextlib.suppress(Exception):
        await transport.ws.send_text(json.dumps(error_event(code, CLOSING[code])))
        if code is ErrorCode.RATE_LIMITED:
            # No close handshake: while uvicorn waited for a flooder's close reply it would
            # go on reading (and parsing) the flood. Returning drops the connection now.
            return
        await transport.ws.close(CloseCode.POLICY_VIOLATION, str(code))


def rate_limited_response() -> JSONResponse:
    """HTTP 429 for an address opening connections too fast."""
    body = error_event(ErrorCode.RATE_LIMITED, "too many new connections from this address")
    return JSONResponse(body, status_code=429, headers={"Retry-After": "1"})


async def act_on_forwarded(
    runner: SessionRunner, transport: WebSocketTransport, event: Any
) -> None:
    """Act on a Twilio message a bot forwarded: its mark echoes give the played position,
    its caller audio feeds voice activity (barge-in); the rest needs nothing from us."""
    if isinstance(event, MarkEchoed):
        played = transport.marks.echoed(event.name)
        if played is not None:
            await runner.listener_played(*played)
    elif isinstance(event, CallerAudio):
        await runner.hear(np.frombuffer(event.pcm, dtype="<i2"), MULAW_RATE)
    elif isinstance(event, Invalid):
        error = error_event(ErrorCode.INVALID_CARRIER_MESSAGE, event.reason)
        await runner.execute([SendEvent(error)])
