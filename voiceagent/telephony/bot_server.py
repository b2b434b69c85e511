"""WS /v1/calls: where a bot attaches to the call its token names. Its first message is
`session.attach`; from then on it speaks the normal JSON protocol to the call's session.
Either side may arrive first: each waits for the other up to `attach_timeout_s`."""

from __future__ import annotations

import asyncio
import contextlib
import json

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..auth.gate import principal_of
from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.session import error_event
from ..transport.guard import CLOSING, RATE_MESSAGE, MessageGate, Verdict
from .bot import check_attach, parse_attach
from .call import CallHost


async def serve_bot(host: CallHost, ws: WebSocket) -> None:
    await ws.accept()
    timeout = host.telephony.attach_timeout_s
    try:
        async with asyncio.timeout(timeout):
            first = await ws.receive_text()
    except (TimeoutError, WebSocketDisconnect, KeyError, RuntimeError):
        await _refuse(ws, ErrorCode.INVALID_MESSAGE, "send session.attach first")
        return
    attach = parse_attach(first)
    checked = check_attach(attach) if attach is not None else "send session.attach first"
    if isinstance(checked, str):
        await _refuse(ws, ErrorCode.INVALID_PARAMETER, checked)
        return
    token, caller_rate = checked
    call = await host.calls.find(token, timeout)
    if call is None:
        await _refuse(ws, ErrorCode.UNKNOWN_CALL, "no call with that token arrived in time")
        return
    if principal_of(ws).tenant != call.tenant:
        await _refuse(ws, ErrorCode.FORBIDDEN, "that call belongs to another tenant")
        return
    if call.bot.attached or call.ended.is_set():
        await _refuse(ws, ErrorCode.CALL_ALREADY_ATTACHED, "another bot drives that call")
        return
    try:
        await call.attach_bot(ws, caller_rate)  # (a bot gone already: it leaves at once)
        gate = MessageGate(host.guard)
        while not call.ended.is_set():
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            verdict = await gate.pace()  # over the rate: TCP holds the bot back
            if verdict is Verdict.CLOSE:  # the call waits for a bot that behaves
                host.engine.metrics.closed.labels(str(ErrorCode.RATE_LIMITED)).inc()
                closing = error_event(ErrorCode.RATE_LIMITED, CLOSING[ErrorCode.RATE_LIMITED])
                await ws.send_text(json.dumps(closing))
                break  # no close handshake: waiting for its reply would read the flood
            if verdict is Verdict.WARN:
                await ws.send_text(json.dumps(error_event(ErrorCode.RATE_LIMITED, RATE_MESSAGE)))
            if message.get("text") is not None:
                await call.from_bot(message["text"])
            elif message.get("bytes") is not None:
                event = error_event(
                    ErrorCode.UNEXPECTED_BINARY, "a call's audio comes from the carrier"
                )
                await ws.send_text(json.dumps(event))
    except (WebSocketDisconnect, RuntimeError):
        pass  # RuntimeError: the call ended and closed this socket under us
    finally:
        call.detach_bot(ws)


async def _refuse(ws: WebSocket, code: ErrorCode, message: str) -> None:
    with contextlib.suppress(Exception):
        await ws.send_text(json.dumps(error_event(code, message)))
        await ws.close(CloseCode.POLICY_VIOLATION, str(code))
