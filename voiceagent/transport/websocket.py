"""WebSocket sessions (WS /v1/ws): JSON events as text messages, each audio frame as one
binary message (protocol/frames.py header + payload; or bare, or as Twilio messages: the
`format.framing` setting), microphone PCM16 as binary in."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..audio.format import MULAW_RATE
from ..auth.gate import principal_of
from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.frames import AudioFrame, pack
from ..protocol.messages import Format
from ..protocol.session import SendAudio, SessionCore, error_event
from ..session.port import SessionHost, Transport
from ..session.runner import SessionRunner
from ..telephony.events import CallerAudio, CallInfo, CarrierEvent, Invalid, MarkEchoed
from ..telephony.marks import MarkBook
from ..telephony.media_streams import TWILIO, JsonStream

log = logging.getLogger(__name__)


class WebSocketTransport(Transport):
    name = "websocket"

    def __init__(self, ws: WebSocket, core: SessionCore) -> None:
        self.ws = ws
        self.core = core
        # `twilio` framing: the Twilio messages a bot forwards, and the marks it echoes back
        self.marks = MarkBook()
        self._twilio = JsonStream(TWILIO)

    async def send_event(self, event: dict[str, Any]) -> None:
        await self.ws.send_text(json.dumps(event))

    async def send_audio(self, frame: SendAudio) -> None:
        fmt = self._format()
        if fmt.framing == "raw":
            await self.ws.send_bytes(frame.payload)
        elif fmt.framing == "twilio":
            await self.ws.send_text(self._twilio_stream(fmt.stream_sid).media(frame.payload))
            name = self.marks.sent(frame.num)
            if name is not None:
                await self.ws.send_text(self._twilio.mark(name))
        else:
            header = AudioFrame(frame.codec, frame.num, frame.seq, frame.pts_ms, frame.payload)
            await self.ws.send_bytes(pack(header))

    async def end_turn(self, num: int) -> None:
        name = self.marks.end(num)
        if name is not None and self._format().framing == "twilio":
            await self.ws.send_text(self._twilio.mark(name))

    async def drop_turn(self, num: int) -> None:
        """Nothing is queued here (the runner sends each frame when it is due); with
        `twilio` framing the bot forwards our `clear` to drop what Twilio buffers."""
        if self.marks.has_audio(num) and self._format().framing == "twilio":
            self.marks.clear(num)
            await self.ws.send_text(self._twilio.clear())

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
    transport = WebSocketTransport(ws, core)
    runner = SessionRunner(core, host.engine, transport, host.playout, host.admission)
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text")
            if text is not None and (event := transport.forwarded(text)) is not None:
                await act_on_forwarded(runner, transport, event)
            elif text is not None:
                await runner.on_text(text)
            elif message.get("bytes") is not None:
                await runner.on_bytes(message["bytes"])
    except WebSocketDisconnect:
        pass
    except Exception:
        log.exception("session %s failed", core.session_id)
    finally:
        host.admission.release(WebSocketTransport.name, who.tenant)
        await runner.close()


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
        await transport.send_event(error_event(ErrorCode.INVALID_CARRIER_MESSAGE, event.reason))
