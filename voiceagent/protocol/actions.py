"""What the session core asks of its runner: events and frames to send, turns to open,
feed, end or cancel, the output gain. Plain immutable data; the runner executes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .messages import Settings


@dataclass(frozen=True)
class SendEvent:
    event: dict[str, Any]


@dataclass(frozen=True)
class SendAudio:
    """One encoded 20 ms frame of turn `num`: the `seq`-th, `pts_ms` into the turn."""

    num: int
    seq: int
    pts_ms: int
    codec: str
    payload: bytes
    # the WebSocket framing of its turn, fixed when the turn opened, as its codec is
    framing: str = "header"
    stream_sid: str = ""


@dataclass(frozen=True)
class OpenTurn:
    num: int
    turn_id: str
    settings: Settings


@dataclass(frozen=True)
class AppendText:
    num: int
    text: str


@dataclass(frozen=True)
class EndText:
    num: int


@dataclass(frozen=True)
class FlushText:
    """Synthesize the text buffered so far without waiting for a sentence end."""

    num: int


@dataclass(frozen=True)
class CancelTurn:
    """Stop turn `num` now and drop its queued audio. If it had sent audio, the runner then
    tells `SessionCore.stopped` how much the listener heard — after waiting up to
    `wait_listener_ms` for the listener's own report (`playback` with `stopped`)."""

    num: int
    sent_audio: bool = False
    wait_listener_ms: int = 0


@dataclass(frozen=True)
class ListenerPlayed:
    """The listener reports having played `played_ms` of turn `num` (just now)."""

    num: int
    played_ms: int


@dataclass(frozen=True)
class MicAudio:
    """PCM16 mono microphone audio from the client, for voice activity detection."""

    pcm: bytes
    sample_rate: int


@dataclass(frozen=True)
class SetGain:
    """Scale the session's outgoing audio from the next frame on (duck mode)."""

    gain: float


Action = (
    SendEvent
    | SendAudio
    | OpenTurn
    | AppendText
    | FlushText
    | EndText
    | CancelTurn
    | ListenerPlayed
    | MicAudio
    | SetGain
)
