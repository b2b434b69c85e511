"""What a carrier tells voiceagent about a call, whatever its wire format: every carrier
front end (Twilio-style media streams, AudioSocket, chan_websocket) turns its messages
into these, and one loop (call.py) acts on them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CallInfo:
    """A call as its `start` describes it."""

    carrier: str  # twilio | telnyx | vonage | audiosocket | asterisk
    call_id: str  # the platform's id: callSid, call_control_id, the AudioSocket UUID, ...
    stream_id: str
    codec: str  # of the caller's audio and ours: mulaw | alaw | pcm16
    sample_rate: int
    # Values the platform passes through (Twilio <Parameter>s, Vonage headers, URL
    # parameters): the bot's session token and per-call settings such as `voice`.
    params: dict[str, str] = field(default_factory=dict)

    @property
    def token(self) -> str:
        return self.params.get("token", "")

    def describe(self) -> dict[str, object]:
        """For the bot: everything but the token."""
        return {
            "carrier": self.carrier,
            "call_id": self.call_id,
            "stream_id": self.stream_id,
            "codec": self.codec,
            "sample_rate": self.sample_rate,
            "params": {k: v for k, v in self.params.items() if k != "token"},
        }


@dataclass(frozen=True)
class Started:
    info: CallInfo


@dataclass(frozen=True)
class CallerAudio:
    pcm: bytes  # PCM16 little-endian at the call's rate (front ends decode G.711)


@dataclass(frozen=True)
class Dtmf:
    digit: str


@dataclass(frozen=True)
class MarkEchoed:
    """The carrier has played everything sent before this mark (or flushed it)."""

    name: str


@dataclass(frozen=True)
class Stopped:
    reason: str = "hangup"


@dataclass(frozen=True)
class Invalid:
    """A message that breaks the platform's schema: logged, reported to the bot, skipped."""

    reason: str


@dataclass(frozen=True)
class CarrierError:
    """The carrier says something went wrong on its side (Telnyx `error`, Vonage
    `websocket:error`, Asterisk `ERROR`): logged, reported to the bot; the call goes on."""

    detail: str


@dataclass(frozen=True)
class Ignored:
    """A valid message with nothing to do (connected, cleared, status...)."""

    what: str


CarrierEvent = (
    Started | CallerAudio | Dtmf | MarkEchoed | Stopped | Invalid | CarrierError | Ignored
)
