"""Twilio, Telnyx and Vonage media streams (WS /v1/telephony/{carrier}): the carrier
connects to us, starts the call, streams the caller's audio and plays ours.

We send each frame as the runner paces it (`lead_ms` ahead of real time, so a `clear`
drops little), a mark after every `mark_every_ms` of a turn, and `clear` on cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect
from twilio.request_validator import RequestValidator

from ..audio.format import FRAME_MS
from ..auth.gate import principal_of
from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.session import SendAudio
from ..transport.guard import GuardConfig, MessageGate, Verdict
from .call import CallHost, CallRefused, CallTransport, TelephonyConfig, run_call
from .events import CarrierEvent, Invalid, Started, Stopped
from .marks import MarkBook
from .media_streams import DIALECTS, Dialect

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0  # a carrier sends `start` at once


class MediaStreamTransport(CallTransport):
    def __init__(
        self, ws: WebSocket, dialect: Dialect, mark_every_ms: int, send_timeout_s: float = 10.0
    ) -> None:
        assert dialect.info is not None
        super().__init__(dialect.info)
        self.ws = ws
        self.send_timeout_s = send_timeout_s
        self.dialect = dialect
        self.marks = MarkBook(mark_every_ms // FRAME_MS)

    async def _send(self, message: str | bytes | None) -> None:
        try:
            async with asyncio.timeout(self.send_timeout_s):
                if isinstance(message, bytes):
                    await self.ws.send_bytes(message)
                elif message is not None:
                    await self.ws.send_text(message)
        except TimeoutError:
            raise ConnectionError("the carrier stopped reading") from None

    async def send_audio(self, frame: SendAudio) -> None:
        await self._send(self.dialect.media(frame.payload))
        name = self.marks.sent(frame.num)
        if name is not None:
            await self._send(self.dialect.mark(name))

    async def end_turn(self, num: int) -> None:
        name = self.marks.end(num)
        if name is not None:
            await self._send(self.dialect.mark(name))

    async def drop_turn(self, num: int) -> None:
        # A turn that sent nothing has nothing at the carrier; clearing would cut the
        # turn that is playing.
        if self.marks.has_audio(num):
            self.marks.clear(num)
            await self._send(self.dialect.clear())

    def played(self, mark: str) -> tuple[int, int] | None:
        return self.marks.echoed(mark)

    async def hangup(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close(CloseCode.NORMAL, "call ended by the bot")


def twilio_signature_ok(config: TelephonyConfig, ws: WebSocket) -> bool:
    """Twilio signs the stream URL it connects to with the account's auth token. Behind
    a proxy the URL we see differs: `public_url` says what Twilio used."""
    if not config.twilio_auth_token:
        return True
    signature = ws.headers.get("x-twilio-signature", "")
    path = ws.url.path + (f"?{ws.url.query}" if ws.url.query else "")
    if config.public_url:
        base = config.public_url.rstrip("/").replace("https://", "wss://", 1)
        candidates = [base.replace("http://", "ws://", 1) + path]
    else:  # TLS may end at a proxy: Twilio used wss:// where we see ws://
        candidates = [f"wss://{ws.url.netloc}{path}", f"ws://{ws.url.netloc}{path}"]
    validator = RequestValidator(config.twilio_auth_token)
    return any(validator.validate(url, {}, signature) for url in candidates)


async def carrier_events(
    ws: WebSocket, dialect: Dialect, max_bytes: int, guard: GuardConfig
) -> AsyncGenerator[CarrierEvent, None]:
    """The carrier's messages as events, ending with Stopped when it goes away (or
    floods)."""
    async for message in messages(ws, guard):
        if isinstance(message, Stopped):
            yield message
            return
        text, data = message.get("text"), message.get("bytes")
        size = len(text) if text is not None else len(data or b"")
        if size > max_bytes:
            yield Invalid(f"message of {size} bytes (limit {max_bytes})")
        elif text is not None:
            yield dialect.parse_text(text)
        elif data is not None:
            yield dialect.parse_bytes(data)


async def messages(
    ws: WebSocket, guard: GuardConfig
) -> AsyncGenerator[dict[str, Any] | Stopped, None]:
    """A carrier's socket messages, read no faster than the guard's message rate (the
    rest waits in the network), then Stopped: gone, or held back too long (a flood)."""
    gate = MessageGate(guard)
    while (message := await receive(ws)) is not None:
        if await gate.pace() is Verdict.CLOSE:
            yield Stopped(str(ErrorCode.RATE_LIMITED))
            return
        yield message
    yield Stopped("disconnected")


async def receive(ws: WebSocket) -> dict[str, Any] | None:
    """The next message from a carrier's socket; None once it is gone."""
    try:
        message = await ws.receive()
    except (WebSocketDisconnect, RuntimeError):
        return None
    return None if message["type"] == "websocket.disconnect" else dict(message)


async def serve_media_stream(host: CallHost, ws: WebSocket, carrier: str) -> None:
    config = host.telephony
    if carrier == "twilio" and not twilio_signature_ok(config, ws):
        log.warning("twilio stream refused: X-Twilio-Signature does not match")
        await ws.close(CloseCode.POLICY_VIOLATION)  # before accept: HTTP 403
        return
    await ws.accept()
    dialect = DIALECTS[carrier]()
    events = carrier_events(ws, dialect, host.limits.max_message_bytes, host.guard)
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            async for event in events:
                if isinstance(event, Started | Stopped):
                    break
                if isinstance(event, Invalid):  # no call yet: nobody to tell but the log
                    log.warning("%s stream closed before its start: %s", carrier, event.reason)
                    await ws.close(CloseCode.POLICY_VIOLATION, event.reason[:120])
                    return
    except TimeoutError:
        log.warning("%s stream sent no start in %.0f s", carrier, START_TIMEOUT_S)
        await ws.close(CloseCode.POLICY_VIOLATION, "no start")
        return
    if dialect.info is None:
        return  # gone before its start
    transport = MediaStreamTransport(ws, dialect, config.mark_every_ms, host.guard.send_timeout_s)
    transport.principal = principal_of(ws)
    try:
        await run_call(host, transport, events)
    except CallRefused as refused:
        log.warning("call %s (%s) refused: %s", dialect.info.call_id, carrier, refused)
        busy = refused.code in (ErrorCode.TOO_MANY_SESSIONS, ErrorCode.QUOTA_EXCEEDED)
        code = CloseCode.TRY_AGAIN_LATER if busy else CloseCode.POLICY_VIOLATION
        with contextlib.suppress(Exception):
            await ws.close(code, str(refused)[:120])
    finally:
        await events.aclose()
