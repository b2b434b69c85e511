"""Specification tests for the sans-I/O session protocol (voiceagent.protocol).

`SessionCore` is driven with JSON text exactly as a client would send it; the actions it
returns are what a transport must execute. No sockets, no model.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from voiceagent.protocol import frames
from voiceagent.protocol.errors import ErrorCode
from voiceagent.protocol.messages import Format, Sampling, Settings
from voiceagent.protocol.recent_ids import RECENT_TURN_IDS
from voiceagent.protocol.session import (
    Action,
    AppendText,
    CancelTurn,
    Catalog,
    EndText,
    FlushText,
    Limits,
    ListenerPlayed,
    MicAudio,
    OpenTurn,
    SendAudio,
    SendEvent,
    SessionCore,
    SetGain,
)

MODEL = {"name": "tiny", "random_weights": True}
CATALOG = Catalog(voices=("agent", "narrator"), model=MODEL, default_voice="agent")
DEFAULTS = Settings(voice="agent")


def new_core(**limits: Any) -> SessionCore:
    return SessionCore("s1", CATALOG, Limits(**limits))


def send(core: SessionCore, message: dict[str, Any] | str) -> list[Action]:
    return core.receive_text(message if isinstance(message, str) else json.dumps(message))


def started(settings: dict[str, Any] | None = None, **limits: Any) -> SessionCore:
    core = new_core(**limits)
    [created] = send(core, {"type": "session.start", **(settings or {})})
    assert isinstance(created, SendEvent) and created.event["type"] == "session.created"
    return core


def events(actions: list[Action]) -> list[dict[str, Any]]:
    return [a.event for a in actions if isinstance(a, SendEvent)]


def assert_error(actions: list[Action], code: ErrorCode) -> dict[str, Any]:
    """The reply is exactly one `error` event with the stable `code` (and nothing else)."""
    assert len(actions) == 1, actions
    [action] = actions
    assert isinstance(action, SendEvent), action
    event = action.event
    assert event["type"] == "error"
    assert event["code"] == str(code) == code.value
    assert isinstance(event["message"], str) and event["message"]
    assert "turn_id" not in event  # a message error is not a turn failure
    json.dumps(event)  # sendable as is
    return event


def assert_speaks(core: SessionCore, text: str = "Hi there.") -> OpenTurn:
    """A valid `speak` opens, fills and ends a new turn: the session still works."""
    actions = send(core, {"type": "speak", "text": text})
    assert [type(a) for a in actions] == [OpenTurn, SendEvent, AppendText, EndText], actions
    opened = actions[0]
    assert isinstance(opened, OpenTurn)
    assert actions[1] == SendEvent(
        {
            "type": "turn.started",
            "turn_id": opened.turn_id,
            "turn": opened.num,
            "voice": opened.settings.voice,
            "queued": actions[1].event["queued"],  # type: ignore[union-attr]
        }
    )
    assert actions[2] == AppendText(opened.num, text)
    assert actions[3] == EndText(opened.num)
    return opened


def speak(core: SessionCore, text: str = "Hi.", **extra: Any) -> OpenTurn:
    actions = send(core, {"type": "speak", "text": text, **extra})
    opened = actions[0]
    assert isinstance(opened, OpenTurn), actions
    return opened


def ident(turn: OpenTurn) -> tuple[int, str]:
    return turn.num, turn.turn_id


# -- session start and update ------------------------------------------------------------


def test_session_start_creates_the_session_with_default_settings() -> None:
    core = new_core(max_message_bytes=1000, max_text_chars=50, max_turns=3)
    assert not core.started
    actions = send(core, {"type": "session.start"})
    assert actions == [
        SendEvent(
            {
                "type": "session.created",
                "session_id": "s1",
                "settings": {
                    "voice": "agent",
                    "language": "auto",
                    "speed": 1.0,
                    "chunking": "fast",
                    "sampling": {"temperature": 1.0, "top_k": 25, "top_p": 0.8, "seed": 0},
                    "format": {
                        "codec": "opus",
                        "sample_rate": 48000,
                        "bitrate": 32000,
                        "framing": "header",
                        "stream_sid": "",
                    },
                    "input": {
                        "sample_rate": 0,
                        "vad_aggressiveness": 2,
                        "min_speech_ms": 60,
                        "hangover_ms": 300,
                    },
                    "barge_in": {"mode": "off", "guard_ms": 300, "duck_gain": 0.25},
                    "playback": {"reports": False, "timeout_ms": 500},
                },
                "voices": ["agent", "narrator"],
                "roles": [],
                "model": MODEL,
                "limits": {"max_message_bytes": 1000, "max_text_chars": 50, "max_turns": 3},
            }
        )
    ]
    assert core.started
    assert core.settings == DEFAULTS
    json.dumps(actions[0].event)  # type: ignore[union-attr]


def test_a_session_samples_as_its_model_says_until_it_sets_its_own() -> None:
    """The catalog carries the model's temperature, top-k and top-p (our voice: 0.8
    and 5 rather than CosyVoice2's 1.0 and 25): a new session reports them and keeps
    what it sets itself."""
    catalog = Catalog(("agent",), MODEL, "agent", sampling=Sampling(0.8, top_k=5, top_p=0.9))
    core = SessionCore("s1", catalog, Limits())
    [created] = events(send(core, {"type": "session.start", "sampling": {"seed": 4}}))
    assert created["settings"]["sampling"] == {
        "temperature": 0.8,
        "top_k": 5,
        "top_p": 0.9,
        "seed": 4,
    }
    [updated] = events(send(core, {"type": "session.update", "sampling": {"top_k": 30}}))
    assert updated["settings"]["sampling"]["top_k"] == 30
    assert updated["settings"]["sampling"]["top_p"] == 0.9


def test_session_start_applies_the_settings_it_carries() -> None:
    core = new_core()
    [created] = send(
        core,
        {
            "type": "session.start",
            "voice": "narrator",
            "language": "en",
            "speed": 1.5,
            "chunking": "reference",
            "sampling": {"seed": 7, "top_k": 0},
            "format": {"codec": "pcm16", "sample_rate": 16000},
        },
    )
    assert isinstance(created, SendEvent)
    assert created.event["settings"] == {
        "voice": "narrator",
        "language": "en",
        "speed": 1.5,
        "chunking": "reference",
        "sampling": {"temperature": 1.0, "top_k": 0, "top_p": 0.8, "seed": 7},
        "format": {
            "codec": "pcm16",
            "sample_rate": 16000,
            "bitrate": 32000,
            "framing": "header",
            "stream_sid": "",
        },
        "input": {
            "sample_rate": 0,
            "vad_aggressiveness": 2,
            "min_speech_ms": 60,
            "hangover_ms": 300,
        },
        "barge_in": {"mode": "off", "guard_ms": 300, "duck_gain": 0.25},
        "playback": {"reports": False, "timeout_ms": 500},
    }
    opened = assert_speaks(core)
    assert opened.settings == Settings(
        voice="narrator",
        language="en",
        speed=1.5,
        chunking="reference",
        sampling=Sampling(seed=7, top_k=0),
        format=Format("pcm16", 16000, 32000),
    )


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"codec": "pcm16"}, ("pcm16", 24000)),  # a new codec gets its default rate
        ({"codec": "mulaw"}, ("mulaw", 8000)),
        ({"codec": "opus"}, ("opus", 48000)),
        ({"codec": "pcm16", "sample_rate": 8000}, ("pcm16", 8000)),
        ({"bitrate": 64000}, ("opus", 48000)),
    ],
)
def test_format_defaults_its_sample_rate_per_codec(
    fmt: dict[str, Any], expected: tuple[str, int]
) -> None:
    core = started()
    [updated] = send(core, {"type": "session.update", "format": fmt})
    assert isinstance(updated, SendEvent) and updated.event["type"] == "session.updated"
    got = updated.event["settings"]["format"]
    assert (got["codec"], got["sample_rate"]) == expected
    assert got["bitrate"] == fmt.get("bitrate", 32000)


def test_update_changes_settings_for_later_turns_while_an_open_turn_keeps_its_own() -> None:
    core = started()
    first = send(core, {"type": "text.delta", "text": "Hello"})
    assert isinstance(first[0], OpenTurn)
    assert first[0].settings == DEFAULTS

    update = {
        "type": "session.update",
        "voice": "narrator",
        "speed": 1.25,
        "format": {"codec": "mulaw"},
        "sampling": {"temperature": 0.5},
    }
    [updated] = send(core, update)
    assert isinstance(updated, SendEvent)
    assert updated.event["type"] == "session.updated"
    new = Settings(
        voice="narrator",
        speed=1.25,
        sampling=Sampling(temperature=0.5),
        format=Format("mulaw", 8000, 32000),
    )
    assert updated.event["settings"] == new.to_dict()
    assert core.settings == new

    # The open turn takes more text without being reopened with the new settings.
    assert send(core, {"type": "text.delta", "text": " world."}) == [AppendText(1, " world.")]
    assert send(core, {"type": "text.end"}) == [EndText(1)]

    second = assert_speaks(core)
    assert (second.num, second.turn_id) == (2, "t2")
    assert second.settings == new
    assert events(send(core, {"type": "speak", "text": "x"}))[0]["voice"] == "narrator"


def test_partial_updates_keep_the_other_settings() -> None:
    core = started({"sampling": {"seed": 3, "temperature": 0.7}, "speed": 0.75})
    send(core, {"type": "session.update", "sampling": {"top_k": 5}})
    send(core, {"type": "session.update", "format": {"bitrate": 16000}})
    assert core.settings == Settings(
        voice="agent",
        speed=0.75,
        sampling=Sampling(temperature=0.7, top_k=5, seed=3),
        format=Format("opus", 48000, 16000),
    )


def test_an_invalid_update_changes_nothing() -> None:
    core = started()
    before = core.settings
    assert_error(
        send(core, {"type": "session.update", "speed": 1.5, "format": {"codec": "mp3"}}),
        ErrorCode.INVALID_PARAMETER,
    )
    assert core.settings == before
    assert assert_speaks(core).settings == DEFAULTS


# -- turns ----------------------------------------------------------------------------------


def test_speak_opens_a_turn_then_sends_its_text_and_ends_it() -> None:
    core = started()
    actions = send(core, {"type": "speak", "text": "Hi there."})
    assert actions == [
        OpenTurn(1, "t1", DEFAULTS),
        SendEvent(
            {"type": "turn.started", "turn_id": "t1", "turn": 1, "voice": "agent", "queued": False}
        ),
        AppendText(1, "Hi there."),
        EndText(1),
    ]


def test_text_deltas_stream_into_the_open_turn_until_text_end() -> None:
    core = started()
    assert send(core, {"type": "text.delta", "text": "Hel"}) == [
        OpenTurn(1, "t1", DEFAULTS),
        SendEvent(
            {"type": "turn.started", "turn_id": "t1", "turn": 1, "voice": "agent", "queued": False}
        ),
        AppendText(1, "Hel"),
    ]
    assert send(core, {"type": "text.delta", "text": "lo, "}) == [AppendText(1, "lo, ")]
    # naming the open turn is the same as not naming it
    assert send(core, {"type": "text.delta", "text": "you", "turn_id": "t1"}) == [
        AppendText(1, "you")
    ]
    assert send(core, {"type": "text.delta", "text": ""}) == []  # nothing to add
    # `text.flush` starts synthesis of the buffered text; the turn stays open
    assert send(core, {"type": "text.flush"}) == [FlushText(1)]
    assert send(core, {"type": "text.end"}) == [EndText(1)]
    assert_error(send(core, {"type": "text.end"}), ErrorCode.NO_OPEN_TURN)
    assert_error(send(core, {"type": "text.flush"}), ErrorCode.NO_OPEN_TURN)
    # the next delta opens the next turn
    actions = send(core, {"type": "text.delta", "text": "More"})
    assert actions[0] == OpenTurn(2, "t2", DEFAULTS)
    assert events(actions)[0]["queued"] is True  # turn 1 has not finished yet
    # `speak` is always a whole turn of its own: it ends the open turn and opens another
    actions = send(core, {"type": "speak", "text": "Whole."})
    assert [type(a) for a in actions] == [EndText, OpenTurn, SendEvent, AppendText, EndText]
    assert actions[0] == EndText(2) and actions[-1] == EndText(3)


def test_an_empty_delta_opens_no_turn() -> None:
    core = started()
    assert send(core, {"type": "text.delta", "text": ""}) == []
    assert send(core, {"type": "text.delta", "text": "", "turn_id": "x"}) == []
    assert_error(send(core, {"type": "text.end"}), ErrorCode.NO_OPEN_TURN)
    assert (assert_speaks(core).num, core.settings) == (1, DEFAULTS)


def test_a_new_turn_id_ends_the_open_turn() -> None:
    core = started()
    send(core, {"type": "text.delta", "text": "One", "turn_id": "a"})
    actions = send(core, {"type": "text.delta", "text": "Two", "turn_id": "b"})
    assert actions == [
        EndText(1),
        OpenTurn(2, "b", DEFAULTS),
        SendEvent(
            {"type": "turn.started", "turn_id": "b", "turn": 2, "voice": "agent", "queued": True}
        ),
        AppendText(2, "Two"),
    ]
    # an empty delta changes nothing, whatever its id
    assert send(core, {"type": "text.delta", "text": "", "turn_id": "c"}) == []
    assert send(core, {"type": "text.end"}) == [EndText(2)]


def test_text_end_for_another_turn_id_is_unknown_and_leaves_the_open_turn_open() -> None:
    core = started()
    send(core, {"type": "text.delta", "text": "One", "turn_id": "a"})
    assert_error(send(core, {"type": "text.end", "turn_id": "zzz"}), ErrorCode.UNKNOWN_TURN)
    assert send(core, {"type": "text.delta", "text": " more"}) == [AppendText(1, " more")]
    assert send(core, {"type": "text.end", "turn_id": "a"}) == [EndText(1)]
    assert_error(send(core, {"type": "text.end", "turn_id": "a"}), ErrorCode.UNKNOWN_TURN)


def test_a_turn_can_choose_its_own_voice() -> None:
    core = started()
    actions = send(core, {"type": "speak", "text": "Hi.", "voice": "narrator"})
    assert actions[0] == OpenTurn(1, "t1", Settings(voice="narrator"))
    assert events(actions)[0]["voice"] == "narrator"
    assert core.settings == DEFAULTS  # the session voice is unchanged
    assert speak(core).settings.voice == "agent"

    # on an open turn, repeating its voice is fine; another voice is not
    send(core, {"type": "text.delta", "text": "A", "voice": "narrator"})
    assert send(core, {"type": "text.delta", "text": "B", "voice": "narrator"}) == [
        AppendText(3, "B")
    ]
    assert_error(
        send(core, {"type": "text.delta", "text": "C", "voice": "agent"}),
        ErrorCode.INVALID_PARAMETER,
    )
    assert send(core, {"type": "text.end"}) == [EndText(3)]


def test_turns_are_numbered_in_order_with_automatic_ids() -> None:
    core = started()
    opened = [speak(core) for _ in range(3)]
    assert [(t.num, t.turn_id) for t in opened] == [(1, "t1"), (2, "t2"), (3, "t3")]
    assert ident(speak(core, turn_id="custom")) == (4, "custom")
    assert ident(speak(core)) == (5, "t5")


def test_a_turn_id_cannot_be_used_twice() -> None:
    core = started()
    speak(core, turn_id="a")
    assert_error(
        send(core, {"type": "speak", "text": "x", "turn_id": "a"}), ErrorCode.DUPLICATE_TURN_ID
    )
    core.turn_done(1, {})  # not even after the turn finished
    assert_error(
        send(core, {"type": "speak", "text": "x", "turn_id": "a"}), ErrorCode.DUPLICATE_TURN_ID
    )
    assert ident(speak(core)) == (2, "t2")
    # an automatic id is taken too
    assert_error(
        send(core, {"type": "speak", "text": "x", "turn_id": "t2"}), ErrorCode.DUPLICATE_TURN_ID
    )
    assert assert_speaks(core).num == 3


def test_the_turn_queue_is_limited_and_finishing_a_turn_frees_a_slot() -> None:
    core = started(max_turns=2)
    speak(core)
    speak(core)
    full = assert_error(send(core, {"type": "speak", "text": "x"}), ErrorCode.TURN_QUEUE_FULL)
    assert "2" in full["message"]
    assert_error(send(core, {"type": "text.delta", "text": "x"}), ErrorCode.TURN_QUEUE_FULL)

    assert events(core.turn_done(1, {}))[0]["type"] == "turn.done"
    opened = send(core, {"type": "text.delta", "text": "open"})
    assert opened[0] == OpenTurn(3, "t3", DEFAULTS)  # rejected turns used no number
    # a rejected new turn id neither ends nor replaces the open turn
    assert_error(
        send(core, {"type": "speak", "text": "x", "turn_id": "new"}),
        ErrorCode.TURN_QUEUE_FULL,
    )
    assert send(core, {"type": "text.delta", "text": "!"}) == [AppendText(3, "!")]
    assert send(core, {"type": "text.end"}) == [EndText(3)]
    assert_error(send(core, {"type": "speak", "text": "x"}), ErrorCode.TURN_QUEUE_FULL)

    # a failed or cancelled turn frees its slot too
    core.turn_failed(2, ErrorCode.SYNTHESIS_FAILED, "boom")
    assert ident(speak(core)) == (4, "t4")
    send(core, {"type": "cancel", "turn_id": "t4"})
    assert ident(speak(core, turn_id="new")) == (5, "new")
    assert_error(send(core, {"type": "speak", "text": "x"}), ErrorCode.TURN_QUEUE_FULL)


# -- audio, done, failed ------------------------------------------------------------------


def test_audio_sends_first_audio_once_then_numbered_frames() -> None:
    core = started()
    speak(core)
    speak(core)
    first = core.audio(1, "opus", b"p0")
    assert first[0] == SendEvent({"type": "turn.first_audio", "turn_id": "t1", "turn": 1})
    sent = [first[1], *core.audio(1, "opus", b"p1"), *core.audio(1, "opus", b"p2")]
    assert sent == [
        SendAudio(1, 0, 0, "opus", b"p0"),
        SendAudio(1, 1, 20, "opus", b"p1"),
        SendAudio(1, 2, 40, "opus", b"p2"),
    ]
    timings = {"ttfa_ms": 12.5, "chunks": 2}
    done = core.turn_done(1, timings)
    assert done[-1] == SendEvent(
        {"type": "turn.done", "turn_id": "t1", "turn": 1, "sent_ms": 60, "timings": timings}
    )
    assert core.audio(1, "opus", b"late") == []  # nothing after the end
    assert core.turn_done(1, timings) == []

    # each turn counts from 0, with its own codec
    second = core.audio(2, "pcm16", b"\x00\x01")
    assert events(second) == [{"type": "turn.first_audio", "turn_id": "t2", "turn": 2}]
    assert second[1] == SendAudio(2, 0, 0, "pcm16", b"\x00\x01")


def test_audio_for_a_turn_that_never_existed_sends_nothing() -> None:
    core = started()
    assert core.audio(7, "opus", b"x") == []
    assert core.turn_done(7, {}) == []
    assert core.turn_failed(7, ErrorCode.SYNTHESIS_FAILED, "x") == []


def test_audio_for_a_cancelled_turn_sends_nothing() -> None:
    core = started()
    speak(core)
    core.audio(1, "opus", b"p0")
    send(core, {"type": "cancel", "turn_id": "t1"})
    assert core.audio(1, "opus", b"p1") == []
    assert core.turn_done(1, {}) == []


def test_a_failed_turn_reports_its_error_with_its_id() -> None:
    core = started()
    speak(core, turn_id="x")
    assert core.turn_failed(1, ErrorCode.SYNTHESIS_FAILED, "synthesis failed: boom") == [
        SendEvent(
            {
                "type": "error",
                "code": "synthesis_failed",
                "message": "synthesis failed: boom",
                "turn_id": "x",
            }
        )
    ]
    assert core.audio(1, "opus", b"x") == []


def cancelled(
    turn: int, sent_ms: int, played_ms: int = 0, source: str = "server", reason: str = "cancel"
) -> SendEvent:
    return SendEvent(
        {
            "type": "turn.cancelled",
            "turn_id": f"t{turn}",
            "turn": turn,
            "reason": reason,
            "sent_ms": sent_ms,
            "played_ms": played_ms,
            "played_source": source,
        }
    )


def test_cancel_by_id_stops_that_turn_then_reports_what_the_listener_heard() -> None:
    core = started()
    speak(core)
    speak(core)
    for _ in range(3):
        core.audio(1, "opus", b"x")
    # The turn sent audio: the runner stops it and asks the transport what was heard.
    assert send(core, {"type": "cancel", "turn_id": "t1"}) == [CancelTurn(1, sent_audio=True)]
    assert core.stopped(1, 45, "server") == [cancelled(1, 60, 45)]
    assert core.stopped(1, 50, "server") == []  # the first answer counts
    # the other turn is untouched
    assert [type(a) for a in core.audio(2, "opus", b"y")] == [SendEvent, SendAudio]
    # cancelling a finished turn again is a no-op, not an error
    assert send(core, {"type": "cancel", "turn_id": "t1"}) == []


def test_cancel_without_id_stops_every_live_turn_including_the_open_one() -> None:
    core = started()
    speak(core)
    speak(core)
    send(core, {"type": "text.delta", "text": "open"})
    core.audio(1, "opus", b"x")
    core.audio(1, "opus", b"x")
    # Turns that sent nothing were heard for 0 ms: they are reported at once.
    assert send(core, {"type": "cancel"}) == [
        CancelTurn(1, sent_audio=True),
        CancelTurn(2),
        cancelled(2, 0),
        CancelTurn(3),
        cancelled(3, 0),
    ]
    # played_ms never exceeds what was sent
    assert core.stopped(1, 75, "report") == [cancelled(1, 40, 40, "report")]
    assert send(core, {"type": "cancel"}) == []  # nothing left to cancel
    assert_error(send(core, {"type": "text.end"}), ErrorCode.NO_OPEN_TURN)
    assert ident(speak(core)) == (4, "t4")


def test_cancel_of_an_unknown_turn_id_is_an_error() -> None:
    core = started()
    speak(core)
    assert_error(send(core, {"type": "cancel", "turn_id": "nope"}), ErrorCode.UNKNOWN_TURN)
    assert core.audio(1, "opus", b"x")  # turn 1 still plays
    assert assert_speaks(core).num == 2


def test_ping_is_answered_with_pong_before_and_after_start() -> None:
    core = new_core()
    assert send(core, {"type": "ping"}) == [SendEvent({"type": "pong"})]
    assert not core.started
    send(core, {"type": "session.start"})
    assert send(core, {"type": "ping", "id": 5}) == [SendEvent({"type": "pong"})]


# -- binary frames -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        frames.AudioFrame("opus", 1, 0, 0, b"\xfc\xff\xfe"),
        frames.AudioFrame("pcm16", 7, 3, 60, bytes(960)),
        frames.AudioFrame("mulaw", 2**32 - 1, 2**32 - 1, 2**32 - 1, b""),
    ],
)
def test_frames_round_trip(frame: frames.AudioFrame) -> None:
    data = frames.pack(frame)
    assert len(data) == 16 + len(frame.payload)
    assert data[:16] == struct.pack(
        "!BBHIII", 1, frames.CODEC_IDS[frame.codec], 0, frame.turn, frame.seq, frame.pts_ms
    )
    assert frames.unpack(data) == frame


def test_frame_header_layout_is_big_endian() -> None:
    data = frames.pack(frames.AudioFrame("pcm16", 1, 2, 40, b"ab"))
    assert data == bytes.fromhex("01020000000000010000000200000028") + b"ab"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01\x01",
        bytes(15),
        bytes.fromhex("02010000" + "00" * 12),  # unknown version
        bytes.fromhex("00010000" + "00" * 12),
        bytes.fromhex("01000000" + "00" * 12),  # unknown codec
        bytes.fromhex("01050000" + "00" * 12),
        b"not an audio frame at all",
    ],
)
def test_unpack_rejects_garbage(data: bytes) -> None:
    with pytest.raises(ValueError):
        frames.unpack(data)


# -- bad input: every error has a stable code and the session keeps working ---------------


@pytest.mark.parametrize(
    "data",
    [
        "",
        "{",
        "not json",
        "{'type': 'ping'}",
        '{"type": "ping",}',
        '{"type": "speak" "text": "x"}',
        "[" * 50_000,  # nesting too deep for the parser
        '{"type": "ping", "n": ' + "1" * 5000 + "}",  # integer too long to convert
    ],
)
def test_malformed_json_is_invalid_json(data: str) -> None:
    core = started()
    assert_error(send(core, data), ErrorCode.INVALID_JSON)
    assert_speaks(core)


@pytest.mark.parametrize(
    "data",
    [
        "[]",
        '[{"type": "ping"}]',
        "1",
        '"ping"',
        "null",
        "true",
        "{}",
        '{"kind": "speak"}',
        '{"type": null}',
        '{"type": 5}',
        '{"type": ["speak"]}',
        '{"type": {"name": "speak"}}',
        '{"type": "speak"}',  # `text` is required
        '{"type": "text.delta", "text": null}',
    ],
)
def test_json_that_is_not_a_message_is_invalid_message(data: str) -> None:
    core = started()
    assert_error(send(core, data), ErrorCode.INVALID_MESSAGE)
    assert_speaks(core)


@pytest.mark.parametrize("kind", ["spek", "", "SPEAK", "session.stop", "text", " ping"])
def test_an_unknown_type_is_unknown_type(kind: str) -> None:
    core = started()
    assert_error(send(core, {"type": kind, "text": "x"}), ErrorCode.UNKNOWN_TYPE)
    assert_speaks(core)


@pytest.mark.parametrize("data", [b"", b"\x00", b'{"type": "ping"}', bytes(4096)])
def test_binary_input_is_unexpected_binary(data: bytes) -> None:
    core = new_core()
    assert_error(core.receive_bytes(data), ErrorCode.SESSION_NOT_STARTED)
    send(core, {"type": "session.start"})
    assert_error(core.receive_bytes(data), ErrorCode.UNEXPECTED_BINARY)
    assert_speaks(core)


def _speak_of_size(size: int, char: str = "a") -> str:
    """A `speak` message of exactly `size` UTF-8 bytes (char must be 1 or 2 bytes)."""
    head, tail = '{"type": "speak", "text": "', '"}'
    room = size - len(head) - len(tail)
    width = len(char.encode())
    text = char * (room // width) + "b" * (room % width)
    message = head + text + tail
    assert len(message.encode()) == size
    return message


def test_a_message_over_the_byte_limit_is_message_too_large() -> None:
    core = started(max_message_bytes=256)
    assert_error(send(core, _speak_of_size(257)), ErrorCode.MESSAGE_TOO_LARGE)
    # the limit is in UTF-8 bytes, not characters
    message = _speak_of_size(300, "é")
    assert len(message) < 256
    assert_error(send(core, message), ErrorCode.MESSAGE_TOO_LARGE)
    assert_error(send(core, "x" * 100_000), ErrorCode.MESSAGE_TOO_LARGE)  # not even parsed
    # exactly at the limit is fine
    assert_speaks(core, json.loads(_speak_of_size(256))["text"])
    assert_speaks(core)


def test_a_message_too_large_is_rejected_before_the_session_starts() -> None:
    core = new_core(max_message_bytes=64)
    assert_error(
        send(core, {"type": "session.start", "voice": "a" * 64}), ErrorCode.MESSAGE_TOO_LARGE
    )
    assert not core.started
    send(core, {"type": "session.start"})
    assert_speaks(core)


def test_turn_text_over_the_limit_is_text_too_long() -> None:
    core = started(max_text_chars=10)
    assert_error(send(core, {"type": "speak", "text": "x" * 11}), ErrorCode.TEXT_TOO_LONG)
    assert_error(send(core, {"type": "text.delta", "text": "x" * 11}), ErrorCode.TEXT_TOO_LONG)
    # a rejected turn is not opened: no turn to end, and the next turn is turn 1
    assert_error(send(core, {"type": "text.end"}), ErrorCode.NO_OPEN_TURN)
    opened = assert_speaks(core, "x" * 10)  # exactly at the limit
    assert (opened.num, opened.turn_id) == (1, "t1")
    assert assert_speaks(core, "é" * 10).num == 2  # counted in characters


def test_turn_text_accumulated_over_deltas_is_limited_per_turn() -> None:
    core = started(max_text_chars=10)
    assert send(core, {"type": "text.delta", "text": "12345"})[-1] == AppendText(1, "12345")
    assert send(core, {"type": "text.delta", "text": "6789"}) == [AppendText(1, "6789")]
    assert_error(send(core, {"type": "text.delta", "text": "ab"}), ErrorCode.TEXT_TOO_LONG)
    # the turn stays open and still takes what fits
    assert send(core, {"type": "text.delta", "text": "0"}) == [AppendText(1, "0")]
    assert_error(send(core, {"type": "text.delta", "text": "!"}), ErrorCode.TEXT_TOO_LONG)
    assert send(core, {"type": "text.end"}) == [EndText(1)]
    # the limit is per turn: the next turn starts from zero
    assert assert_speaks(core, "x" * 10).num == 2


def test_a_new_turn_id_with_text_too_long_leaves_the_open_turn_open() -> None:
    core = started(max_text_chars=10)
    send(core, {"type": "text.delta", "text": "open", "turn_id": "a"})
    assert_error(
        send(core, {"type": "speak", "text": "x" * 11, "turn_id": "b"}), ErrorCode.TEXT_TOO_LONG
    )
    assert send(core, {"type": "text.end"}) == [EndText(1)]
    assert ident(speak(core, turn_id="b")) == (2, "b")


@pytest.mark.parametrize(
    "message",
    [
        {"type": "session.update", "voice": "nobody"},
        {"type": "session.update", "voice": "supervisor"},  # a model voice not offered
        {"type": "session.update", "voice": "Agent"},
        {"type": "speak", "text": "Hi.", "voice": "nobody"},
        {"type": "text.delta", "text": "Hi.", "voice": ""},
    ],
)
def test_an_unknown_voice_is_unknown_voice(message: dict[str, Any]) -> None:
    core = started()
    event = assert_error(send(core, message), ErrorCode.UNKNOWN_VOICE)
    assert "agent" in event["message"] and "narrator" in event["message"]
    assert core.settings == DEFAULTS
    assert_error(send(core, {"type": "text.end"}), ErrorCode.NO_OPEN_TURN)  # nothing opened
    assert assert_speaks(core).num == 1


def test_an_unknown_voice_in_session_start_leaves_the_session_unstarted() -> None:
    core = new_core()
    assert_error(send(core, {"type": "session.start", "voice": "nobody"}), ErrorCode.UNKNOWN_VOICE)
    assert not core.started
    assert_error(send(core, {"type": "speak", "text": "x"}), ErrorCode.SESSION_NOT_STARTED)
    send(core, {"type": "session.start", "voice": "narrator"})
    assert assert_speaks(core).settings.voice == "narrator"


def test_an_unknown_voice_under_a_new_turn_id_leaves_the_open_turn_open() -> None:
    core = started()
    send(core, {"type": "text.delta", "text": "open", "turn_id": "a"})
    assert_error(
        send(core, {"type": "speak", "text": "x", "turn_id": "b", "voice": "nobody"}),
        ErrorCode.UNKNOWN_VOICE,
    )
    assert_error(
        send(core, {"type": "speak", "text": "x", "turn_id": "a2", "voice": 5}),
        ErrorCode.INVALID_PARAMETER,
    )
    assert send(core, {"type": "text.delta", "text": "!"}) == [AppendText(1, "!")]
    assert send(core, {"type": "text.end", "turn_id": "a"}) == [EndText(1)]


def test_a_session_remembers_its_last_turn_ids_not_all_of_them() -> None:
    # What was seen: every turn id a session ever used stayed in a set, about 1 KiB a turn
    # on the live server (300 MB an hour for a client opening and cancelling turns).
    core = started()
    for i in range(RECENT_TURN_IDS + 5):
        turn = speak(core, turn_id=f"id-{i}")
        core.turn_done(turn.num, {})
    assert len(core._ids) == RECENT_TURN_IDS
    assert ident(speak(core, turn_id="id-0"))[1] == "id-0"  # long forgotten: free again
    core.turn_done(RECENT_TURN_IDS + 6, {})
    recent = f"id-{RECENT_TURN_IDS + 4}"
    assert_error(
        send(core, {"type": "speak", "text": "x", "turn_id": recent}), ErrorCode.DUPLICATE_TURN_ID
    )


def test_a_duplicate_turn_id_leaves_the_open_turn_open() -> None:
    core = started()
    speak(core, turn_id="old")
    send(core, {"type": "text.delta", "text": "open", "turn_id": "a"})
    assert_error(
        send(core, {"type": "speak", "text": "x", "turn_id": "old"}),
        ErrorCode.DUPLICATE_TURN_ID,
    )
    assert send(core, {"type": "text.end"}) == [EndText(2)]


INVALID_SETTINGS: list[dict[str, Any]] = [
    {"speed": 0},
    {"speed": 5},
    {"speed": 0.49},
    {"speed": 2.01},
    {"speed": "fast"},
    {"speed": True},
    {"speed": None},
    {"speed": [1.0]},
    {"language": "xx"},
    {"language": 5},
    {"language": ["en"]},
    {"voice": 5},
    {"voice": None},
    {"voice": ["agent"]},
    {"sampling": {"temperature": -1}},
    {"sampling": {"temperature": 2.5}},
    {"sampling": {"temperature": "hot"}},
    {"sampling": {"top_k": 1.5}},
    {"sampling": {"top_k": -1}},
    {"sampling": {"top_k": 1001}},
    {"sampling": {"top_k": True}},
    {"sampling": {"top_p": 0}},
    {"sampling": {"top_p": 1.01}},
    {"sampling": {"seed": -1}},
    {"sampling": {"seed": 2**31}},
    {"sampling": {"seed": 1.0}},
    {"sampling": {"seed": "1"}},
    {"sampling": {"min_p": 0.1}},  # unknown key inside sampling
    {"sampling": 0.5},
    {"sampling": [1, 2]},
    {"sampling": None},
    {"format": {"codec": "mp3"}},
    {"format": {"codec": 1}},
    {"format": {"codec": ["opus"]}},
    {"format": {"codec": {"name": "opus"}}},
    {"format": {"codec": "pcm16", "sample_rate": 11025}},
    {"format": {"codec": "pcm16", "sample_rate": 16000.0}},
    {"format": {"codec": "pcm16", "sample_rate": "24000"}},
    {"format": {"codec": "opus", "sample_rate": 24000}},
    {"format": {"codec": "mulaw", "sample_rate": 16000}},
    {"format": {"sample_rate": 16000}},  # not for the current codec (opus)
    {"format": {"bitrate": 1}},
    {"format": {"bitrate": 10**7}},
    {"format": {"bitrate": 32000.5}},
    {"format": {"channels": 2}},  # unknown key inside format
    {"format": "opus"},
    {"input": {"min_speech_ms": 10}},
    {"input": {"hangover_ms": 60.5}},
    {"barge_in": {"mode": "shout"}},
    {"barge_in": {"guard_ms": 9000}},
    {"barge_in": {"duck_gain": 1.5}},
    {"barge_in": {"duck_gain": "low"}},
    {"volume": 1.0},  # unknown setting key
    {"settings": {"voice": "agent"}},
]


@pytest.mark.parametrize("changes", INVALID_SETTINGS, ids=lambda c: json.dumps(c)[:60])
def test_an_invalid_setting_in_session_update_is_invalid_parameter(changes: dict[str, Any]) -> None:
    core = started()
    assert_error(send(core, {"type": "session.update", **changes}), ErrorCode.INVALID_PARAMETER)
    assert core.settings == DEFAULTS
    assert assert_speaks(core).settings == DEFAULTS


@pytest.mark.parametrize("changes", INVALID_SETTINGS, ids=lambda c: json.dumps(c)[:60])
def test_an_invalid_setting_in_session_start_is_invalid_parameter(changes: dict[str, Any]) -> None:
    core = new_core()
    assert_error(send(core, {"type": "session.start", **changes}), ErrorCode.INVALID_PARAMETER)
    assert not core.started
    send(core, {"type": "session.start"})
    assert assert_speaks(core).settings == DEFAULTS


@pytest.mark.parametrize(
    "message",
    [
        {"type": "speak", "text": 5},
        {"type": "speak", "text": ["Hi."]},
        {"type": "text.delta", "text": {"t": "Hi."}},
        {"type": "speak", "text": "Hi.", "turn_id": 1},
        {"type": "speak", "text": "Hi.", "turn_id": "x" * 129},
        {"type": "speak", "text": "Hi.", "voice": 5},
        {"type": "speak", "text": "Hi.", "voice": "v" * 129},
        {"type": "text.end", "turn_id": ["t1"]},
        {"type": "cancel", "turn_id": 1},
        {"type": "cancel", "turn_id": "x" * 129},
    ],
)
def test_invalid_fields_of_turn_messages_are_invalid_parameter(message: dict[str, Any]) -> None:
    core = started()
    assert_error(send(core, message), ErrorCode.INVALID_PARAMETER)
    assert assert_speaks(core).num == 1


@pytest.mark.parametrize(
    "message",
    [
        {"type": "speak", "text": "Hi."},
        {"type": "text.delta", "text": "Hi."},
        {"type": "text.end"},
        {"type": "session.update", "voice": "narrator"},
        {"type": "session.update", "voice": "nobody"},  # order is checked first
        {"type": "cancel"},
        {"type": "cancel", "turn_id": "t1"},
    ],
)
def test_messages_before_session_start_are_session_not_started(message: dict[str, Any]) -> None:
    core = new_core()
    assert_error(send(core, message), ErrorCode.SESSION_NOT_STARTED)
    assert not core.started
    send(core, {"type": "session.start"})
    assert core.settings == DEFAULTS
    opened = assert_speaks(core)
    assert (opened.num, opened.turn_id) == (1, "t1")


def test_a_second_session_start_is_session_already_started() -> None:
    core = started({"voice": "narrator"})
    speak(core)
    assert_error(
        send(core, {"type": "session.start", "voice": "agent"}), ErrorCode.SESSION_ALREADY_STARTED
    )
    assert_error(send(core, {"type": "session.start"}), ErrorCode.SESSION_ALREADY_STARTED)
    assert core.settings == Settings(voice="narrator")
    assert assert_speaks(core).num == 2


@pytest.mark.parametrize(
    "before",
    [
        [],
        [{"type": "speak", "text": "done"}],
        [{"type": "text.delta", "text": "a"}, {"type": "text.end"}],
        [{"type": "text.delta", "text": "a"}, {"type": "cancel"}],
    ],
)
def test_text_end_with_no_open_turn_is_no_open_turn(before: list[dict[str, Any]]) -> None:
    core = started()
    for message in before:
        send(core, message)
    assert_error(send(core, {"type": "text.end"}), ErrorCode.NO_OPEN_TURN)
    assert_speaks(core)


def test_a_burst_of_bad_input_leaves_the_session_in_a_clean_state() -> None:
    core = started(max_text_chars=20, max_turns=2)
    bad = [
        "{",
        "[]",
        '{"type": "nope"}',
        json.dumps({"type": "speak", "text": "x" * 21}),
        json.dumps({"type": "speak", "text": "x", "voice": "nobody"}),
        json.dumps({"type": "session.update", "speed": 9}),
        json.dumps({"type": "session.start"}),
        json.dumps({"type": "text.end"}),
        json.dumps({"type": "cancel", "turn_id": "nope"}),
    ]
    for data in bad * 3:
        [reply] = send(core, data)
        assert isinstance(reply, SendEvent) and reply.event["type"] == "error"
    assert core.settings == DEFAULTS
    assert [assert_speaks(core).num for _ in range(2)] == [1, 2]


def test_automatic_turn_ids_skip_ids_the_client_chose() -> None:
    core = started()
    send(core, {"type": "speak", "text": "Mine.", "turn_id": "t2"})
    second = assert_speaks(core)
    third = assert_speaks(core)
    assert (second.turn_id, third.turn_id) == ("t2.2", "t3")


def test_speak_needs_some_text() -> None:
    core = started()
    assert_error(send(core, {"type": "speak", "text": "  "}), ErrorCode.INVALID_PARAMETER)
    assert assert_speaks(core).num == 1


def test_text_that_is_not_valid_unicode_is_refused_up_front() -> None:
    core = started()
    lone_surrogate = '{"type": "speak", "text": "a\\ud800b"}'
    assert_error(send(core, lone_surrogate), ErrorCode.INVALID_PARAMETER)
    assert assert_speaks(core).num == 1


def test_a_model_without_voices_says_so_instead_of_failing() -> None:
    core = SessionCore("s", Catalog(voices=(), model={}, default_voice=""), Limits())
    assert events(send(core, {"type": "session.start"}))[0]["type"] == "session.created"
    assert_error(send(core, {"type": "speak", "text": "Hi."}), ErrorCode.UNKNOWN_VOICE)
    core.catalog.voices = ("added",)  # a voice made with `voice add` appears
    send(core, {"type": "session.update", "voice": "added"})
    assert isinstance(send(core, {"type": "speak", "text": "Hi."})[0], OpenTurn)


def test_binary_is_microphone_audio_once_the_input_rate_is_set() -> None:
    core = started({"input": {"sample_rate": 16000}})
    assert core.receive_bytes(bytes(640)) == [MicAudio(bytes(640), 16000)]
    assert_error(core.receive_bytes(bytes(641)), ErrorCode.INVALID_MESSAGE)
    assert_error(core.receive_bytes(bytes(70_000)), ErrorCode.MESSAGE_TOO_LARGE)
    assert_error(
        send(core, {"type": "session.update", "input": {"sample_rate": 11025}}),
        ErrorCode.INVALID_PARAMETER,
    )
    assert_speaks(core)


def test_speech_onset_past_the_guard_cancels_the_live_turns() -> None:
    core = started({"barge_in": {"mode": "cancel", "guard_ms": 300}})
    opened = assert_speaks(core)
    for _ in range(30):
        core.audio(opened.num, "opus", b"x")
    # Too early in the turn (echo of its own start): reported, not cancelled.
    assert events(core.speech("speech_started", 100, played_ms=200)) == [
        {"type": "speech_started", "t_ms": 100}
    ]
    actions = core.speech("speech_started", 900, played_ms=460)
    assert actions == [
        SendEvent({"type": "speech_started", "t_ms": 900}),
        CancelTurn(opened.num, sent_audio=True),
    ]
    assert core.stopped(opened.num, 470, "server") == [
        cancelled(opened.num, 600, 470, reason="barge_in")
    ]


def test_speech_begun_inside_the_guard_barges_in_once_it_goes_on_past_it() -> None:
    core = started({"barge_in": {"mode": "cancel", "guard_ms": 300}})
    opened = assert_speaks(core)
    core.audio(opened.num, "opus", b"x")
    # The onset is held (it may be the echo of the turn's start) ...
    assert events(core.speech("speech_started", 100, played_ms=120)) == [
        {"type": "speech_started", "t_ms": 100}
    ]
    assert core.onset_held
    # ... and the runner, having heard enough voiced audio past the guard, says so.
    assert core.talked_over(600) == [CancelTurn(opened.num, sent_audio=True)]
    assert not core.onset_held and core.talked_over(700) == []  # once


def test_a_held_onset_that_stops_inside_the_guard_was_only_an_echo() -> None:
    core = started({"barge_in": {"mode": "duck", "guard_ms": 300, "duck_gain": 0.2}})
    opened = assert_speaks(core)
    core.audio(opened.num, "opus", b"x")
    core.speech("speech_started", 100, played_ms=120)
    core.speech("speech_stopped", 250, played_ms=280)
    assert not core.onset_held and core.talked_over(400) == []
    # speech before any turn plays is held too; ducking past the guard happens once
    core.speech("speech_started", 900, played_ms=None)
    assert core.talked_over(1300) == [
        SetGain(0.2),
        SendEvent({"type": "audio.ducked", "t_ms": 1300, "gain": 0.2}),
    ]
    assert core.speech("speech_started", 1400, played_ms=500)[1:] == []  # already ducked


def test_duck_lowers_the_output_while_the_person_speaks_and_restores_it_after() -> None:
    core = started({"barge_in": {"mode": "duck", "guard_ms": 300, "duck_gain": 0.2}})
    opened = assert_speaks(core)
    core.audio(opened.num, "opus", b"x")
    assert core.speech("speech_started", 50, played_ms=100) == [
        SendEvent({"type": "speech_started", "t_ms": 50})
    ]  # inside the guard: nothing changes
    ducked = core.speech("speech_started", 900, played_ms=800)
    assert ducked == [
        SendEvent({"type": "speech_started", "t_ms": 900}),
        SetGain(0.2),
        SendEvent({"type": "audio.ducked", "t_ms": 900, "gain": 0.2}),
    ]
    assert not any(isinstance(a, CancelTurn) for a in ducked)  # the turn plays on
    assert core.speech("speech_stopped", 1500, played_ms=1400) == [
        SendEvent({"type": "speech_stopped", "t_ms": 1500}),
        SetGain(1.0),
        SendEvent({"type": "audio.unducked", "t_ms": 1500}),
    ]
    # a stop without a duck before it changes nothing
    assert core.speech("speech_stopped", 1600, played_ms=1400) == [
        SendEvent({"type": "speech_stopped", "t_ms": 1600})
    ]


def test_levels_go_out_in_batches_that_cover_every_frame_once() -> None:
    core = started()
    opened = assert_speaks(core)
    sent = []
    for i in range(12):
        sent += core.audio(opened.num, "opus", b"x", level=i / 100)
    sent += core.turn_done(opened.num, {})
    batches = [e for e in events(sent) if e["type"] == "audio.levels"]
    assert [(b["offset_ms"], b["levels"]) for b in batches] == [
        (0, [0.0, 0.01, 0.02, 0.03, 0.04]),
        (100, [0.05, 0.06, 0.07, 0.08, 0.09]),
        (200, [0.1, 0.11]),  # the rest, just before turn.done
    ]
    assert events(sent)[-1]["type"] == "turn.done"
    # a batch goes out only after the frames it covers
    kinds = ["frame" if isinstance(a, SendAudio) else a.event["type"] for a in sent]
    assert kinds.index("audio.levels") == kinds.index("frame") + 5


def test_a_cancelled_turn_sends_no_more_levels() -> None:
    core = started()
    opened = assert_speaks(core)
    core.audio(opened.num, "opus", b"x", level=0.5)
    assert events(send(core, {"type": "cancel"})) == []  # no audio.levels for it
    assert [e["type"] for e in events(core.stopped(opened.num, 20, "server"))] == ["turn.cancelled"]
    assert core.audio(opened.num, "opus", b"x", level=0.5) == []


def test_without_barge_in_speech_is_only_reported() -> None:
    core = started()
    opened = assert_speaks(core)
    core.audio(opened.num, "opus", b"x")
    actions = core.speech("speech_started", 0, played_ms=5000)
    assert events(actions) == [{"type": "speech_started", "t_ms": 0}]
    assert not any(isinstance(a, CancelTurn) for a in actions)


# -- playback reports: the listener says how much it played ---------------------------------


def test_with_playback_reports_a_cancel_clears_the_listener_and_waits_for_its_report() -> None:
    core = started({"playback": {"reports": True, "timeout_ms": 400}})
    speak(core)
    for _ in range(10):
        core.audio(1, "opus", b"x")
    assert send(core, {"type": "cancel"}) == [
        CancelTurn(1, sent_audio=True, wait_listener_ms=400),
        SendEvent({"type": "audio.clear", "turn_id": "t1", "turn": 1}),
    ]
    # The listener stopped and says what it played: that is the truth, and final.
    report = {"type": "playback", "turn_id": "t1", "played_ms": 140, "stopped": True}
    assert send(core, report) == [cancelled(1, 200, 140, "listener")]
    assert core.stopped(1, 180, "server") == []  # the runner's fallback comes too late
    assert send(core, report) == []  # a repeated report of a finished turn is ignored


def test_without_the_listener_s_report_the_runner_s_estimate_is_used() -> None:
    core = started({"playback": {"reports": True}})
    speak(core)
    core.audio(1, "opus", b"x")
    send(core, {"type": "cancel"})
    assert core.stopped(1, 20, "report") == [cancelled(1, 20, 20, "report")]


def test_running_playback_reports_go_to_the_runner() -> None:
    core = started()
    speak(core)
    core.audio(1, "opus", b"x")
    assert send(core, {"type": "playback", "turn_id": "t1", "played_ms": 0}) == [
        ListenerPlayed(1, 0)
    ]
    # a transport with its own reports (telephony marks) uses the same entry
    assert core.playback(1, 20) == [ListenerPlayed(1, 20)]


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"type": "playback", "turn_id": "nope", "played_ms": 0}, ErrorCode.UNKNOWN_TURN),
        ({"type": "playback", "played_ms": 0}, ErrorCode.INVALID_MESSAGE),
        ({"type": "playback", "turn_id": "t1"}, ErrorCode.INVALID_PARAMETER),
        ({"type": "playback", "turn_id": "t1", "played_ms": -1}, ErrorCode.INVALID_PARAMETER),
        ({"type": "playback", "turn_id": "t1", "played_ms": 1.5}, ErrorCode.INVALID_PARAMETER),
        (
            {"type": "playback", "turn_id": "t1", "played_ms": 1, "stopped": "yes"},
            ErrorCode.INVALID_PARAMETER,
        ),
    ],
)
def test_bad_playback_reports_are_errors_and_change_nothing(
    message: dict[str, Any], code: ErrorCode
) -> None:
    core = started()
    speak(core)
    core.audio(1, "opus", b"x")
    assert_error(send(core, message), code)
    assert core.audio(1, "opus", b"y")  # turn 1 still plays


def test_a_pinned_format_replaces_the_client_s_format() -> None:
    pinned = Format("pcm16", 48000)
    core = SessionCore("s1", CATALOG, Limits(), pinned_format=pinned)
    [created] = send(core, {"type": "session.start", "format": {"codec": "mulaw"}})
    assert created.event["settings"]["format"]["codec"] == "pcm16"  # type: ignore[union-attr]
    send(core, {"type": "session.update", "format": {"codec": "opus"}})
    assert core.settings is not None and core.settings.format == pinned
