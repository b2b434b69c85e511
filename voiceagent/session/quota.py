"""Per-tenant quotas: concurrent sessions, turns per minute, characters per minute, and
voices kept (voices/registry.py counts those). A request over a quota is refused at once
(`quota_exceeded`); nothing waits. No I/O: the clock is a parameter, so tests step it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]


@dataclass(frozen=True)
class Quota:
    """A tenant's limits; 0 means no limit."""

    sessions: int = 0
    turns_per_min: int = 0
    chars_per_min: int = 0
    voices: int = 0  # voices of its own (POST /v1/voices), made or being made


class PerMinute:
    """A token bucket holding up to `per_min` units, refilled at `per_min` a minute: a
    burst of a whole minute's budget is allowed, then the steady rate."""

    def __init__(self, per_min: int, clock: Clock) -> None:
        self.per_min = per_min
        self.clock = clock
        self.level = float(per_min)
        self.at = clock()

    def take(self, n: int) -> bool:
        now = self.clock()
        self.level = min(self.per_min, self.level + (now - self.at) * self.per_min / 60)
        self.at = now
        if n > self.level:
            return False
        self.level -= n
        return True


class TenantUsage:
    """What one tenant uses now, against its quota (which may change: `quota` is read
    again at every check, so an edited keys file applies at once)."""

    def __init__(
        self, name: str, quota: Callable[[], Quota], clock: Clock = time.monotonic
    ) -> None:
        self.name = name
        self.quota = quota
        self.clock = clock
        self.sessions = 0
        self._turns: PerMinute | None = None
        self._chars: PerMinute | None = None

    def _bucket(self, bucket: PerMinute | None, per_min: int) -> PerMinute:
        if bucket is None or bucket.per_min != per_min:
            bucket = PerMinute(per_min, self.clock)
        return bucket

    def admit_session(self) -> str | None:
        """Take a session slot, or say why not (call `release_session` once if taken)."""
        limit = self.quota().sessions
        if limit and self.sessions >= limit:
            return f"tenant '{self.name}' is at its quota of {limit} concurrent sessions"
        self.sessions += 1
        return None

    def release_session(self) -> None:
        self.sessions -= 1

    def take_turn(self) -> str | None:
        limit = self.quota().turns_per_min
        if not limit:
            return None
        self._turns = self._bucket(self._turns, limit)
        if self._turns.take(1):
            return None
        return f"tenant '{self.name}' is at its quota of {limit} turns per minute"

    def take_chars(self, n: int) -> str | None:
        """Spend `n` characters of text, or refuse them all (None: spent)."""
        limit = self.quota().chars_per_min
        if not limit:
            return None
        self._chars = self._bucket(self._chars, limit)
        if self._chars.take(n):
            return None
        return f"tenant '{self.name}' is at its quota of {limit} characters per minute"
