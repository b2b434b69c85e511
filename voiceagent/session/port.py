"""The transport port: what a session runner needs from any way audio leaves.

The runner talks to a transport only through this interface, and a transport talks to
the session only through the runner (`on_text`, `on_bytes`, `hear`, `listener_played`).
WebSocket, WebRTC and the telephony carriers (telephony/) implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

from ..protocol.messages import Format
from ..protocol.session import Catalog, Limits, SendAudio

if TYPE_CHECKING:
    from ..auth.gate import Principal
    from ..engine.embedded import EmbeddedEngine
    from ..transport.guard import ConnectionGate, GuardConfig
    from .admission import Admission
    from .playout import PlayoutConfig


class Transport(ABC):
    """One session's connection to its listener."""

    name: str  # "websocket", "webrtc", "twilio", ...: for logs and metrics
    # The only output format the transport can carry (None: the session's `format`).
    pinned_format: Format | None = None
    # A draining server closes the session at its first idle moment (False: a phone call,
    # which runs until it ends or the drain deadline).
    drains_when_idle: bool = True

    @abstractmethod
    async def send_event(self, event: dict[str, Any]) -> None:
        """Send a protocol event (JSON object). Raises ConnectionError once closed."""

    @abstractmethod
    async def send_audio(self, frame: SendAudio) -> None:
        """Send one encoded 20 ms frame of a turn, in order; may wait while the transport's
        own queue is full (that wait paces the runner)."""

    @abstractmethod
    async def drop_turn(self, num: int) -> None:
        """Discard the audio of turn `num` still queued inside the transport, or at the far
        end (a carrier's `clear`): the turn is cancelled."""

    async def end_turn(self, num: int) -> None:
        """Turn `num` has sent its last frame (telephony: a final mark)."""
        return None

    @abstractmethod
    async def close(self, code: int, reason: str) -> None:
        """End the session from the server's side (`code`: a WebSocket close code, e.g.
        1001 when the server drains). Safe to call on a session that already ended."""

    def sent_ms(self, num: int) -> int | None:
        """How much of turn `num` has left the server toward the listener, where the
        transport knows better than the runner's pacing clock (WebRTC: frames its track
        emitted). None: the runner estimates from when it sent the frames."""
        return None


class SessionHost(Protocol):
    """What a transport needs from the server to open sessions."""

    engine: EmbeddedEngine
    catalog: Catalog

    @property
    def limits(self) -> Limits: ...

    @property
    def playout(self) -> PlayoutConfig: ...

    @property
    def admission(self) -> Admission:
        """Session and turn slots, and the drain (admit / release a session there)."""

    @property
    def guard(self) -> GuardConfig:
        """Limits on what one client may do: message rate, timeouts."""

    @property
    def connections(self) -> ConnectionGate:
        """New connections per client address."""

    def catalog_for(self, principal: Principal) -> Catalog:
        """What a session of `principal` may use: the shared voices and its tenant's."""
