"""WebSocket sessions (WS /v1/ws): JSON events as text messages, each audio frame as one
binary message (protocol/frames.py header + payload), microphone PCM16 as binary in."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.frames import AudioFrame, pack
from ..protocol.session import SendAudio, SessionCore, error_event
from ..session.port import SessionHost, Transport
from ..session.runner import SessionRunner

log = logging.getLogger(__name__)


class WebSocketTransport(Transport):
    name = "websocket"

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def send_event(self, event: dict[str, Any]) -> None:
        await self.ws.send_text(json.dumps(event))

    async def send_audio(self, frame: SendAudio) -> None:
        packed = pack(AudioFrame(frame.codec, frame.num, frame.seq, frame.pts_ms, frame.payload))
        await self.ws.send_bytes(packed)

    async def drop_turn(self, num: int) -> None:
        """Nothing is queued here: the runner sends each frame when it is due."""


async def serve_websocket(host: SessionHost, ws: WebSocket) -> None:
    """One WebSocket session, from accept to close."""
    await ws.accept()
    refusal = host.admit()
    if refusal is not None:
        await ws.send_text(json.dumps(error_event(ErrorCode.TOO_MANY_SESSIONS, refusal)))
        await ws.close(CloseCode.TRY_AGAIN_LATER, "too many sessions")
        return
    transport = WebSocketTransport(ws)
    core = SessionCore(uuid.uuid4().hex[:16], host.catalog, host.limits, transport.pinned_format)
    runner = SessionRunner(core, host.engine, transport, host.playout)
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("text") is not None:
                await runner.on_text(message["text"])
            elif message.get("bytes") is not None:
                await runner.on_bytes(message["bytes"])
    except WebSocketDisconnect:
        pass
    except Exception:
        log.exception("session %s failed", core.session_id)
    finally:
        host.release()
        await runner.close()
