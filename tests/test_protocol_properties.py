"""Property tests of the sans-I/O session core: hypothesis drives one `SessionCore` with
any sequence of client messages (valid, invalid, random JSON, random bytes, oversize) and
of the runner's calls (audio frames, turn ends and failures, cancel answers, playback
reports, speech), and checks after every step what must always hold:

- nothing raises, and every action is one of protocol/actions.py's;
- every error is an `error` event with a stable `ErrorCode`, and a refused message gets
  that one event and nothing else;
- at most one turn is open; live turns never exceed `max_turns`;
- turn numbers strictly increase and turn ids are never reused;
- a turn ends exactly once (turn.done, turn.cancelled or its error), and a turn that is
  cancelled or ended says and sends nothing more;
- audio frames of a turn are numbered 0, 1, 2... and their pts and `sent_ms` agree.

The model below knows only what the client and the runner saw (the actions), never the
core's private state. Derandomized, with bounded examples: the same run every time.
"""

from __future__ import annotations

import json
import typing
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from voiceagent.audio.format import FRAME_MS
from voiceagent.protocol import actions as A
from voiceagent.protocol.errors import ErrorCode
from voiceagent.protocol.messages import SETTINGS
from voiceagent.protocol.session import Catalog, Limits, SessionCore

CATALOG = Catalog(voices=("agent", "narrator"), model={"name": "prop"}, default_voice="agent")
LIMITS = Limits(max_message_bytes=2048, max_text_chars=120, max_turns=3, max_audio_bytes=256)
CODES = {c.value for c in ErrorCode}
ACTION_TYPES = typing.get_args(A.Action)  # every action type of actions.py
TERMINAL = ("turn.done", "turn.cancelled")

