"""Asterisk's WebSocket channel (chan_websocket) at WS /v1/telephony/asterisk: Asterisk
dials us (websocket_client.conf), sends MEDIA_START, then the caller's audio as binary
messages and control as text; it queues what we send and plays it at 20 ms a frame.

We pause on MEDIA_XOFF until MEDIA_XON, FLUSH_MEDIA on cancel, and send MARK_MEDIA marks
(Asterisk 20.18 / 22.8 / 23.2 answer MEDIA_MARK_PROCESSED when playout reaches them;
older ones ignore them and the played position is the runner's estimate). The token and
settings come as URL parameters, from the dial string's v() option.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..audio.format import FRAME_MS
from ..auth.gate import principal_of
from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.session import SendAudio
from ..transport.guard import GuardConfig
from . import asterisk_ws_control as ctl
from .call import CallHost, CallRefused, CallTransport, run_call
from .events import (
    CallerAudio,
    CallInfo,
    CarrierError,
    CarrierEvent,
    Dtmf,
    Ignored,
    Invalid,
    MarkEchoed,
    Stopped,
)
from .marks import MarkBook
from .media_streams import to_pcm16
from .stream_server import messages

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0


class AsteriskWebSocketTransport(CallTransport):
    def __init__(
        self, ws: WebSocket, info: CallInfo, fmt: ctl.ControlFormat, mark_every_ms: int
    ) -> None:
        super().__init__(info)
        self.ws = ws
        self.fmt = fmt
        self.marks = MarkBook(mark_every_ms // FRAME_MS)
        self.may_send = asyncio.Event()  # cleared between MEDIA_XOFF and MEDIA_XON
        self.may_send.set()

    async def _command(self, name: str, correlation_id: str | None = None) -> None:
        await self.ws.send_text(ctl.command(name, self.fmt, correlation_id))

    async def send_audio(self, frame: SendAudio) -> None:
        await self.may_send.wait()  # Asterisk's queue is full: wait, the runner waits too
        await self.ws.send_bytes(frame.payload)  # one whole 20 ms frame, as Asterisk wants
        name = self.marks.sent(frame.num)
        if name is not None:
            await self._command(ctl.MARK_MEDIA, name)

    async def end_turn(self, num: int) -> None:
        name = self.marks.end(num)
        if name is not None:
            await self._command(ctl.MARK_MEDIA, name)

    async def drop_turn(self, num: int) -> None:
        if self.marks.has_audio(num):
            self.marks.clear(num)
            await self._command(ctl.FLUSH_MEDIA)

    def played(self, mark: str) -> tuple[int, int] | None:
        return self.marks.echoed(mark)

    async def hangup(self) -> None:
        with contextlib.suppress(Exception):
            await self._command(ctl.HANGUP)
            await self.ws.close(CloseCode.NORMAL, "call ended by the bot")


async def _events(
    ws: WebSocket,
    transport: list[AsteriskWebSocketTransport],
    codec: list[str],
    guard: GuardConfig,
) -> AsyncGenerator[CarrierEvent, None]:
    """Asterisk's messages as carrier events, ending with Stopped: Asterisk hangs up by
    closing the socket. `transport`/`codec` are filled in once the call is set up (flow
    control and decoding need them)."""
    async for message in messages(ws, guard):
        if isinstance(message, Stopped):
            yield message
            return
        data, text = message.get("bytes"), message.get("text")
        if data is not None:
            try:
                yield CallerAudio(to_pcm16(codec[0], data) if codec else b"")
            except ValueError as exc:
                yield Invalid(f"media: {exc}")
            continue
        try:
            event = ctl.parse_event(text or "")
        except ValueError as exc:
            yield Invalid(f"control message: {exc}")
            continue
        if isinstance(event, ctl.MediaStart):
            yield Ignored("MEDIA_START") if codec else Invalid("MEDIA_START")
        elif isinstance(event, ctl.DtmfEnd):
            yield Dtmf(event.digit)
        elif isinstance(event, ctl.MediaXoff | ctl.MediaXon):
            if transport:
                flow = transport[0].may_send
                flow.clear() if isinstance(event, ctl.MediaXoff) else flow.set()
            yield Ignored(type(event).__name__)
        elif isinstance(event, ctl.MediaMarkProcessed):
            yield MarkEchoed(event.correlation_id or "")
        elif isinstance(event, ctl.Error):
            yield CarrierError(event.error_text[:120])
        else:
            yield Ignored(type(event).__name__)


async def serve_asterisk_ws(host: CallHost, ws: WebSocket) -> None:
    offered = ws.headers.get("sec-websocket-protocol", "")
    subprotocols = [p.strip() for p in offered.split(",")]
    await ws.accept(subprotocol=ctl.SUBPROTOCOL if ctl.SUBPROTOCOL in subprotocols else None)
    transport_box: list[AsteriskWebSocketTransport] = []
    codec_box: list[str] = []
    events = _events(ws, transport_box, codec_box, host.guard)
    try:
        start = await asyncio.wait_for(ws.receive_text(), START_TIMEOUT_S)
        media_start = ctl.parse_event(start)
        if not isinstance(media_start, ctl.MediaStart):
            raise ValueError("the first message must be MEDIA_START")
        media = media_start.media
        if media.codec not in ("mulaw", "alaw", "pcm16") or media.sample_rate not in (8000, 16000):
            raise ValueError(f"format {media.name} is not served: use ulaw, alaw, slin or slin16")
    except (TimeoutError, ValueError, KeyError, WebSocketDisconnect, RuntimeError) as exc:
        log.warning("asterisk websocket closed before its call started: %s", exc)
        with contextlib.suppress(Exception):
            await ws.close(CloseCode.POLICY_VIOLATION, str(exc)[:120])
        return
    fmt = ctl.ControlFormat.JSON if start.lstrip().startswith("{") else ctl.ControlFormat.PLAIN
    params = {k: v[:512] for k, v in list(ws.query_params.items())[:64]}
    call_id = media_start.channel_id or media_start.channel or media_start.connection_id
    info = CallInfo("asterisk", call_id, media_start.connection_id, media.codec, media.sample_rate)
    info = CallInfo(**{**info.__dict__, "params": params})
    transport = AsteriskWebSocketTransport(ws, info, fmt, host.telephony.mark_every_ms)
    transport.principal = principal_of(ws)
    transport_box.append(transport)
    codec_box.append(media.codec)
    try:
        await transport._command(ctl.ANSWER)  # needed with the n() dial option, harmless else
        await run_call(host, transport, events)
    except CallRefused as refused:
        log.warning("asterisk call %s refused: %s", call_id, refused)
        busy = refused.code in (ErrorCode.TOO_MANY_SESSIONS, ErrorCode.QUOTA_EXCEEDED)
        with contextlib.suppress(Exception):
            await transport._command(ctl.HANGUP)
            code = CloseCode.TRY_AGAIN_LATER if busy else CloseCode.POLICY_VIOLATION
            await ws.close(code, str(refused)[:120])
    finally:
        await events.aclose()
