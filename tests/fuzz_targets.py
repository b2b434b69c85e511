"""Coverage-guided fuzz targets (atheris, i.e. libFuzzer for Python) for every parser that
reads bytes from outside the server.

    python tests/fuzz_targets.py TARGET [libFuzzer flags] [corpus dirs]

tests/test_fuzz.py runs each target for a fixed time, starting from its seed corpus in
tests/data/fuzz/TARGET/ (with the tokens of TARGET.dict beside it). A target checks its
parser's contract on every input; anything else raised (an uncaught exception, a failed
check) is a crash: libFuzzer stops and writes the input to a `crash-*` file.

The targets also run without atheris (`TARGETS[name].setup()(data)`): the regression tests
replay the inputs the fuzzer once crashed on.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import astuple, dataclass, replace
from pathlib import Path
from typing import Any

Check = Callable[[bytes], None]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORPUS = HERE / "data" / "fuzz"


@dataclass(frozen=True)
class Target:
    """`setup` imports what it checks and returns the function that checks one input;
    under atheris, the modules named (or under those named) in `modules` are instrumented
    for coverage as setup imports them."""

    modules: tuple[str, ...]
    setup: Callable[[], Check]
    doc: str


TARGETS: dict[str, Target] = {}


def target(*modules: str) -> Callable[[Callable[[], Check]], Callable[[], Check]]:
    def register(setup: Callable[[], Check]) -> Callable[[], Check]:
        TARGETS[setup.__name__] = Target(modules, setup, (setup.__doc__ or "").strip())
        return setup

    return register


def split(data: bytes, sep: bytes = b"\x00", most: int = 16) -> list[bytes]:
    """One input as several messages (a stateful parser sees a sequence)."""
    return data.split(sep, most - 1)


# -- the session protocol: JSON text and binary messages ---------------------------------


def _session_kit() -> Any:
    """Cores in the states a message can meet: before session.start, started, started with
    a microphone, and busy (an open turn, a closed turn playing audio, a cancelled turn
    waiting for the listener's report). `cores()` gives fresh copies of them."""
    from voiceagent.protocol.errors import ErrorCode
    from voiceagent.protocol.session import Catalog, Limits, SessionCore

    catalog = Catalog(voices=("agent", "narrator"), model={"name": "fuzz"}, default_voice="agent")
    limits = Limits(max_message_bytes=4096, max_text_chars=200, max_turns=3)
    codes = {c.value for c in ErrorCode}

    def started(**settings: Any) -> SessionCore:
        core = SessionCore("fuzz", catalog, limits)
        core.receive_text(json.dumps({"type": "session.start", **settings}))
        assert core.started
        return core

    busy = started(playback={"reports": True}, input={"sample_rate": 16000})
    for message in (
        {"type": "speak", "text": "First.", "turn_id": "a"},
        {"type": "speak", "text": "Second.", "turn_id": "b"},
        {"type": "text.delta", "text": "Third, open", "turn_id": "c"},
    ):
        busy.receive_text(json.dumps(message))
    busy.audio(1, "opus", b"\x01")
    busy.audio(2, "opus", b"\x02")
    busy.receive_text('{"type": "cancel", "turn_id": "a"}')  # stopping: heard unknown
    states = {
        "fresh": SessionCore("fuzz", catalog, limits),
        "started": started(),
        "mic": started(input={"sample_rate": 8000}),
        "busy": busy,
    }

    def cores(*names: str) -> list[SessionCore]:
        return [_clone(states[name]) for name in names]

    return cores, codes


def _clone(core: Any) -> Any:
    """A copy to spend on one input (cheaper than deepcopy: settings are immutable)."""
    copy = replace(core)
    copy._turns = {n: replace(t, levels=list(t.levels)) for n, t in core._turns.items()}
    copy._stopping = {n: replace(t, levels=list(t.levels)) for n, t in core._stopping.items()}
    copy._ids = core._ids.copy()
    return copy


def _snapshot(core: Any) -> tuple[Any, ...]:
    def turns(table: dict[int, Any]) -> dict[int, Any]:
        return {
            n: (t.turn_id, t.open, t.chars, t.frames, tuple(t.levels)) for n, t in table.items()
        }

    return (
        core.settings,
        turns(core._turns),
        turns(core._stopping),
        frozenset(core._ids),
        core._next_num,
        core._open,
        core._ducked,
    )


def _check_actions(actions: list[Any], codes: set[str]) -> list[dict[str, Any]]:
    """Every action is one of actions.py's; every event can be sent as JSON; every error
    has a stable code. Returns the error events."""
    from voiceagent.protocol import actions as A

    kinds = typing.get_args(A.Action)  # every action type of actions.py
    assert isinstance(actions, list), actions
    errors = []
    for action in actions:
        assert isinstance(action, kinds), action
        if isinstance(action, A.SendEvent):
            event = action.event
            json.dumps(event)  # what the transport does with it
            assert isinstance(event.get("type"), str), event
            if event["type"] == "error":
                assert event["code"] in codes, event
                assert isinstance(event["message"], str) and event["message"], event
                errors.append(event)
    return errors


@target("voiceagent.protocol")
def session_text() -> Check:
    """A text message into SessionCore.receive_text, in each state a session can be in.
    An error is exactly one `error` event with a stable code and leaves the session as it
    was; anything else is actions of known types."""
    cores, codes = _session_kit()

    def check(data: bytes) -> None:
        text = data.decode("utf-8", "surrogateescape")  # lone surrogates reach the core too
        for core in cores("fresh", "started", "busy"):
            _check_reply(core, text, codes)

    return check


def _check_reply(core: Any, text: str, codes: set[str]) -> None:
    before = _snapshot(core)
    actions = core.receive_text(text)
    errors = _check_actions(actions, codes)
    if errors:
        assert len(actions) == 1, actions
        assert "turn_id" not in errors[0], errors
        assert _snapshot(core) == before, "a refused message changed the session"


@target("voiceagent.protocol")
def session_json() -> Check:
    """Like session_text, but structure-aware: the input's bytes choose up to 8 messages
    from the protocol's vocabulary (hostile_json.py: every type and setting, every JSON
    kind, huge numbers, NaN, deep nesting, lone surrogates, truncation), sent in order to
    one session from before session.start and to one that is busy."""
    from hostile_json import messages

    cores, codes = _session_kit()

    def check(data: bytes) -> None:
        texts = messages(data)
        for core in cores("fresh", "busy"):
            for text in texts:
                _check_reply(core, text, codes)

    return check


@target("voiceagent.protocol")
def session_binary() -> Check:
    """A binary message: frames.unpack (the header our clients and bots read; a bot's
    caller audio arrives in it) and SessionCore.receive_bytes (microphone PCM16), before
    session.start, without and with a microphone."""
    from voiceagent.protocol import frames
    from voiceagent.protocol.session import MicAudio

    cores, codes = _session_kit()

    def check(data: bytes) -> None:
        try:
            frame = frames.unpack(data)
        except ValueError:
            assert (
                len(data) < frames.HEADER.size
                or data[0] != frames.VERSION
                or data[1] not in frames.CODEC_NAMES
            )
        else:
            assert frame.codec in frames.CODEC_IDS
            assert frames.pack(frame) == data[:2] + b"\x00\x00" + data[4:]  # flags: reserved
        for core in cores("fresh", "started", "mic"):
            before = _snapshot(core)
            actions = core.receive_bytes(data)
            errors = _check_actions(actions, codes)
            if errors:
                assert len(actions) == 1
            else:
                assert actions == [MicAudio(data, 8000)], actions
                assert len(data) % 2 == 0
            assert _snapshot(core) == before

    return check


# -- WebRTC: the offer's HTTP body --------------------------------------------------------


@target("voiceagent.transport.webrtc", "aiortc.sdp")
def webrtc_offer() -> Check:
    """The body of POST /v1/webrtc/offer into parse_offer (JSON, then aiortc's SDP parser,
    then our checks), as the handler runs it before any network work. An input that does
    not start with '{' is taken as the SDP text itself and wrapped in a valid body, so the
    fuzzer reaches the SDP parser directly. Every refusal is an OfferError with a code."""
    from aiortc import RTCSessionDescription

    from voiceagent.transport.webrtc import OfferError, parse_offer

    def check(data: bytes) -> None:
        body = data
        if not data.startswith(b"{"):
            sdp = data.decode("utf-8", "replace")
            body = json.dumps({"type": "offer", "sdp": sdp}).encode()
        try:
            offer = parse_offer(body, max_bytes=64 * 1024)
        except OfferError as err:
            assert err.code in ("invalid_json", "invalid_sdp", "sdp_too_large"), err.code
            assert 400 <= err.status < 500 and err.message
        else:
            assert isinstance(offer, RTCSessionDescription) and offer.type == "offer"

    return check


# -- telephony ---------------------------------------------------------------------------


def _check_carrier_event(event: Any, carrier: str) -> None:
    from voiceagent.telephony import events as E
    from voiceagent.telephony.media_streams import MAX_PARAMS

    assert isinstance(event, E.CarrierEvent), event
    if isinstance(event, E.Started):
        info = event.info
        assert info.carrier == carrier
        assert isinstance(info.call_id, str) and info.call_id
        assert isinstance(info.stream_id, str) and info.stream_id
        assert info.codec in ("mulaw", "alaw", "pcm16"), info
        assert info.sample_rate in (8000, 16000), info
        assert len(info.params) <= MAX_PARAMS
        for key, value in info.params.items():
            assert isinstance(key, str) and len(key) <= 64
            assert isinstance(value, str) and len(value) <= 512
        json.dumps(info.describe())
    elif isinstance(event, E.CallerAudio):
        assert isinstance(event.pcm, bytes) and len(event.pcm) % 2 == 0
    elif isinstance(event, E.Dtmf):
        assert re.fullmatch(r"[0-9*#A-Da-d]", event.digit), event
    elif isinstance(event, E.MarkEchoed):
        assert isinstance(event.name, str)
    elif isinstance(event, E.Invalid):
        assert isinstance(event.reason, str) and event.reason
    elif isinstance(event, E.Ignored):
        assert isinstance(event.what, str)
    elif isinstance(event, E.CarrierError):  # the carrier's words, bounded
        assert isinstance(event.detail, str) and 0 < len(event.detail) <= 300


@target("voiceagent.telephony.media_streams")
def media_streams() -> Check:
    """Twilio, Telnyx and Vonage media-stream messages into their dialect's parse_text and
    parse_bytes. The first byte picks the dialect; NUL separates the messages of one call;
    a message starting with 0x01 is binary. Every message becomes a carrier event (never
    an exception), with typed, bounded fields; the replies for a started call encode."""
    from voiceagent.telephony.events import Started
    from voiceagent.telephony.media_streams import DIALECTS

    names = sorted(DIALECTS)

    def check(data: bytes) -> None:
        if not data:
            return
        dialect = DIALECTS[names[data[0] % len(names)]]()
        for message in split(data[1:]):
            if message.startswith(b"\x01"):
                event = dialect.parse_bytes(message[1:])
            else:
                event = dialect.parse_text(message.decode("utf-8", "replace"))
            _check_carrier_event(event, dialect.carrier)
            if isinstance(event, Started):
                assert dialect.info is event.info
                dialect.media(b"\x00\x01" * 80)
                dialect.mark("m1")
                dialect.clear()

    return check


@target("voiceagent.telephony.audiosocket_frames", "voiceagent.telephony.audiosocket")
def audiosocket() -> Check:
    """An AudioSocket byte stream from Asterisk into AudioSocketDecoder.feed, split into
    reads of the size the first byte gives, and each packet into the carrier event the
    call loop acts on (packet_event, at the rate of the first audio packet). The decoder
    returns the same packets however the stream is split, or raises AudioSocketError and
    stays failed; nothing else raises."""
    from voiceagent.telephony import audiosocket_frames as wire
    from voiceagent.telephony.audiosocket import packet_event

    def decode(stream: bytes, size: int) -> tuple[list[Any], Exception | None]:
        decoder = wire.AudioSocketDecoder(wire.FROM_ASTERISK)
        packets: list[Any] = []
        for i in range(0, len(stream), size):
            try:
                packets += decoder.feed(stream[i : i + size])
            except wire.AudioSocketError as err:
                try:
                    decoder.feed(b"\x10\x00\x02ab")
                except wire.AudioSocketError:
                    return packets, err
                raise AssertionError("a failed decoder went on decoding") from err
        assert decoder.pending < wire.HEADER.size + wire.MAX_PAYLOAD
        return packets, None

    def check(data: bytes) -> None:
        if not data:
            return
        stream = data[1:]
        packets, error = decode(stream, 1 + data[0] % 64)
        whole, whole_error = decode(stream, max(1, len(stream)))
        # the same packets and the same error however TCP splits the stream (a read that
        # fails loses the packets before the error in it: the call ends there anyway)
        assert type(error) is type(whole_error)
        assert packets == whole if error is None else packets[: len(whole)] == whole
        rate = next((p.sample_rate for p in packets if p.is_audio), 8000)  # the call's
        for packet in packets:
            assert packet.kind in wire.FROM_ASTERISK
            assert wire.encode(packet.kind, packet.payload)  # re-encodes: a valid packet
            if packet.kind == wire.Kind.UUID:
                assert len(packet.uuid) == 36
            _check_carrier_event(packet_event(packet, rate), "audiosocket")

    return check


@target("voiceagent.telephony.asterisk_ws_control")
def asterisk_control() -> Check:
    """A chan_websocket text message from Asterisk (plain-text or JSON) into parse_event:
    an event with typed fields, or ValueError (which the call loop reports as Invalid).
    A MEDIA_START's format is looked up as serve_asterisk_ws does."""
    from voiceagent.telephony import asterisk_ws_control as ctl

    def check(data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        try:
            event = ctl.parse_event(text)
        except ValueError:
            return
        cid = getattr(event, "channel_id", None)
        assert cid is None or isinstance(cid, str), event
        if isinstance(event, ctl.MediaStart):
            for value in (event.connection_id, event.channel, event.format):
                assert isinstance(value, str)
            assert isinstance(event.optimal_frame_size, int) and isinstance(event.ptime, int)
            assert all(
                isinstance(k, str) and isinstance(v, str)
                for k, v in event.channel_variables.items()
            ), event
            with contextlib.suppress(ValueError):  # an unknown format: refused by its caller
                assert event.media.name == event.format
        elif isinstance(event, ctl.DtmfEnd):
            assert isinstance(event.digit, str)
        elif isinstance(event, ctl.MediaBufferingCompleted | ctl.MediaMarkProcessed):
            assert isinstance(event.correlation_id, str)
        elif isinstance(event, ctl.Status):
            assert all(isinstance(v, int) for v in astuple(event)[:3])
        elif isinstance(event, ctl.Error):
            assert isinstance(event.error_text, str)
        elif isinstance(event, ctl.Unknown):
            assert isinstance(event.name, str) and isinstance(event.fields, dict)

    return check


@target("voiceagent.telephony.bot", "voiceagent.telephony.call")
def call_bot() -> Check:
    """A bot's messages on WS /v1/calls: its first message into parse_attach and
    check_attach, later ones into the call's dispatch on their `type` (call.hangup,
    session.attach, or the session protocol). Neither raises."""
    from voiceagent.telephony.bot import check_attach, parse_attach
    from voiceagent.telephony.call import _type

    def check(data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        attach = parse_attach(text)
        if attach is not None:
            checked = check_attach(attach)
            assert isinstance(checked, str) or (
                isinstance(checked[0], str) and checked[1] in (0, 8000, 16000)
            )
        kind = _type(text)
        assert kind is None or isinstance(kind, str)

    return check


# -- running under atheris ---------------------------------------------------------------


def seed(name: str) -> Path:
    return CORPUS / name


def main(argv: list[str]) -> None:
    import atheris

    name, flags = argv[1], argv[2:]
    spec = TARGETS[name]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    with atheris.instrument_imports(include=list(spec.modules)):
        check = spec.setup()
    atheris.Setup([argv[0], *flags], check)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
