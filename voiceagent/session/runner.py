"""Runs one session: executes the protocol core's actions with real turns, a paced
sender and one listener (voice activity), talking to the listener only through a
transport port (port.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..audio.codecs import Encoder, make_encoder
from ..audio.format import FRAME_MS
from ..audio.levels import loudness
from ..audio.vad import VoiceActivity
from ..engine.embedded import EmbeddedEngine
from ..model.sampling import SamplingParams
from ..ops.logs import bind
from ..ops.metrics import turn_outcome
from ..pipeline.turn import FrameFormat, Turn, TurnFailed, TurnSettings
from ..protocol.errors import ErrorCode
from ..protocol.messages import Input, Settings
from ..protocol.session import (
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
    SessionCore,
    SetGain,
)
from .admission import Admission
from .playout import Heard, PlayoutConfig, TurnPlayout
from .port import Transport

log = logging.getLogger(__name__)


class Listener:
    """The person at the other end: inbound audio (any transport, any rate) -> voice
    activity -> speech events. The detector follows the session's `input` settings; a
    new one (after a change) goes on with the old one's timeline."""

    def __init__(self) -> None:
        self._vad: VoiceActivity | None = None
        self._key: tuple[int, ...] = ()
        self._past_guard: tuple[int, int] | None = None  # (turn, voiced ms) at its guard
        self._base_ms = 0  # audio the detectors before this one classified
        self._base_voiced_ms = 0  # ... and found voiced

    def feed(self, pcm: np.ndarray, sample_rate: int, i: Input) -> Sequence[tuple[str, int]]:
        key = (sample_rate, i.vad_aggressiveness, i.min_speech_ms, i.hangover_ms)
        events: list[tuple[str, int]] = []
        if self._vad is None or self._key != key:
            if self._vad is not None:  # its open speech segment ends where it stops
                events += self._on_timeline(self._vad.flush())
                self._base_ms += self._vad.time_ms
                self._base_voiced_ms += self._vad.voiced_ms
            self._key = key
            self._vad = VoiceActivity(
                sample_rate,
                i.vad_aggressiveness,
                min_speech_ms=i.min_speech_ms,
                hangover_ms=i.hangover_ms,
            )
        return events + self._on_timeline(self._vad.feed(pcm))

    def _on_timeline(self, events: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        return [(kind, self._base_ms + t_ms) for kind, t_ms in events]

    @property
    def time_ms(self) -> int:
        return self._base_ms + (0 if self._vad is None else self._vad.time_ms)

    @property
    def voiced_ms(self) -> int:
        return self._base_voiced_ms + (0 if self._vad is None else self._vad.voiced_ms)

    def voiced_past_guard(self, turn: int, heard_ms: int, guard_ms: int) -> int:
        """Voiced audio heard since turn `turn` played past its guard (0 before that)."""
        if heard_ms < guard_ms or self._vad is None:
            return 0
        if self._past_guard is None or self._past_guard[0] != turn:
            self._past_guard = (turn, self.voiced_ms)
        return self.voiced_ms - self._past_guard[1]


class SessionRunner:
    def __init__(
        self,
        core: SessionCore,
        engine: EmbeddedEngine,
        transport: Transport,
        playout: PlayoutConfig | None = None,
        admission: Admission | None = None,
    ) -> None:
        """`admission`: the server's limits on live turns, and its drain (None: no
        limit, as in tools that run one session)."""
        self.core = core
        self.engine = engine
        self.transport = transport
        self.playout = playout or PlayoutConfig()
        self.admission = admission
        self.metrics = engine.metrics
        self.listener = Listener()
        self._turns: dict[int, Turn] = {}
        self._encoders: dict[int, Encoder] = {}  # each turn's, made when it opens
        self._order: asyncio.Queue[int] = asyncio.Queue()
        self._playing: tuple[int, asyncio.Task[None]] | None = None
        self._playouts: dict[int, TurnPlayout] = {}  # turns that have sent audio
        self._admitted: set[int] = set()  # turns holding one of the server's live slots
        # for listeners' reports after a cancel: each turn's number and what the server
        # knows it heard, the answer if none comes
        self._waits: dict[asyncio.Task[None], tuple[int, Heard]] = {}
        # cancelled turns whose turn.cancelled waits for the listener's report: the next
        # turn's frames wait for it (a turn's frames follow the last one's final event)
        self._unsettled: dict[int, asyncio.Event] = {}
        self.gain = 1.0  # applied to each frame as it is encoded (ducking)
        self._idle_at = asyncio.get_running_loop().time()  # when the last turn ended
        # when the listener will have played all it was sent (monotonic): the next turn's
        # play clock starts after it, so back-to-back turns do not pile up audio there
        self._listener_until = 0.0
        bind(session_id=core.session_id)  # on every log line of this session's tasks
        self._player = asyncio.get_running_loop().create_task(self._play_turns())
        if admission is not None:
            admission.runners.add(self)

    # -- from the transport ---------------------------------------------------------------

    async def on_text(self, data: str) -> None:
        await self.execute(self.core.receive_text(data))

    async def on_bytes(self, data: bytes) -> None:
        await self.execute(self.core.receive_bytes(data))

    async def hear(self, pcm: np.ndarray, sample_rate: int) -> None:
        """Inbound audio from the listener's microphone: speech events and barge-in."""
        i = self.core.settings.input if self.core.settings else Input()
        actions: list[Action] = []
        playing = self.playing_turn
        for kind, t_ms in self.listener.feed(pcm, sample_rate, i):
            heard = None if playing is None else self.heard(playing).ms
            actions += self._count_barge_in(self.core.speech(kind, t_ms, heard))
        if self.core.onset_held and playing is not None and self.core.settings:
            # the guard held the onset back: speech that goes on past it is not an echo
            guard = self.core.settings.barge_in.guard_ms
            voiced = self.listener.voiced_past_guard(playing, self.heard(playing).ms, guard)
            if voiced >= i.min_speech_ms:
                actions += self._count_barge_in(self.core.talked_over(self.listener.time_ms))
        await self.execute(actions)

    def _count_barge_in(self, reaction: list[Action]) -> list[Action]:
        if any(
            isinstance(a, CancelTurn) or (isinstance(a, SetGain) and a.gain < 1) for a in reaction
        ):
            self.metrics.barge_ins.labels(self.transport.name).inc()
        return reaction

    async def listener_played(self, num: int, played_ms: int, stopped: bool = False) -> None:
        """A transport that learns playout on its own (telephony marks) reports it here."""
        await self.execute(self.core.playback(num, played_ms, stopped))

    @property
    def idle(self) -> bool:
        """No turn is open, synthesizing or playing: closing now cuts nothing."""
        return not self._turns and self._playing is None

    @property
    def idle_since(self) -> float | None:
        """Since when (the event loop's clock) the session has had nothing to do: its
        last turn ended, or the turn playing has said all its text so far and waits for
        more (the turns behind it wait for it). None while it has work."""
        if self.idle:
            return self._idle_at
        playing = None if self._playing is None else self._turns.get(self._playing[0])
        return None if playing is None else playing.waiting_since

    def _note_if_idle(self) -> None:
        if self.idle:
            self._idle_at = asyncio.get_running_loop().time()

    async def close(self) -> None:
        self._player.cancel()
        # Cancelling the player does not cancel the turn it awaits (asyncio.wait never
        # does): left alone, that task would wait for frames forever, holding its turn and
        # this runner until the garbage collector destroyed it, still pending.
        playing = None if self._playing is None else self._playing[1]
        if playing is not None:
            playing.cancel()
        for task, (num, heard) in list(self._waits.items()):
            task.cancel()
            # the client is gone before its report: the turn still ends (counted, logged)
            for action in self.core.stopped(num, heard.ms, heard.source):
                if isinstance(action, SendEvent):
                    self._observe(action.event)
        for num, turn in self._turns.items():
            turn.close()
            sent_ms = self.core.sent_ms(num)  # what went out (not all of it may be heard)
            self.metrics.turns.labels(self.transport.name, "closed").inc()
            self.metrics.audio_seconds.labels(self.transport.name).inc(sent_ms / 1000)
            self._log_end(turn.id, "closed", {"sent_ms": sent_ms})
        self._turns.clear()
        for num in list(self._admitted):
            self._release_turn(num)
        if self.admission is not None:
            self.admission.runners.discard(self)
        with contextlib.suppress(asyncio.CancelledError):
            await self._player
        if playing is not None:
            await asyncio.wait({playing})

    # -- actions --------------------------------------------------------------------------

    async def execute(self, actions: list[Action]) -> None:
        refused: list[Action] = []  # a turn refused as it opens ends after its turn.started
        for action in actions:
            if isinstance(action, SendEvent):
                self._observe(action.event)
                await self.transport.send_event(action.event)
            elif isinstance(action, SendAudio):
                self._playouts.setdefault(action.num, TurnPlayout()).sent()
                await self.transport.send_audio(action)
            elif isinstance(action, OpenTurn):
                refused += self._open(action)
            elif isinstance(action, AppendText | FlushText | EndText):
                target = self._turns.get(action.num)
                if target is None:  # already finished here (e.g. failed): nothing to feed
                    continue
                if isinstance(action, AppendText):
                    target.push_text(action.text)
                elif isinstance(action, FlushText):
                    target.flush_text()
                else:
                    target.end_text()
            elif isinstance(action, CancelTurn):
                await self._cancel(action)
            elif isinstance(action, ListenerPlayed):
                if (playout := self._playouts.get(action.num)) is not None:
                    playout.report = (action.played_ms, time.monotonic())
            elif isinstance(action, MicAudio):
                await self.hear(np.frombuffer(action.pcm, dtype="<i2"), action.sample_rate)
            elif isinstance(action, SetGain):
                self.gain = action.gain
        if refused:
            await self.execute(refused)

    @property
    def playing_turn(self) -> int | None:
        return None if self._playing is None else self._playing[0]

    def heard(self, num: int) -> Heard:
        """How much of turn `num` the listener has heard, from the best source at hand."""
        playout = self._playouts.get(num)
        if playout is None:
            return Heard(0, "server")
        return playout.heard(self.transport.sent_ms(num))

    def _observe(self, event: dict[str, Any]) -> None:
        """Metrics and the one log line per turn, from what the client is told."""
        self.metrics.observe_event(self.transport.name, event)
        outcome = turn_outcome(event)
        if outcome is not None:
            self._log_end(event["turn_id"], outcome, event)
            if (settled := self._unsettled.pop(event.get("turn", -1), None)) is not None:
                settled.set()

    def _log_end(self, turn_id: str, outcome: str, event: dict[str, Any]) -> None:
        timings = event.get("timings") or {}
        fields = {
            "turn_id": turn_id,
            "outcome": outcome,
            "transport": self.transport.name,
            "code": event.get("code"),
            "ttfa_ms": timings.get("ttfa_ms"),
            "audio_s": event["sent_ms"] / 1000 if "sent_ms" in event else None,
            "played_s": event["played_ms"] / 1000 if "played_ms" in event else None,
            "rtf": timings.get("rtf"),
        }
        log.info("turn.end", extra={k: v for k, v in fields.items() if v is not None})

    def _open(self, action: OpenTurn) -> list[Action]:
        """Start the turn; what to do instead where the server refuses it."""
        if self.admission is not None:
            refusal = self.admission.admit_turn(self.core.catalog.tenant)
            if refusal is not None:
                return self.core.turn_failed(action.num, refusal.code, refusal.message)
            self._admitted.add(action.num)
        fmt = action.settings.format
        encoder = self._encoders[action.num] = make_encoder(fmt.codec, fmt.sample_rate, fmt.bitrate)
        turn = Turn(
            action.turn_id,
            self._turn_settings(action.settings, encoder),
            self.engine,
            schedule=self.playout.schedule,
            streaming=self.playout.streaming,
            max_segment_tokens=self.playout.max_segment_tokens,
            max_output_frames=self.playout.max_ahead_ms // FRAME_MS,
            on_spoken=lambda segment: self.execute(self.core.spoken(action.num, segment)),
        )
        turn.start()
        self._turns[action.num] = turn
        self._order.put_nowait(action.num)
        return []

    async def _cancel(self, action: CancelTurn) -> None:
        """Stop the turn at once and drop what the transport still queues; then tell the
        core what the listener heard, at once or after waiting for its own report."""
        heard = self.heard(action.num)  # before the transport drops anything
        self._drop(action.num)
        await self.transport.drop_turn(action.num)
        if not action.sent_audio:
            return
        if action.wait_listener_ms <= 0:
            await self.execute(self.core.stopped(action.num, heard.ms, heard.source))
            return

        async def fall_back() -> None:
            await asyncio.sleep(action.wait_listener_ms / 1000)
            with contextlib.suppress(ConnectionError):
                await self.execute(self.core.stopped(action.num, heard.ms, heard.source))

        self._unsettled[action.num] = settled = asyncio.Event()
        task = asyncio.get_running_loop().create_task(fall_back())
        self._waits[task] = (action.num, heard)

        def done(task: asyncio.Task[None]) -> None:
            self._waits.pop(task, None)
            self._unsettled.pop(action.num, None)
            settled.set()  # (its final event has gone, or never will)

        task.add_done_callback(done)

    def _turn_settings(self, s: Settings, encoder: Encoder) -> TurnSettings:
        sp = s.sampling
        return TurnSettings(
            voice=self.engine.model.voices[self.core.catalog.voice_key(s.voice)],
            sampling=SamplingParams(sp.temperature, sp.top_k, sp.top_p, sp.seed),
            speed=s.speed,
            frames=FrameFormat(encoder.sample_rate, encoder.tail_samples),
            language=s.language,
            hold_back=self.playout.hold_back,
            grid=s.chunking == "reference",
        )

    def _drop(self, num: int) -> None:
        """Stop a turn at once: no further frame of it is sent; its state is discarded."""
        turn = self._turns.pop(num, None)
        if turn is not None:
            turn.close()
        if self.playing_turn != num:
            self._encoders.pop(num, None)
            self._release_turn(num)
        if self._playing is not None and self._playing[0] == num:
            self._playing[1].cancel()
            self._listener_until = time.monotonic()  # the transport drops what it holds
        self._note_if_idle()

    async def _play_turns(self) -> None:
        while True:
            num = await self._order.get()
            for settled in list(self._unsettled.values()):  # (at most wait_listener_ms)
                await settled.wait()
            turn = self._turns.get(num)
            if turn is None:  # cancelled while queued
                continue
            task = asyncio.get_running_loop().create_task(
                self._play(num, turn, self._encoders[num])
            )
            self._playing = (num, task)
            await asyncio.wait({task})  # returns when done or cancelled, without raising
            self._playing = None
            self._playouts.pop(num, None)
            self._encoders.pop(num, None)
            self._turns.pop(num, None)
            turn.close()
            self._release_turn(num)
            self._note_if_idle()

    def _ended(self, num: int, turn: Turn) -> None:
        """The turn's end is about to be reported: it is no longer open, so a session
        closed by the client as soon as it hears the end does not count it again
        (`close` logs and counts the turns still open as closed)."""
        self._turns.pop(num, None)
        turn.close()

    def _release_turn(self, num: int) -> None:
        if num in self._admitted and self.admission is not None:
            self._admitted.discard(num)
            self.admission.turn_ended()

    async def _play(self, num: int, turn: Turn, encoder: Encoder) -> None:
        """Send the turn's frames on an absolute clock, `lead_ms` ahead of real time. The
        sender owns the turn's encoder and encodes each frame only now, so a gain change
        (ducking) applies from the next frame."""
        lead, frame_s = self.playout.lead_ms / 1000, FRAME_MS / 1000
        start: float | None = None  # when the first frame left (TTFA)
        taken_from = time.monotonic()  # the turn before it is done: this one could play
        clock = 0.0  # when the listener plays frame 0
        seq = 0
        late = False  # the previous frame left after its play time: one underrun per stall
        try:
            while True:
                item = await turn.output.get()
                if item is None:
                    await self.transport.end_turn(num)
                    self._ended(num, turn)
                    await self.execute(self.core.turn_done(num, self._timings(turn, start)))
                    return
                if isinstance(item, TurnFailed):
                    code = ErrorCode(item.code)
                    self._ended(num, turn)
                    await self.execute(self.core.turn_failed(num, code, str(item)))
                    return
                if not isinstance(item, np.ndarray):
                    continue  # (segment timing goes out through on_spoken, ahead of audio)
                now = time.monotonic()
                if start is None:
                    start = now
                    ready = turn.stats.could_be_heard(taken_from)
                    self.metrics.ttfa.labels(self.transport.name).observe(now - ready)
                    clock = max(now, self._listener_until)
                # Pace on an absolute clock: frame k is due at clock + k*20ms - lead, and
                # the listener plays it at clock + k*20ms. Later than that, it ran dry: its
                # clock starts again at this frame, so the frames late with it do not go
                # out at once on top of what is due next (a backlog at the listener).
                plays_at = clock + seq * frame_s
                if now > plays_at:
                    if not late:
                        self.metrics.underruns.labels(self.transport.name).inc()
                    clock, plays_at = now - seq * frame_s, now
                    late = True
                else:
                    late = False
                self._playouts.setdefault(num, TurnPlayout()).clock = clock
                delay = plays_at - lead - now
                if delay > 0:
                    await asyncio.sleep(delay)
                data = encoder.encode(item, self.gain)
                level = loudness(item if self.gain == 1.0 else item * self.gain)
                await self.execute(self.core.audio(num, encoder.codec, data, level))
                self._listener_until = plays_at + frame_s
                seq += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a send failed (peer gone) or a bug: end this turn only
            log.warning("playing turn %s failed: %s", turn.id, exc)
            with contextlib.suppress(Exception):
                await self.execute(self.core.turn_failed(num, ErrorCode.INTERNAL_ERROR, str(exc)))

    @staticmethod
    def _timings(turn: Turn, first_sent: float | None) -> dict[str, Any]:
        st = turn.stats
        ttfa = None if first_sent is None else (first_sent - st.created) * 1000
        return {
            "ttfa_ms": None if ttfa is None else round(ttfa, 1),
            "audio_ms": round(st.audio_ms, 1),
            "rtf": None if st.rtf is None else round(st.rtf, 4),
            "tokens": st.tokens,
            "prompt_tokens": st.prompt_tokens,
            "cached_tokens": st.cached_tokens,
            "chunks": st.chunks,
        }
