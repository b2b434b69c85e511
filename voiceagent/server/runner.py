"""Runs one session: executes the protocol core's actions with real turns and a paced
sender. Transport-agnostic: it only needs two coroutines that send text and bytes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..audio.levels import loudness
from ..audio.vad import VoiceActivity
from ..engine.embedded import EmbeddedEngine
from ..model.sampling import SamplingParams
from ..pipeline.turn import ChunkSchedule, OutputFormat, Turn, TurnFailed, TurnSettings
from ..protocol.errors import ErrorCode
from ..protocol.messages import Input, Settings
from ..protocol.session import (
    Action,
    AppendText,
    CancelTurn,
    EndText,
    FlushText,
    MicAudio,
    OpenTurn,
    SendAudio,
    SendEvent,
    SessionCore,
    SetGain,
)

log = logging.getLogger(__name__)

FRAME_MS = 20


@dataclass(frozen=True)
class PlayoutConfig:
    lead_ms: int = 200  # audio sent ahead of real time; small so a cancel is heard at once
    streaming: bool = True  # False: the naive whole-utterance baseline (benchmarks)
    schedule: ChunkSchedule = field(default_factory=ChunkSchedule)
    max_segment_tokens: int | None = None  # speech tokens (25 per second) per segment
    # Audio a turn may synthesize ahead of sending (0: unbounded). Beyond it the turn's
    # flow/vocoder work waits, so a barge-in wastes at most this much.
    max_ahead_ms: int = 5000


class SessionRunner:
    def __init__(
        self,
        core: SessionCore,
        engine: EmbeddedEngine,
        send_text: Callable[[str], Awaitable[None]],
        send_bytes: Callable[[bytes], Awaitable[None]],
        playout: PlayoutConfig = PlayoutConfig(),
        heard_ms: Callable[[], int | None] | None = None,
    ) -> None:
        """`heard_ms`: how much of the playing turn the listener has heard, where the
        transport knows better than the time since the first frame was sent."""
        self.core = core
        self.engine = engine
        self.playout = playout
        self._send_text = send_text
        self._send_bytes = send_bytes
        self._turns: dict[int, Turn] = {}
        self._order: asyncio.Queue[int] = asyncio.Queue()
        self._playing: tuple[int, asyncio.Task[None]] | None = None
        # (first frame sent at, frames sent) of the playing turn: what the listener heard
        self._heard: tuple[float, int] | None = None
        self._vad: VoiceActivity | None = None
        self._vad_key: tuple[int, ...] = ()
        self._transport_heard_ms = heard_ms
        self.gain = 1.0  # applied to each frame as it is sent (ducking)
        self._player = asyncio.get_running_loop().create_task(self._play_turns())

    async def on_text(self, data: str) -> None:
        await self.execute(self.core.receive_text(data))

    async def on_bytes(self, data: bytes) -> None:
        await self.execute(self.core.receive_bytes(data))

    async def close(self) -> None:
        self._player.cancel()
        for turn in self._turns.values():
            turn.close()
        self._turns.clear()
        with contextlib.suppress(asyncio.CancelledError):
            await self._player

    async def execute(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SendEvent):
                await self._send_text(json.dumps(action.event))
            elif isinstance(action, SendAudio):
                await self._send_bytes(action.data)
            elif isinstance(action, OpenTurn):
                turn = Turn(
                    action.turn_id,
                    self._turn_settings(action.settings),
                    self.engine,
                    schedule=self.playout.schedule,
                    streaming=self.playout.streaming,
                    max_segment_tokens=self.playout.max_segment_tokens,
                    max_output_frames=self.playout.max_ahead_ms // FRAME_MS,
                )
                turn.start()
                self._turns[action.num] = turn
                self._order.put_nowait(action.num)
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
                self._drop(action.num)
            elif isinstance(action, MicAudio):
                pcm = np.frombuffer(action.pcm, dtype="<i2")
                await self.execute(self.hear(pcm, action.sample_rate))
            elif isinstance(action, SetGain):
                self.gain = action.gain

    def hear(self, pcm: np.ndarray, sample_rate: int) -> list[Action]:
        """Microphone audio (any transport) -> voice activity -> speech events, and the
        core's barge-in decision. The detector follows the session's `input` settings."""
        i = self.core.settings.input if self.core.settings else Input()
        key = (sample_rate, i.vad_aggressiveness, i.min_speech_ms, i.hangover_ms)
        if self._vad is None or self._vad_key != key:
            self._vad_key = key
            self._vad = VoiceActivity(
                sample_rate,
                i.vad_aggressiveness,
                min_speech_ms=i.min_speech_ms,
                hangover_ms=i.hangover_ms,
            )
        actions: list[Action] = []
        for kind, t_ms in self._vad.feed(pcm):
            actions += self.core.speech(kind, t_ms, self.heard_ms())
        return actions

    @property
    def playing_turn(self) -> int | None:
        return None if self._playing is None else self._playing[0]

    def heard_ms(self) -> int | None:
        """How much of the playing turn the listener has heard: the client plays frames as
        they come (paced in real time), so at most the time since the first frame, and
        never more than was sent. None when no turn is playing."""
        if self._transport_heard_ms is not None:
            return self._transport_heard_ms()
        if self._heard is None:
            return None
        since, frames = self._heard
        return int(min((time.monotonic() - since) * 1000, frames * FRAME_MS))

    def _turn_settings(self, s: Settings) -> TurnSettings:
        sp = s.sampling
        return TurnSettings(
            voice=self.engine.model.voices[s.voice],
            sampling=SamplingParams(sp.temperature, sp.top_k, sp.top_p, sp.seed),
            speed=s.speed,
            output=OutputFormat(s.format.codec, s.format.sample_rate, s.format.bitrate),
            language=s.language,
        )

    def _drop(self, num: int) -> None:
        """Stop a turn at once: no further frame of it is sent; its state is discarded."""
        turn = self._turns.pop(num, None)
        if turn is not None:
            turn.close()
        if self._playing is not None and self._playing[0] == num:
            self._playing[1].cancel()

    async def _play_turns(self) -> None:
        while True:
            num = await self._order.get()
            turn = self._turns.get(num)
            if turn is None:  # cancelled while queued
                continue
            task = asyncio.get_running_loop().create_task(self._play(num, turn))
            self._playing = (num, task)
            await asyncio.wait({task})  # returns when done or cancelled, without raising
            self._playing = None
            self._heard = None
            self._turns.pop(num, None)
            turn.close()

    async def _play(self, num: int, turn: Turn) -> None:
        """Send the turn's frames on an absolute clock, `lead_ms` ahead of real time. Each
        frame is encoded only now, so a gain change (ducking) applies from the next frame."""
        codec = turn.settings.output.codec
        lead = self.playout.lead_ms / 1000
        start: float | None = None
        seq = 0
        try:
            while True:
                item = await turn.output.get()
                if item is None:
                    await self.execute(self.core.turn_done(num, self._timings(turn, start)))
                    return
                if isinstance(item, TurnFailed):
                    code = ErrorCode(item.code)
                    await self.execute(self.core.turn_failed(num, code, str(item)))
                    return
                now = time.monotonic()
                if start is None:
                    start = now
                # Pace on an absolute clock: frame k is due at start + k*20ms - lead.
                delay = start + seq * FRAME_MS / 1000 - lead - now
                if delay > 0:
                    await asyncio.sleep(delay)
                assert turn.encoder is not None  # set before the turn's first frame
                frame = item if self.gain == 1.0 else (item * self.gain).astype(np.float32)
                data = turn.encoder.encode_frame(frame)
                await self.execute(self.core.audio(num, codec, data, FRAME_MS, loudness(frame)))
                seq += 1
                self._heard = (start, seq)
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
