"""Admission and drain: how many sessions and live turns one server takes, and how it
stops taking them before it exits.

A refusal is immediate and carries a stable error code; nothing waits in a queue. While
draining, new sessions are refused; a session is closed at its first idle moment (no
live turn, so no sentence is cut), a phone call when it ends; whatever is left at the
deadline is closed then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..ops.metrics import Metrics
from ..protocol.errors import CloseCode, ErrorCode
from .quota import Quota, TenantUsage

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2  # what a refusal suggests (HTTP Retry-After)
DRAIN_POLL_S = 0.05


# The codes `Admission.admit` refuses a session with.
SESSION_REFUSALS = (
    ErrorCode.TOO_MANY_SESSIONS,
    ErrorCode.SERVER_DRAINING,
    ErrorCode.QUOTA_EXCEEDED,
)
DEFAULT_TENANT = "default"


class Closable(Protocol):
    drains_when_idle: bool

    async def close(self, code: int, reason: str) -> None: ...


class LiveSession(Protocol):
    """What the drain needs of a session (a LiveSession)."""

    @property
    def idle(self) -> bool: ...

    @property
    def transport(self) -> Closable: ...


@dataclass(frozen=True)
class Refusal:
    code: ErrorCode
    message: str
    retry_after_s: int = RETRY_AFTER_S


class Admission:
    def __init__(
        self,
        max_sessions: int,
        max_live_turns: int,
        metrics: Metrics,
        quota: Callable[[str], Quota] = lambda tenant: Quota(),
    ) -> None:
        """`quota`: a tenant's quota now (the server reads it from the keys file)."""
        self.max_sessions = max_sessions
        self.max_live_turns = max_live_turns
        self.metrics = metrics
        self.quota = quota
        self.tenants: dict[str, TenantUsage] = {}
        self.sessions = 0
        self.live_turns = 0
        self.draining = False
        self.runners: set[LiveSession] = set()

    # -- sessions -------------------------------------------------------------------------

    def tenant(self, name: str) -> TenantUsage:
        usage = self.tenants.get(name)
        if usage is None:
            usage = self.tenants[name] = TenantUsage(name, lambda: self.quota(name))
        return usage

    def admit(self, transport: str, tenant: str = DEFAULT_TENANT) -> Refusal | None:
        """Take a session slot for `transport` (and one of `tenant`'s), or say why not.
        Call `release` exactly once for every admitted session."""
        refusal = None
        if self.draining:
            refusal = Refusal(
                ErrorCode.SERVER_DRAINING, "server is shutting down; connect to another one"
            )
        elif self.sessions >= self.max_sessions:
            refusal = Refusal(
                ErrorCode.TOO_MANY_SESSIONS,
                f"server is at its limit of {self.max_sessions} sessions; retry later",
            )
        elif (over := self.tenant(tenant).admit_session()) is not None:
            refusal = Refusal(ErrorCode.QUOTA_EXCEEDED, over)
        if refusal is not None:
            self.metrics.refused.labels(str(refusal.code)).inc()
            return refusal
        self.sessions += 1
        self.metrics.sessions.labels(transport).inc()
        self.metrics.sessions_active.labels(transport).inc()
        return None

    def release(self, transport: str, tenant: str = DEFAULT_TENANT) -> None:
        self.sessions -= 1
        self.tenant(tenant).release_session()
        self.metrics.sessions_active.labels(transport).dec()

    # -- turns ----------------------------------------------------------------------------

    def admit_turn(self, tenant: str = DEFAULT_TENANT) -> Refusal | None:
        if self.live_turns >= self.max_live_turns:
            self.metrics.refused.labels(str(ErrorCode.SERVER_BUSY)).inc()
            return Refusal(
                ErrorCode.SERVER_BUSY,
                f"server is at its limit of {self.max_live_turns} live turns; retry later",
            )
        if (over := self.tenant(tenant).take_turn()) is not None:
            self.metrics.refused.labels(str(ErrorCode.QUOTA_EXCEEDED)).inc()
            return Refusal(ErrorCode.QUOTA_EXCEEDED, over)
        self.live_turns += 1
        self.metrics.turns_active.inc()
        return None

    def admit_request(self, tenant: str = DEFAULT_TENANT) -> Refusal | None:
        """A turn that is not part of a session (a drop-in API request or a socket's
        context): also refused while draining, so that it goes to a server that stays."""
        if self.draining:
            self.metrics.refused.labels(str(ErrorCode.SERVER_DRAINING)).inc()
            return Refusal(
                ErrorCode.SERVER_DRAINING, "server is shutting down; send this to another one"
            )
        return self.admit_turn(tenant)

    def turn_ended(self) -> None:
        self.live_turns -= 1
        self.metrics.turns_active.dec()

    # -- readiness and drain --------------------------------------------------------------

    def full(self) -> list[str]:
        """Why no new work fits now (empty: it does)."""
        reasons = []
        if self.sessions >= self.max_sessions:
            reasons.append(f"at the session limit ({self.max_sessions})")
        if self.live_turns >= self.max_live_turns:
            reasons.append(f"at the live-turn limit ({self.max_live_turns})")
        return reasons

    async def drain(self, deadline_s: float) -> None:
        """Refuse new sessions; close each session once idle (calls once they end); at the
        deadline close the rest. Returns when no session is left."""
        self.draining = True
        self.metrics.draining.set(1)
        end = time.monotonic() + deadline_s
        log.info(
            "draining: %d sessions, %d live turns; deadline %.0f s",
            len(self.runners),
            self.live_turns,
            deadline_s,
        )
        closing: set[LiveSession] = set()
        while self.runners:
            overdue = time.monotonic() >= end
            for runner in list(self.runners - closing):
                if overdue or (runner.idle and runner.transport.drains_when_idle):
                    closing.add(runner)
                    await runner.transport.close(CloseCode.GOING_AWAY, "server draining")
            if overdue and self.runners <= closing:
                break  # every session was told to close; give them a moment below
            await asyncio.sleep(DRAIN_POLL_S)
        grace = time.monotonic() + 2.0
        while self.runners and time.monotonic() < grace:
            await asyncio.sleep(DRAIN_POLL_S)
        log.info("drained; %d sessions were still closing", len(self.runners))
