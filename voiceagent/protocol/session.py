"""The session protocol as a state machine without I/O.

Messages from the client go in (`receive_text`, `receive_bytes`), notifications from the
pipeline and the transport go in (`audio`, `turn_done`, `turn_failed`, `speech`,
`stopped`, `playback`), and actions come out: events and frames to send, turns to open,
feed, end or cancel. The session runner executes the actions through a transport port.

The actions are in actions.py. Turn states: open (taking text) -> closed (text ended,
still synthesizing or playing) -> finished (done, failed) or stopping (cancelled; waiting
to learn how much the listener heard) -> cancelled. Turns play one after another.

Over 500 lines: one state machine, whose transitions read best side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..audio.format import FRAME_MS
from ..text.timing import SpokenSegment
from .actions import (
    Action,
    AppendText,
    CancelTurn,
    EndText,
    FlushText,
    ListenerPlayed,
    MicAudio,
    OpenTurn,
    SendAudio,
    SendEvent,
    SetGain,
)
from .errors import ErrorCode, ProtocolError
from .messages import (
    Cancel,
    Format,
    Ping,
    PlaybackReport,
    Sampling,
    Settings,
    StartSession,
    TextDelta,
    UpdateSession,
    apply_settings,
    check_voice,
    flatten_settings,
    parse,
    setting_value,
)
from .recent_ids import RecentIds
from .roles import Role


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 64 * 1024
    max_text_chars: int = 20_000  # per turn
    max_turns: int = 8  # live turns per session (open, synthesizing or queued)
    max_audio_bytes: int = 64 * 1024  # one binary microphone message


@dataclass
class Catalog:
    """What the server offers a session (voices, model facts). The server may add voices
    while sessions run; sessions always see the current list."""

    voices: tuple[str, ...]
    model: dict[str, Any]
    default_voice: str
    tenant: str = "default"  # whose sessions these are (their quotas, their voices)
    # The model's name for a voice, where it differs (a tenant's "anna" is "acme/anna")
    keys: dict[str, str] = field(default_factory=dict)
    roles: dict[str, Role] = field(default_factory=dict)  # those whose voice is offered
    # A session's sampling until it sets its own: the model's top-k and top-p
    sampling: Sampling = field(default_factory=Sampling)

    def voice_key(self, name: str) -> str:
        """The model's name for a voice or role."""
        role = self.roles.get(name)
        if role is not None:
            name = role.voice
        return self.keys.get(name, name)

    @property
    def names(self) -> set[str]:
        """What a session may choose as its `voice`: voices and roles."""
        return {*self.voices, *self.roles}

    def with_role(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Settings changes with a role's defaults under them, when they name a role."""
        voice = changes.get("voice")
        role = self.roles.get(voice) if isinstance(voice, str) else None
        return changes if role is None else role.settings(changes)


class TextBudget(Protocol):
    """A tenant's characters per minute (session/quota.py)."""

    def take_chars(self, n: int) -> str | None:
        """Spend `n` characters, or refuse them all with a reason."""


# Loudness of this many frames goes out in one `audio.levels` event (100 ms at 20 ms).
LEVELS_PER_EVENT = 5


@dataclass
class _Turn:
    num: int
    turn_id: str
    voice: str
    open: bool = True
    chars: int = 0
    frames: int = 0
    cancel_reason: str = "cancel"  # why it is stopping: cancel | barge_in
    levels: list[float] = field(default_factory=list)  # not yet sent in audio.levels
    framing: tuple[str, str] = ("header", "")  # its format's framing and stream_sid


def error_event(code: ErrorCode, message: str, turn_id: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "error", "code": str(code), "message": message}
    if turn_id is not None:
        event["turn_id"] = turn_id
    return event


@dataclass
class SessionCore:
    session_id: str
    catalog: Catalog
    limits: Limits = field(default_factory=Limits)
    # The transport carries only this format (WebRTC's track): a client's `format` is
    # replaced by it.
    pinned_format: Format | None = None
    budget: TextBudget | None = None  # the tenant's quota of characters (None: no quota)
    settings: Settings | None = None  # None until session.start
    _turns: dict[int, _Turn] = field(default_factory=dict)  # live turns by number
    _stopping: dict[int, _Turn] = field(default_factory=dict)  # cancelled, heard unknown
    _ids: RecentIds = field(default_factory=RecentIds)  # the last 1,000: a repeat is refused
    _next_num: int = 1
    _open: int | None = None
    _ducked: bool = False
    onset_held: bool = False  # the listener speaks, and the guard kept that from a barge-in
    _asked: set[str] = field(default_factory=set)  # flat settings the client set itself
    _voice_key: str = ""  # the model's voice for `settings.voice` when it was chosen

    @property
    def started(self) -> bool:
        return self.settings is not None

    # -- input from the client ------------------------------------------------------------

    def receive_text(self, data: str) -> list[Action]:
        try:
            if len(data) > self.limits.max_message_bytes or (
                len(data.encode("utf-8", "surrogatepass")) > self.limits.max_message_bytes
            ):
                raise ProtocolError(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"message larger than {self.limits.max_message_bytes} bytes",
                )
            cmd = parse(data)
            if isinstance(cmd, Ping):
                return [SendEvent({"type": "pong"})]
            if isinstance(cmd, StartSession):
                return self._start(cmd.changes)
            if not self.started:
                raise ProtocolError(
                    ErrorCode.SESSION_NOT_STARTED, "send session.start before anything else"
                )
            if isinstance(cmd, UpdateSession):
                return self._update(cmd.changes)
            if isinstance(cmd, TextDelta):
                return self._text(cmd)
            if isinstance(cmd, PlaybackReport):
                return self._report(cmd)
            assert isinstance(cmd, Cancel)
            return self._cancel(cmd.turn_id)
        except ProtocolError as err:
            return [SendEvent(error_event(err.code, err.message))]

    def sent_ms(self, num: int) -> int:
        """Audio of live turn `num` sent so far (0 for a turn that is not live)."""
        turn = self._turns.get(num)
        return 0 if turn is None else turn.frames * FRAME_MS

    def receive_bytes(self, data: bytes) -> list[Action]:
        """Binary messages are microphone audio (PCM16 mono at `input.sample_rate`)."""
        if self.settings is None:
            code, msg = ErrorCode.SESSION_NOT_STARTED, "send session.start before anything else"
        elif not self.settings.input.sample_rate:
            code = ErrorCode.UNEXPECTED_BINARY
            msg = "binary messages are microphone audio: set input.sample_rate first"
        elif len(data) > self.limits.max_audio_bytes:
            code = ErrorCode.MESSAGE_TOO_LARGE
            msg = f"audio message larger than {self.limits.max_audio_bytes} bytes"
        elif len(data) % 2:
            code, msg = ErrorCode.INVALID_MESSAGE, "PCM16 audio needs an even number of bytes"
        else:
            i = self.settings.input
            return [MicAudio(data, i.sample_rate)]
        return [SendEvent(error_event(code, msg))]

    def speech(self, kind: str, t_ms: int, played_ms: int | None) -> list[Action]:
        """The client's voice started or stopped (`t_ms` on its audio timeline).
        `played_ms`: how much of the playing turn the listener has heard, or None when no
        turn is playing. A speech onset past the guard barges in: `cancel` stops the live
        turns (`turn.cancelled` with reason barge_in), `duck` lowers the output until the
        speech stops. An onset before it (or before any turn played) is held: see
        `talked_over`."""
        actions: list[Action] = [SendEvent({"type": kind, "t_ms": t_ms})]
        bi = self.settings.barge_in if self.settings else None
        if bi is None:
            return actions
        if kind == "speech_stopped":
            self.onset_held = False
            if self._ducked:
                self._ducked = False
                actions += [SetGain(1.0), SendEvent({"type": "audio.unducked", "t_ms": t_ms})]
            return actions
        self.onset_held = played_ms is None or played_ms < bi.guard_ms
        return actions if self.onset_held else actions + self._barge_in(t_ms)

    def talked_over(self, t_ms: int) -> list[Action]:
        """The listener's speech whose onset was held has gone on past the playing turn's
        guard (the runner counts its voiced audio there): that is a person talking over
        the bot, not the echo of its first syllables, so it barges in now."""
        if not self.onset_held:
            return []
        self.onset_held = False
        return self._barge_in(t_ms)

    def _barge_in(self, t_ms: int) -> list[Action]:
        bi = self.settings.barge_in if self.settings else None
        if bi is None or bi.mode == "off":
            return []
        if bi.mode == "cancel":
            return self._cancel(None, reason="barge_in")
        if self._ducked:
            return []
        self._ducked = True
        event = {"type": "audio.ducked", "t_ms": t_ms, "gain": bi.duck_gain}
        return [SetGain(bi.duck_gain), SendEvent(event)]

    def _start(self, changes: dict[str, Any]) -> list[Action]:
        if self.started:
            raise ProtocolError(ErrorCode.SESSION_ALREADY_STARTED, "session already started")
        asked = changes
        changes = self.catalog.with_role(changes)
        self.settings = self._pin(apply_settings(self._base(), changes, self.catalog.names))
        self._asked = set(flatten_settings(asked))
        self._voice_key = self.catalog.voice_key(self.settings.voice)
        return [SendEvent(self.describe())]

    def _base(self) -> Settings:
        return Settings(voice=self.catalog.default_voice, sampling=self.catalog.sampling)

    def describe(self) -> dict[str, Any]:
        """The `session.created` event: the session's settings and what the server offers."""
        assert self.settings is not None
        return {
            "type": "session.created",
            "session_id": self.session_id,
            "settings": self.settings.to_dict(),
            "voices": list(self.catalog.voices),
            "roles": sorted(self.catalog.roles),
            "model": self.catalog.model,
            "limits": {
                "max_message_bytes": self.limits.max_message_bytes,
                "max_text_chars": self.limits.max_text_chars,
                "max_turns": self.limits.max_turns,
            },
        }

    def _update(self, changes: dict[str, Any]) -> list[Action]:
        assert self.settings is not None
        asked = changes
        changes = {**self._role_undone(changes), **self.catalog.with_role(changes)}
        self.settings = self._pin(apply_settings(self.settings, changes, self.catalog.names))
        self._asked |= set(flatten_settings(asked))
        if "voice" in asked:
            self._voice_key = self.catalog.voice_key(self.settings.voice)
        # Turns already opened keep the settings they started with.
        return [SendEvent({"type": "session.updated", "settings": self.settings.to_dict()})]

    def _role_undone(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Leaving a role: its defaults go back to the server's, as flat settings, except
        those the client set itself (the new voice's role, if any, then applies its own)."""
        assert self.settings is not None
        role = self.catalog.roles.get(self.settings.voice)
        if role is None or changes.get("voice", role.name) == role.name:
            return {}
        base = self._base()
        return {
            key: setting_value(base, key)
            for key in flatten_settings(role.defaults)
            if key not in self._asked
        }

    def _pin(self, settings: Settings) -> Settings:
        return (
            settings if self.pinned_format is None else replace(settings, format=self.pinned_format)
        )

    def _text(self, cmd: TextDelta) -> list[Action]:
        # Everything is checked before any state changes: the actions of a half-applied
        # message would be dropped with its error, leaving the runner out of step.
        current = self._turns.get(self._open) if self._open is not None else None
        if cmd.kind in ("flush", "end"):
            if current is None and cmd.turn_id is None:
                raise ProtocolError(ErrorCode.NO_OPEN_TURN, "no turn is taking text")
            if current is None or (cmd.turn_id is not None and cmd.turn_id != current.turn_id):
                assert cmd.turn_id is not None
                raise ProtocolError(ErrorCode.UNKNOWN_TURN, f"no open turn '{cmd.turn_id[:64]}'")
            return self._end(current) if cmd.kind == "end" else [FlushText(current.num)]
        if cmd.kind == "speak" and not cmd.text.strip():
            raise ProtocolError(ErrorCode.INVALID_PARAMETER, "'text' is empty")
        if not cmd.text:
            return []
        new_turn = (
            current is None
            or cmd.kind == "speak"
            or (cmd.turn_id is not None and cmd.turn_id != current.turn_id)
        )
        actions: list[Action] = []
        if new_turn:
            self._check_new_turn(cmd)
            if current is not None:
                actions += self._end(current)  # a new turn ends the open turn's text
            turn = self._open_turn(cmd, actions)
        else:
            assert current is not None
            if cmd.voice is not None and cmd.voice != current.voice:
                raise ProtocolError(
                    ErrorCode.INVALID_PARAMETER, "'voice' can only be chosen when a turn opens"
                )
            if current.chars + len(cmd.text) > self.limits.max_text_chars:
                raise ProtocolError(
                    ErrorCode.TEXT_TOO_LONG,
                    f"turn text would exceed {self.limits.max_text_chars} characters",
                )
            self._spend(len(cmd.text))
            turn = current
        turn.chars += len(cmd.text)
        actions.append(AppendText(turn.num, cmd.text))
        if cmd.kind == "speak":
            actions += self._end(turn)
        return actions

    def _check_new_turn(self, cmd: TextDelta) -> None:
        """Raise the error that opening a turn for `cmd` would meet, before anything changes."""
        if len(self._turns) >= self.limits.max_turns:
            raise ProtocolError(
                ErrorCode.TURN_QUEUE_FULL,
                f"{self.limits.max_turns} turns are already queued; wait or cancel",
            )
        if cmd.turn_id is not None and cmd.turn_id in self._ids:
            raise ProtocolError(
                ErrorCode.DUPLICATE_TURN_ID, f"turn id '{cmd.turn_id[:64]}' was used before"
            )
        assert self.settings is not None
        voice = cmd.voice if cmd.voice is not None else self.settings.voice
        if not self.catalog.voices:
            raise ProtocolError(
                ErrorCode.UNKNOWN_VOICE,
                "the model has no voices yet; add one (voiceagent voice add) and choose it",
            )
        check_voice(voice, self.catalog.names)
        if cmd.voice is None and self._chosen_voice_gone():
            raise ProtocolError(
                ErrorCode.UNKNOWN_VOICE,
                f"the voice {voice[:64]!r} of this session was deleted; choose a voice again",
            )
        if len(cmd.text) > self.limits.max_text_chars:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"turn text would exceed {self.limits.max_text_chars} characters",
            )
        self._spend(len(cmd.text))  # last: nothing is spent on text refused for another reason

    def _chosen_voice_gone(self) -> bool:
        """The tenant's own voice the session chose is deleted, though its name still
        stands for another (the shared voice it shadowed)."""
        key = self._voice_key
        return "/" in key and key not in self.catalog.keys.values()

    def _spend(self, chars: int) -> None:
        refused = self.budget.take_chars(chars) if self.budget is not None else None
        if refused is not None:
            raise ProtocolError(ErrorCode.QUOTA_EXCEEDED, f"{refused}; this text was not spoken")

    def _open_turn(self, cmd: TextDelta, actions: list[Action]) -> _Turn:
        assert self.settings is not None
        turn_id = cmd.turn_id if cmd.turn_id is not None else self._auto_id()
        settings = self.settings
        if cmd.voice is not None:  # this turn's voice (or role: its defaults too)
            changes = self.catalog.with_role({"voice": cmd.voice})
            settings = apply_settings(settings, changes, self.catalog.names)
        fmt = settings.format
        turn = _Turn(self._next_num, turn_id, settings.voice, framing=(fmt.framing, fmt.stream_sid))
        self._next_num += 1
        self._ids.add(turn_id)
        self._turns[turn.num] = turn
        self._open = turn.num
        started = {
            "type": "turn.started",
            "turn_id": turn_id,
            "turn": turn.num,
            "voice": settings.voice,
            "queued": len(self._turns) > 1,
        }
        actions += [OpenTurn(turn.num, turn_id, settings), SendEvent(started)]
        return turn

    def _auto_id(self) -> str:
        """`t<number>`, skipping ids the client has already used for its own turns."""
        turn_id, n = f"t{self._next_num}", 1
        while turn_id in self._ids:
            n += 1
            turn_id = f"t{self._next_num}.{n}"
        return turn_id

    def _end(self, turn: _Turn) -> list[Action]:
        turn.open = False
        if self._open == turn.num:
            self._open = None
        return [EndText(turn.num)]

    def _cancel(self, turn_id: str | None, reason: str = "cancel") -> list[Action]:
        if turn_id is None:
            targets = list(self._turns.values())
        else:
            targets = [t for t in self._turns.values() if t.turn_id == turn_id]
            if not targets and turn_id not in self._ids:
                raise ProtocolError(ErrorCode.UNKNOWN_TURN, f"no turn '{turn_id[:64]}'")
        actions: list[Action] = []
        for turn in targets:
            self._finish(turn)
            turn.cancel_reason = reason
            if turn.frames == 0:  # nothing was sent, so nothing was heard
                actions.append(CancelTurn(turn.num))
                actions.append(SendEvent(self._cancelled(turn, 0, "server")))
                continue
            self._stopping[turn.num] = turn
            assert self.settings is not None
            pb = self.settings.playback
            wait = pb.timeout_ms if pb.reports else 0
            actions.append(CancelTurn(turn.num, sent_audio=True, wait_listener_ms=wait))
            if pb.reports:  # stop playing now and say how much you played
                event = {"type": "audio.clear", "turn_id": turn.turn_id, "turn": turn.num}
                actions.append(SendEvent(event))
        return actions

    def stopped(self, num: int, played_ms: int, source: str) -> list[Action]:
        """How much of cancelled turn `num` the listener heard, as the transport knows it
        (`source`: listener, report or server). The first answer for a turn counts."""
        turn = self._stopping.pop(num, None)
        if turn is None:
            return []
        return [SendEvent(self._cancelled(turn, played_ms, source))]

    def playback(self, num: int, played_ms: int, stopped: bool = False) -> list[Action]:
        """The listener's own report for turn `num` (a `playback` message, or a transport
        that learns it otherwise, such as telephony marks)."""
        if stopped and num in self._stopping:
            return self.stopped(num, played_ms, "listener")
        if num in self._turns:
            return [ListenerPlayed(num, played_ms)]
        return []  # a finished turn: the report raced its end

    def _report(self, cmd: PlaybackReport) -> list[Action]:
        live = [*self._turns.values(), *self._stopping.values()]
        turn = next((t for t in live if t.turn_id == cmd.turn_id), None)
        if turn is None:
            if cmd.turn_id not in self._ids:
                raise ProtocolError(ErrorCode.UNKNOWN_TURN, f"no turn '{cmd.turn_id[:64]}'")
            return []
        return self.playback(turn.num, cmd.played_ms, cmd.stopped)

    def _cancelled(self, turn: _Turn, played_ms: int, source: str) -> dict[str, Any]:
        sent_ms = turn.frames * FRAME_MS
        return {
            "type": "turn.cancelled",
            "turn_id": turn.turn_id,
            "turn": turn.num,
            "reason": turn.cancel_reason,
            "sent_ms": sent_ms,
            "played_ms": max(0, min(played_ms, sent_ms)),
            "played_source": source,
        }

    def _finish(self, turn: _Turn) -> None:
        self._turns.pop(turn.num, None)
        if self._open == turn.num:
            self._open = None

    # -- input from the pipeline ----------------------------------------------------------

    def audio(self, num: int, codec: str, payload: bytes, level: float = 0.0) -> list[Action]:
        """A frame of turn `num` is due to be sent; `level` is its loudness (0..1), which
        goes out in `audio.levels` events for lip sync. Nothing is sent for a finished turn."""
        turn = self._turns.get(num)
        if turn is None:
            return []
        actions: list[Action] = []
        if turn.frames == 0:
            actions.append(
                SendEvent({"type": "turn.first_audio", "turn_id": turn.turn_id, "turn": num})
            )
        pts_ms = turn.frames * FRAME_MS
        actions.append(SendAudio(num, turn.frames, pts_ms, codec, payload, *turn.framing))
        turn.frames += 1
        turn.levels.append(round(level, 3))
        if len(turn.levels) >= LEVELS_PER_EVENT:
            actions += self._levels(turn)
        return actions

    def _levels(self, turn: _Turn) -> list[Action]:
        """The pending loudness values of `turn`, as one event (none if nothing is pending).
        They cover the turn's last frames, so `offset_ms` counts back from the frames sent."""
        if not turn.levels:
            return []
        event = {
            "type": "audio.levels",
            "turn_id": turn.turn_id,
            "turn": turn.num,
            "offset_ms": (turn.frames - len(turn.levels)) * FRAME_MS,
            "frame_ms": FRAME_MS,
            "levels": turn.levels,
        }
        turn.levels = []
        return [SendEvent(event)]

    def spoken(self, num: int, segment: SpokenSegment) -> list[Action]:
        """Where a segment of turn `num` falls in its audio, known once its speech tokens
        are: `turn.words`, ahead of that audio (captions, lip sync, word timestamps)."""
        turn = self._turns.get(num)
        if turn is None:
            return []
        event = {"type": "turn.words", "turn_id": turn.turn_id, "turn": num, **segment.to_json()}
        return [SendEvent(event)]

    def turn_done(self, num: int, timings: dict[str, Any]) -> list[Action]:
        turn = self._turns.get(num)
        if turn is None:
            return []
        actions = self._levels(turn)
        self._finish(turn)
        event = {
            "type": "turn.done",
            "turn_id": turn.turn_id,
            "turn": num,
            "sent_ms": turn.frames * FRAME_MS,
            "timings": timings,
        }
        return [*actions, SendEvent(event)]

    def turn_failed(self, num: int, code: ErrorCode, message: str) -> list[Action]:
        turn = self._turns.get(num)
        if turn is None:
            return []
        self._finish(turn)
        return [SendEvent(error_event(code, message, turn.turn_id))]
