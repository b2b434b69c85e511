"""Protection from greedy and broken clients: how fast a connection may send messages,
how fast one address may open connections, how long a socket may wait before it starts a
session (or sit idle), and how long a send may block on a client that stopped reading.

The checks are plain objects fed with the time, so they are tested without sockets; the
transports apply them.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
from dataclasses import dataclass

from ..protocol.errors import ErrorCode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GuardConfig:
    # Per connection: sustained messages per second and the burst above it. Microphone
    # audio in 20 ms messages is 50/s and an LLM's deltas rarely pass 100/s. Beyond it
    # the server reads the connection's messages only at this rate: the rest waits in
    # the network buffers and the client's sends block (nothing is lost).
    messages_per_s: float = 200.0
    message_burst: int = 400
    # A connection held back for this long without a pause is closed (1008).
    flood_close_s: float = 5.0
    # A socket that has not sent `session.start` by then is closed: it holds a slot.
    start_timeout_s: float = 10.0
    # No message from the client and no live turn for this long: closed (0: never).
    idle_timeout_s: float = 0.0
    # A send to a client that stopped reading that blocks this long ends the session.
    send_timeout_s: float = 10.0
    # New connections (WebSocket, WebRTC offers) per second from one address, and the
    # burst; loopback is exempt (a local proxy's own address; uvicorn resolves
    # X-Forwarded-For from trusted proxies first).
    connections_per_s: float = 20.0
    connection_burst: int = 40


class TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.last: float | None = None

    def take(self, now: float) -> bool:
        self.refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def reserve(self, now: float) -> float:
        """Take a token, in debt if need be: the seconds to wait before using it."""
        self.refill(now)
        self.tokens -= 1.0
        return max(0.0, -self.tokens / self.rate)

    def refill(self, now: float) -> None:
        if self.last is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now


class Verdict(enum.Enum):
    PASS = "pass"
    WAIT = "wait"  # over the rate: read this message only after `delay`
    WARN = "warn"  # wait, and tell the client (at most once a second)
    CLOSE = "close"  # held back for flood_close_s without a pause: closed


class MessageGate:
    """One connection's inbound messages against its rate. A message over the rate is
    read later (`delay`): the network then holds the client back."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.bucket = TokenBucket(config.messages_per_s, config.message_burst)
        self.flooding_since: float | None = None  # held back without a pause since
        self.warned_at = float("-inf")
        self.delay = 0.0

    def check(self, now: float) -> Verdict:
        self.bucket.refill(now)
        if self.bucket.tokens >= max(1.0, self.bucket.burst / 2):
            self.flooding_since = None  # it paused long enough to refill half its burst
        self.delay = self.bucket.reserve(now)
        if self.delay == 0.0:
            return Verdict.PASS
        if self.flooding_since is None:
            self.flooding_since = now
        if now - self.flooding_since >= self.config.flood_close_s:
            return Verdict.CLOSE
        if now - self.warned_at >= 1.0:
            self.warned_at = now
            return Verdict.WARN
        return Verdict.WAIT

    async def pace(self) -> Verdict:
        """`check` one more message now, then wait out its delay (unless it says close)."""
        verdict = self.check(asyncio.get_running_loop().time())
        if verdict is not Verdict.CLOSE:
            await asyncio.sleep(self.delay)
        return verdict


RATE_MESSAGE = "messages arrive faster than the limit; they are read more slowly"

# What a session closed by the server is told, by the reason's code.
CLOSING = {
    ErrorCode.RATE_LIMITED: "sent over the message rate for too long",
    ErrorCode.SESSION_START_TIMEOUT: "no session.start in time",
    ErrorCode.IDLE_TIMEOUT: "no message and nothing to send for too long",
}


class Deadlines:
    """When a connection has waited too long: for its start (`session.start`, or its
    first message where it has none: `start_timeout_s`), or with nothing to do: no message
    from the client and no work for the server (a turn waiting for more text is none) for
    `idle_timeout_s`, counted from whichever of the two ended last (a turn that ends a
    second after the last message leaves the whole timeout to the client)."""

    def __init__(self, config: GuardConfig, now: float) -> None:
        self.config = config
        self.opened = self.last = now

    def heard(self, now: float) -> None:
        self.last = now

    def next(self, now: float, started: bool, idle_since: float | None) -> float | None:
        """When to look again (None: never). `idle_since`: since when the connection has
        had nothing to do, or None while it has work."""
        if not started:
            return self.opened + self.config.start_timeout_s
        if self.config.idle_timeout_s <= 0:
            return None
        if idle_since is None:  # busy: it cannot be idle for the timeout before then
            return now + self.config.idle_timeout_s
        return max(self.last, idle_since) + self.config.idle_timeout_s

    def expired(self, now: float, started: bool, idle_since: float | None) -> ErrorCode | None:
        """Why to close the connection now, if it has waited too long."""
        deadline = self.next(now, started, idle_since)
        if deadline is None or now < deadline:
            return None
        return ErrorCode.IDLE_TIMEOUT if started else ErrorCode.SESSION_START_TIMEOUT


class ConnectionGate:
    """New connections per client address (loopback exempt)."""

    MAX_TRACKED = 10_000  # addresses remembered; idle ones are forgotten beyond it

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.buckets: dict[str, TokenBucket] = {}

    def admit(self, address: str | None, now: float) -> bool:
        if address is None or _loopback(address):
            return True
        bucket = self.buckets.get(address)
        if bucket is None:
            if len(self.buckets) >= self.MAX_TRACKED:
                self._forget_idle(now)
            bucket = self.buckets[address] = TokenBucket(
                self.config.connections_per_s, self.config.connection_burst
            )
        return bucket.take(now)

    def _forget_idle(self, now: float) -> None:
        """Drop addresses whose bucket has refilled: they are as good as new."""
        full = self.config.connection_burst / self.config.connections_per_s
        self.buckets = {
            a: b for a, b in self.buckets.items() if b.last is not None and now - b.last < full
        }


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class ClientNoise(logging.Filter):
    """uvicorn logs a client's invalid UTF-8 text frame as an ERROR with a traceback;
    anyone could fill the log with it. It is the client's mistake: one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Invalid UTF-8 sequence received from client"):
            return True
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info = record.exc_text = None
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


class NoQueryStrings(logging.Filter):
    """uvicorn's WebSocket lines name the path with its query string, where credentials
    (`?api_key=`, `?access_token=`) and a call's token travel: log the path alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if '"WebSocket %s"' in str(record.msg) and isinstance(args, tuple) and len(args) > 1:
            record.args = (args[0], str(args[1]).split("?", 1)[0], *args[2:])
        return True
