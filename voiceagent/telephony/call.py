"""A phone call as a voiceagent session: the carrier's media stream is the transport (our
audio out, the caller's audio in for barge-in), and a bot attached by token drives it.

Every carrier front end turns its wire into carrier events (events.py) and a
`CallTransport`; `run_call` does the rest the same way for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from abc import abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from starlette.websockets import WebSocket

from ..auth.gate import ANONYMOUS, Principal
from ..protocol.errors import ErrorCode
from ..protocol.json_text import parse_json
from ..protocol.messages import SETTING, Format
from ..protocol.session import SessionCore, error_event
from ..session.port import SessionHost, Transport
from ..session.runner import SessionRunner
from .bot import MIN_TOKEN_CHARS, BotLink
from .events import (
    CallerAudio,
    CallInfo,
    CarrierError,
    CarrierEvent,
    Dtmf,
    Ignored,
    Invalid,
    MarkEchoed,
    Started,
    Stopped,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TelephonyConfig:
    attach_timeout_s: float = 10.0  # a call waits this long for its bot, a bot for its call
    bot_grace_s: float = 10.0  # after its bot leaves, a call waits this long, then hangs up
    mark_every_ms: int = 100  # marks per stretch of audio (played position between: timed)
    barge_in: str = "cancel"  # calls default to it: a caller who talks stops the bot
    twilio_auth_token: str | None = None  # set: X-Twilio-Signature is checked
    public_url: str | None = None  # https://voice.example.com: what Twilio signed, behind a proxy
    audiosocket_host: str = "0.0.0.0"
    audiosocket_port: int | None = None  # Asterisk AudioSocket over TCP (None: off)


class CallRegistry:
    """Live calls by token, and bots waiting for theirs."""

    def __init__(self) -> None:
        self._calls: dict[str, Call] = {}
        self._waiting: dict[str, set[asyncio.Future[Call]]] = {}  # one future per bot

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, token: str, call: Call) -> bool:
        if token in self._calls:
            return False
        self._calls[token] = call
        for waiter in self._waiting.pop(token, set()):
            if not waiter.done():
                waiter.set_result(call)
        return True

    def remove(self, token: str, call: Call) -> None:
        if self._calls.get(token) is call:
            del self._calls[token]

    async def find(self, token: str, timeout_s: float) -> Call | None:
        call = self._calls.get(token)
        if call is not None:
            return call
        # Each bot waits on its own future: one that gives up (a socket that died while
        # waiting, its reconnect waiting beside it) must not take the others' wake-up.
        waiter: asyncio.Future[Call] = asyncio.get_running_loop().create_future()
        waiters = self._waiting.setdefault(token, set())
        waiters.add(waiter)
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return None
        finally:
            waiters.discard(waiter)
            if not waiters and self._waiting.get(token) is waiters:
                del self._waiting[token]


class CallHost(SessionHost, Protocol):
    """What calls need from the server beyond what any session needs."""

    calls: CallRegistry

    @property
    def telephony(self) -> TelephonyConfig: ...


class CallRefused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class CallTransport(Transport):
    """A call's media behind the port: our audio to the carrier, events to the bot."""

    # Who the stream's credential names (the call's tenant); AudioSocket and signed
    # Twilio streams carry none: the tenant `default`.
    principal: Principal = ANONYMOUS

    def __init__(self, info: CallInfo) -> None:
        self.info = info
        self.name = info.carrier
        self.pinned_format = Format(info.codec, info.sample_rate)
        self.bot = BotLink()

    drains_when_idle = False  # a call is never hung up between sentences to drain

    async def send_event(self, event: dict[str, Any]) -> None:
        await self.bot.send(event)

    async def close(self, code: int, reason: str) -> None:
        await self.hangup()

    def played(self, mark: str) -> tuple[int, int] | None:
        """(turn, ms heard) for an echoed mark that tells it (carriers with marks)."""
        return None

    @abstractmethod
    async def hangup(self) -> None:
        """End the call's media stream from our side (the bot asked, or left)."""