# -- strategies ---------------------------------------------------------------------------


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, each as often as its weight says."""
    return st.one_of(*(strategy for weight, strategy in choices for _ in range(weight)))


TURN_IDS = weighted(
    (5, st.none()),  # the server numbers the turn
    # t<n> are the ids the server gives: a client may take them first
    (3, st.sampled_from(["a", "b", "t1", "t2", "t3", "t4", "t3.2"])),
    (1, st.text(max_size=4)),
    (1, st.sampled_from(["", "x" * 129])),  # empty, over the id length limit
)
VOICES = weighted((6, st.none()), (1, st.sampled_from(["agent", "narrator", "nobody", ""])))
TEXTS = weighted(
    (6, st.sampled_from(["Hello there.", "Hi", "More text, ", "é你😀"])),
    (2, st.text(max_size=30)),
    (1, st.sampled_from([" ", ""])),
    (1, st.integers(100, 130).map(lambda n: "x" * n)),  # around max_text_chars
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**400), 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)

_GOOD: dict[str, st.SearchStrategy[Any]] = {}
for s in SETTINGS:
    if s.key == "voice":
        good: st.SearchStrategy[Any] = st.sampled_from(CATALOG.voices)
    elif s.choices:
        good = st.sampled_from(s.choices)
    elif s.kind is bool:
        good = st.booleans()
    elif s.kind is int and s.lo is not None and s.hi is not None:
        good = st.integers(int(s.lo), int(s.hi))
    elif s.kind is float and s.lo is not None and s.hi is not None:
        good = st.floats(s.lo, s.hi)
    else:
        good = st.text(max_size=8)
    _GOOD[s.key] = good


@st.composite
def setting_changes(draw: st.DrawFn, valid: bool = False) -> dict[str, Any]:
    """Settings as a client nests them: valid values (with `valid`: only those), some of
    any JSON shape, and now and then an unknown key."""
    keys = draw(st.lists(st.sampled_from([s.key for s in SETTINGS]), max_size=4, unique=True))
    changes: dict[str, Any] = {}
    for key in keys:
        value = draw(_GOOD[key] if valid or draw(st.integers(0, 4)) else JSON_VALUES)
        group, _, name = key.partition(".")
        if name:
            changes.setdefault(group, {})[name] = value
        else:
            changes[key] = value
    if not valid and draw(st.integers(0, 9)) == 0:
        changes[draw(st.sampled_from(["volume", "format", "sampling"]))] = draw(JSON_VALUES)
    return changes


def compact(message: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in message.items() if v is not None})


# -- the machine --------------------------------------------------------------------------


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = SessionCore("prop", CATALOG, LIMITS)
        self.started = False
        self.nums: list[int] = []  # turns opened, in order
        self.ids: set[str] = set()
        self.open: set[int] = set()  # taking text
        self.live: set[int] = set()  # opened, not yet cancelled or ended
        self.stopping: set[int] = set()  # cancelled after audio: turn.cancelled pending
        self.cancelled: set[int] = set()  # CancelTurn seen
        self.ended: set[int] = set()  # its final event was sent
        self.frames: dict[int, int] = {}  # SendAudio per turn
        self.num_of: dict[str, int] = {}

    # -- applying the core's answers to the model ------------------------------------------

    def step(self, actions: list[Any], *, message: bool = False) -> list[Any]:
        assert isinstance(actions, list)
        errors = []
        for action in actions:
            assert isinstance(action, ACTION_TYPES), action
            if isinstance(action, A.SendEvent):
                event = action.event
                json.dumps(event)  # sendable as it is
                if event["type"] == "error":
                    assert event["code"] in CODES, event
                    assert isinstance(event["message"], str) and event["message"]
                    errors.append(event)
                self.event(event)
            else:
                self.act(action)
        if message and errors:
            assert len(actions) == 1, f"a refused message did more than say so: {actions}"
            assert "turn_id" not in errors[0], errors
        return actions

    def turn_num(self, event: dict[str, Any]) -> int | None:
        num = event.get("turn")
        if num is None and "turn_id" in event:
            num = self.num_of.get(event["turn_id"])
        return num

    def event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        num = self.turn_num(event)
        if num is None:
            assert kind not in (
                *TERMINAL,
                "turn.started",
                "turn.first_audio",
                "audio.levels",
                "turn.words",
            )
            return
        assert num in self.nums, event
        assert num not in self.ended, f"{kind} for turn {num}, which had already ended"
        if kind == "turn.started":
            assert event["turn"] == self.nums[-1] and event["turn_id"] in self.ids
        elif kind in ("turn.first_audio", "audio.levels"):
            assert num not in self.cancelled, f"{kind} for cancelled turn {num}"
        elif kind == "audio.clear":
            assert num in self.stopping
        elif kind in TERMINAL or kind == "error":
            if kind == "turn.cancelled":
                assert num in self.cancelled
                assert event["sent_ms"] == self.frames.get(num, 0) * FRAME_MS
                assert 0 <= event["played_ms"] <= event["sent_ms"]
            else:
                assert num not in self.cancelled, f"{kind} for cancelled turn {num}"
                if kind == "turn.done":
                    assert event["sent_ms"] == self.frames.get(num, 0) * FRAME_MS
            self.ended.add(num)
            self.stopping.discard(num)
            self.open.discard(num)
            self.live.discard(num)

    def act(self, action: Any) -> None:
        if isinstance(action, A.OpenTurn):
            assert not self.nums or action.num > self.nums[-1], "turn numbers must increase"
            assert action.turn_id not in self.ids, f"turn id {action.turn_id!r} reused"
            self.nums.append(action.num)
            self.ids.add(action.turn_id)
            self.num_of[action.turn_id] = action.num
            self.open.add(action.num)
            self.live.add(action.num)
            return
        if isinstance(action, A.MicAudio | A.SetGain):
            return
        num = action.num
        assert num in self.nums, action
        assert num not in self.ended, f"{action} for a turn that had ended"
        if isinstance(action, A.AppendText | A.FlushText):
            assert num in self.open, f"{action} for a turn that is not open"
        elif isinstance(action, A.EndText):
            assert num in self.open
            self.open.discard(num)
        elif isinstance(action, A.SendAudio):
            assert num in self.live and num not in self.cancelled, action
            seq = self.frames.get(num, 0)
            assert (action.seq, action.pts_ms) == (seq, seq * FRAME_MS), action
            self.frames[num] = seq + 1
        elif isinstance(action, A.CancelTurn):
            assert num in self.live and num not in self.cancelled, action
            assert action.sent_audio == (self.frames.get(num, 0) > 0)
            self.cancelled.add(num)
            self.open.discard(num)
            self.live.discard(num)
            if action.sent_audio:
                self.stopping.add(num)
        elif isinstance(action, A.ListenerPlayed):
            assert num in self.live, action

    # -- the client's messages -------------------------------------------------------------

    def send(self, text: str) -> list[Any]:
        actions = self.step(self.core.receive_text(text), message=True)
        if not self.started:
            kinds = [a.event["type"] for a in actions if isinstance(a, A.SendEvent)]
            self.started = "session.created" in kinds
            assert self.started or not self.core.started
            if not self.started:
                assert not [a for a in actions if not isinstance(a, A.SendEvent)]
        return actions

    @initialize(
        start=st.integers(0, 9),
        changes=setting_changes(valid=True),
        reports=st.booleans(),
        barge_in=st.sampled_from(["off", "cancel", "duck"]),
    )
    def begin(self, start: int, changes: dict[str, Any], reports: bool, barge_in: str) -> None:
        """Most sessions start (with valid settings, often playback reports and barge-in);
        some stay before session.start for a while."""
        if start:
            changes.setdefault("playback", {}).setdefault("reports", reports)
            changes.setdefault("barge_in", {}).setdefault("mode", barge_in)
            self.send(json.dumps({"type": "session.start", **changes}))
        if start and not self.started:  # valid values that do not go together
            plain = {"playback": {"reports": reports}, "barge_in": {"mode": barge_in}}
            self.send(json.dumps({"type": "session.start", **plain}))

    @rule(kind=st.sampled_from(["session.start", "session.update"]), changes=setting_changes())
    def session_start_or_update(self, kind: str, changes: dict[str, Any]) -> None:
        [reply] = self.send(json.dumps({"type": kind, **changes}))
        assert isinstance(reply, A.SendEvent)
        if reply.event["type"] != "error":
            assert reply.event["type"] == (
                "session.created" if kind == "session.start" else "session.updated"
            )

    @rule(text=TEXTS, turn_id=TURN_IDS, voice=VOICES)
    def speak(self, text: str, turn_id: str | None, voice: str | None) -> None:
        self.send(compact({"type": "speak", "text": text, "turn_id": turn_id, "voice": voice}))

    @rule(text=TEXTS, turn_id=TURN_IDS, voice=VOICES)
    def text_delta(self, text: str, turn_id: str | None, voice: str | None) -> None:
        message = {"type": "text.delta", "text": text, "turn_id": turn_id, "voice": voice}
        self.send(compact(message))

    def used_id(self, data: st.DataObject, none: int) -> str | None:
        """A turn id this session has used (live or not), none (`none` in 10 times), or
        any other."""
        if data.draw(st.integers(0, 9)) < none:
            return None
        if self.ids and data.draw(st.integers(0, 3)):
            return data.draw(st.sampled_from(sorted(self.ids)))
        return data.draw(TURN_IDS)

    @rule(kind=st.sampled_from(["text.flush", "text.end"]), data=st.data())
    def text_flush_or_end(self, kind: str, data: st.DataObject) -> None:
        self.send(compact({"type": kind, "turn_id": self.used_id(data, none=5)}))

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.send(compact({"type": "cancel", "turn_id": self.used_id(data, none=2)}))

    @rule(data=st.data(), played=st.integers(-5, 5000), stopped=st.booleans())
    def playback_report(self, data: st.DataObject, played: int, stopped: bool) -> None:
        turn_id = self.used_id(data, none=1)
        message = {"type": "playback", "turn_id": turn_id, "played_ms": played, "stopped": stopped}
        self.send(compact(message))

    @rule(
        kind=st.sampled_from(["ping", "json", "text", "oversize", "binary"]),
        value=st.one_of(
            JSON_VALUES,
            st.fixed_dictionaries(
                {"type": st.sampled_from(["speak", "cancel", "text.end", "playback", "x"])},
                optional={k: JSON_VALUES for k in ("text", "turn_id", "voice", "played_ms")},
            ),
        ),
        text=st.text(max_size=40),
        size=st.integers(2040, 5000),
        data=st.binary(max_size=300),
    )
    def junk(self, kind: str, value: Any, text: str, size: int, data: bytes) -> None:
        """Anything else a client may send: ping, random JSON, random text, a message over
        the size limit, a binary message."""
        if kind == "ping":
            assert self.send('{"type": "ping"}') == [A.SendEvent({"type": "pong"})]
        elif kind == "json":
            self.send(json.dumps(value))
        elif kind == "text":
            self.send(text)
        elif kind == "oversize":
            self.send(json.dumps({"type": "speak", "text": "y" * size}))
        else:
            actions = self.step(self.core.receive_bytes(data), message=True)
            if not any(isinstance(a, A.SendEvent) for a in actions):
                rate = self.core.settings.input.sample_rate  # type: ignore[union-attr]
                assert actions == [A.MicAudio(data, rate)]

    # -- the runner's calls ----------------------------------------------------------------

    def some_turn(self, data: st.DataObject) -> int:
        """A turn the runner knows (most of the time), or a stale or unknown number."""
        known = sorted(self.live | self.stopping)
        if known and data.draw(st.integers(0, 4)):
            return data.draw(st.sampled_from(known))
        return data.draw(st.integers(-1, 12))

    @precondition(lambda self: self.started)
    @rule(data=st.data(), frames=st.integers(1, 20), level=st.floats(0, 1))
    def audio(self, data: st.DataObject, frames: int, level: float) -> None:
        num = self.some_turn(data)
        for _ in range(frames):
            expected = num in self.live
            actions = self.step(self.core.audio(num, "opus", b"\x00", level))
            assert any(isinstance(a, A.SendAudio) for a in actions) == expected

    @precondition(lambda self: self.started)
    @rule(data=st.data(), failed=st.integers(0, 4), code=st.sampled_from(list(ErrorCode)))
    def turn_ends(self, data: st.DataObject, failed: int, code: ErrorCode) -> None:
        """The pipeline is done with a turn (one in five times: it failed)."""
        num = self.some_turn(data)
        live = num in self.live
        if failed:
            actions = self.step(self.core.turn_done(num, {"tokens": 1}))
            kinds = [a.event["type"] for a in actions if isinstance(a, A.SendEvent)]
            assert kinds[-1:] == (["turn.done"] if live else [])
        else:
            actions = self.step(self.core.turn_failed(num, code, "it broke"))
            assert len(actions) == int(live)

    @precondition(lambda self: self.started)
    @rule(
        data=st.data(),
        played=st.integers(-100, 10_000),
        how=st.sampled_from(["listener", "report", "server", "playback", "stopped playback"]),
    )
    def listener(self, data: st.DataObject, played: int, how: str) -> None:
        """What the transport learns of the listener: the answer for a cancelled turn
        (`stopped`), or a playback report (`playback`)."""
        num = self.some_turn(data)
        if how.endswith("playback"):
            self.step(self.core.playback(num, max(0, played), how.startswith("stopped")))
        else:
            waiting = num in self.stopping
            actions = self.step(self.core.stopped(num, played, how))
            assert len(actions) == int(waiting)

    @rule(
        kind=st.sampled_from(["speech_started", "speech_stopped"]),
        t_ms=st.integers(0, 100_000),
        played=st.one_of(st.none(), st.integers(0, 5000)),
    )
    def speech(self, kind: str, t_ms: int, played: int | None) -> None:
        actions = self.step(self.core.speech(kind, t_ms, played))
        assert actions[0] == A.SendEvent({"type": kind, "t_ms": t_ms})

    # -- what holds between steps ---------------------------------------------------------

    @invariant()
    def at_most_one_open_turn(self) -> None:
        assert len(self.open) <= 1, self.open

    @invariant()
    def live_turns_within_the_limit(self) -> None:
        assert len(self.live) <= LIMITS.max_turns, self.live

    @invariant()
    def every_cancel_is_answered_or_waiting(self) -> None:
        assert self.cancelled <= self.ended | self.stopping
        assert self.stopping <= self.cancelled and not self.stopping & self.ended


SessionMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    derandomize=True,
    database=None,  # nothing to replay: the same examples every run
    deadline=None,
    report_multiple_bugs=False,  # shrink the first failure only: a broken core reports fast
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestSessionMachine = SessionMachine.TestCase