class Call:
    def __init__(self, host: CallHost, transport: CallTransport) -> None:
        self.host = host
        self.info = transport.info
        self.transport = transport
        self.bot = transport.bot
        self.tenant = transport.principal.tenant
        self.core = SessionCore(
            uuid.uuid4().hex[:16],
            host.catalog_for(transport.principal),
            host.limits,
            transport.pinned_format,
            budget=host.admission.tenant(self.tenant),
        )
        self.runner = SessionRunner(self.core, host.engine, transport, host.playout, host.admission)
        self.ended = asyncio.Event()
        self.hung_up = False  # this side ended the call (the bot asked, or no bot came)
        self._timer: asyncio.Task[None] | None = None

    def start(self) -> list[dict[str, Any]]:
        """Start the session with the call's settings: calls barge in by default, and a
        parameter named like a setting (`voice`, `barge_in.mode`, ...) sets it. Returns
        error events for parameters that could not be used."""
        config = self.host.telephony
        actions = self.core.receive_text(
            json.dumps({"type": "session.start", "barge_in": {"mode": config.barge_in}})
        )
        assert self.core.started, actions
        errors = []
        for key, text in self.info.params.items():
            if key not in SETTING:
                continue
            value = _typed(SETTING[key].kind, text)
            update = {"type": "session.update", **_nest(key, value)}
            for action in self.core.receive_text(json.dumps(update)):
                event = getattr(action, "event", {})
                if event.get("type") == "error":
                    errors.append(event)
        self._expect_bot(config.attach_timeout_s, "no bot attached")
        return errors

    # -- the bot --------------------------------------------------------------------------

    async def attach_bot(self, ws: WebSocket, caller_rate: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        hello = {**self.core.describe(), "call": self.info.describe()}
        await self.bot.attach(ws, hello, caller_rate)
        log.info("call %s: bot attached", self.info.call_id)

    def detach_bot(self, ws: WebSocket) -> None:
        if self.bot.detach(ws) and not self.ended.is_set():
            log.info("call %s: bot left", self.info.call_id)
            self._expect_bot(self.host.telephony.bot_grace_s, "the bot left")

    async def from_bot(self, text: str) -> None:
        kind = _type(text)
        if kind == "call.hangup":
            log.info("call %s: the bot hangs up", self.info.call_id)
            await self.hang_up()
        elif kind == "session.attach":
            await self.bot.send(error_event(ErrorCode.CALL_ALREADY_ATTACHED, "already attached"))
        else:
            await self.runner.on_text(text)

    async def hang_up(self) -> None:
        self.hung_up = True
        await self.transport.hangup()

    def _expect_bot(self, timeout_s: float, why: str) -> None:
        """Hang up unless a bot is attached within `timeout_s` (nobody would speak)."""

        async def wait() -> None:
            await asyncio.sleep(timeout_s)
            if not self.bot.attached and not self.ended.is_set():
                log.warning("call %s: %s; hanging up", self.info.call_id, why)
                await self.hang_up()

        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().create_task(wait())

    # -- the carrier ----------------------------------------------------------------------

    async def on_event(self, event: CarrierEvent) -> None:
        if isinstance(event, CallerAudio):
            pcm = np.frombuffer(event.pcm, dtype="<i2")
            await self.runner.hear(pcm, self.info.sample_rate)
            await self.bot.caller_audio(event.pcm, self.info.sample_rate)
        elif isinstance(event, MarkEchoed):
            played = self.transport.played(event.name)
            if played is not None:
                await self.runner.listener_played(*played)
        elif isinstance(event, Dtmf):
            await self.bot.send({"type": "dtmf", "digit": event.digit})
        elif isinstance(event, Invalid):
            # Carriers' messages are logged by kind only: never what the caller said.
            log.warning("call %s (%s): %s", self.info.call_id, self.info.carrier, event.reason)
            self.host.engine.metrics.errors.labels(ErrorCode.INVALID_CARRIER_MESSAGE).inc()
            await self.bot.send(error_event(ErrorCode.INVALID_CARRIER_MESSAGE, event.reason))
        elif isinstance(event, CarrierError):
            log.warning(
                "call %s (%s) error: %s", self.info.call_id, self.info.carrier, event.detail
            )
            self.host.engine.metrics.errors.labels(ErrorCode.CARRIER_ERROR).inc()
            await self.bot.send(error_event(ErrorCode.CARRIER_ERROR, event.detail))
        elif isinstance(event, Started):
            log.warning("call %s: a second start ignored", self.info.call_id)
        else:
            assert isinstance(event, Ignored | Stopped)

    async def close(self, reason: str) -> None:
        self.ended.set()
        if self._timer is not None:
            self._timer.cancel()
        with contextlib.suppress(Exception):
            await self.bot.send({"type": "call.ended", "reason": reason})
        await self.bot.close()
        await self.runner.close()


async def run_call(
    host: CallHost, transport: CallTransport, events: AsyncIterator[CarrierEvent]
) -> None:
    """One call from its start to its end. Raises CallRefused before anything starts
    (no token, token in use, server full); the front end tells its carrier."""
    info = transport.info
    if len(info.token) < MIN_TOKEN_CHARS:
        raise CallRefused(
            ErrorCode.INVALID_PARAMETER,
            f"the call needs a 'token' parameter of at least {MIN_TOKEN_CHARS} characters",
        )
    tenant = transport.principal.tenant
    refusal = host.admission.admit(transport.name, tenant)
    if refusal is not None:
        raise CallRefused(refusal.code, refusal.message)
    transport.bot.send_timeout_s = host.guard.send_timeout_s
    call = Call(host, transport)
    if not host.calls.add(info.token, call):
        host.admission.release(transport.name, tenant)
        await call.runner.close()
        raise CallRefused(ErrorCode.CALL_ALREADY_ATTACHED, "a live call already has that token")
    log.info("call %s (%s) started, session %s", info.call_id, info.carrier, call.core.session_id)
    reason = "hangup"
    try:
        for error in call.start():
            await call.bot.send(error)
        async for event in events:
            if isinstance(event, Stopped):  # (our own hang-up ends the stream too)
                reason = "hangup" if call.hung_up else event.reason
                if reason == ErrorCode.RATE_LIMITED:  # a flood: we hang up
                    host.engine.metrics.closed.labels(reason).inc()
                break
            await call.on_event(event)
    except Exception:
        log.exception("call %s failed", info.call_id)
        reason = "error"
    finally:
        host.calls.remove(info.token, call)
        host.admission.release(transport.name, tenant)
        await call.close(reason)
        log.info("call %s ended (%s)", info.call_id, reason)


def _type(text: str) -> str | None:
    try:
        msg = parse_json(text)
    except ValueError:
        return None
    kind = msg.get("type") if isinstance(msg, dict) else None
    return kind if isinstance(kind, str) else None


def _typed(kind: type, text: str) -> Any:
    """A parameter's string as the setting's type (bad values go on, to be refused with
    the setting's own error)."""
    try:
        if kind is bool:
            return {"true": True, "false": False}.get(text.lower(), text)
        return kind(text)
    except ValueError:
        return text


def _nest(key: str, value: Any) -> dict[str, Any]:
    group, _, name = key.partition(".")
    return {group: {name: value}} if name else {key: value}
