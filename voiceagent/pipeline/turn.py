"""One turn: text -> segments -> speech tokens -> chunks -> mel -> PCM -> 20 ms frames.

Everything a turn accumulates (segmenter, LM request, flow/vocoder/framing state, queued
frames) lives in this object. Cancel drops the object; nothing outside it needs resetting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..audio.format import MODEL_RATE
from ..audio.framing import Framer
from ..engine.acoustic import AcousticStream, ChunkTimes
from ..engine.embedded import EmbeddedEngine
from ..engine.lm_engine import EngineError, EngineUnavailable, TokenStream
from ..model.contract import PAD_TOKEN, Voice
from ..model.sampling import SamplingParams
from ..ops.logs import bind
from ..text.markup import trailing_break
from ..text.normalize import normalize, said_text
from ..text.segmenter import Segmenter, SegmenterConfig
from ..text.timing import SpokenSegment

log = logging.getLogger(__name__)


STARVED_POLL_S = 0.02  # how often a turn holding audio looks whether its consumer ran dry
MEL_FRAME_MS = 20.0  # the flow's mel: 50 frames a second


@dataclass(frozen=True)
class ChunkSchedule:
    """Tokens per flow chunk: small first (fast first audio), larger later (efficiency)."""

    sizes: tuple[int, ...] = (4, 8, 16, 25)

    def size(self, index: int) -> int:
        return self.sizes[min(index, len(self.sizes) - 1)]


@dataclass(frozen=True)
class FrameFormat:
    """The frames a turn puts out: 20 ms at `sample_rate`, and `tail_samples` of silence
    after the last audio (the sender's codec lookahead). Encoding is the sender's."""

    sample_rate: int = MODEL_RATE
    tail_samples: int = 0


@dataclass(frozen=True)
class TurnSettings:
    voice: Voice
    sampling: SamplingParams
    speed: float = 1.0
    frames: FrameFormat = FrameFormat()
    language: str = "auto"  # picks the text normalization (numbers, symbols)
    # Mel frames of audio the vocoder holds back for right context: None is the model's
    # exact hold-back (HiFT: 20 frames, 400 ms before the first audio); fewer frames
    # give audio sooner, approximately (`VocoderStage.variant`), crossfaded over
    # `crossfade` frames at each chunk seam.
    hold_back: int | None = None
    crossfade: int = 0
    # Chunks on the flow's grid (the model's own streaming, exactly; a later first
    # packet) instead of the schedule; for a model without a grid, the schedule.
    grid: bool = False


@dataclass
class TurnStats:
    created: float = field(default_factory=time.monotonic)
    first_text: float | None = None  # when its first text came (a context may wait for it)
    synth_start: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    audio_samples: int = 0  # at 24 kHz
    tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the LM server found in its prefix cache
    chunks: int = 0
    # time spent waiting for the consumer (output bound reached) before last_audio
    held_s: float = 0.0
    # Where the first audio's time went (time.monotonic; see bench/first_packet.py):
    # the first LM request handed over, its first token, and the acoustic worker's
    # timestamps of the turn's first chunk and of its first chunk that yielded audio.
    lm_submitted: float | None = None
    first_token: float | None = None
    first_chunk: ChunkTimes | None = None
    first_audible: ChunkTimes | None = None
    first_audible_chunk: int = 0  # 1-based

    def could_be_heard(self, taken_from: float) -> float:
        """When the turn's audio could first be heard: at its first text, or when its
        consumer began to take its audio (`taken_from`: a queued turn waits for the one
        before it), whichever is later. The TTFA metric counts from here, so a client's
        queue or pause is not counted as the server's delay."""
        return max(taken_from, self.first_text or self.created)

    @property
    def ttfa_ms(self) -> float | None:
        return None if self.first_audio is None else (self.first_audio - self.created) * 1000

    @property
    def audio_ms(self) -> float:
        return self.audio_samples / 24.0

    @property
    def rtf(self) -> float | None:
        if self.synth_start is None or self.last_audio is None or not self.audio_samples:
            return None
        busy = self.last_audio - self.synth_start - self.held_s
        return busy / (self.audio_ms / 1000)


class TurnFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# Items of `Turn.output`: a 20 ms frame of float32 PCM at the output rate (the sender
# encodes it when it is due), where a segment's words fall in the turn's audio (once its
# speech tokens are known, before its last audio), a failure, or None at the end.
OutputItem = np.ndarray | SpokenSegment | TurnFailed | None


class Turn:
    def __init__(
        self,
        turn_id: str,
        settings: TurnSettings,
        engine: EmbeddedEngine,
        schedule: ChunkSchedule = ChunkSchedule(),
        segmenter: SegmenterConfig | None = None,
        streaming: bool = True,
        record_pcm: bool = False,
        max_segment_tokens: int | None = None,
        max_output_frames: int = 0,
        on_spoken: Callable[[SpokenSegment], Awaitable[None]] | None = None,
    ) -> None:
        """`max_output_frames`: frames made ahead of the consumer at most (0: no bound).
        The acoustic work waits beyond it, so a turn cut short by a cancel or barge-in has
        not spent compute on audio nobody hears, and other turns get the worker sooner.
        `on_spoken`: where each segment's timing goes as soon as it is known (a paced
        session sends it at once, ahead of the audio); None: into `output`, in order."""
        self.id = turn_id
        self.settings = settings
        self.engine = engine
        self.schedule = schedule
        self._grid = engine.model.flow.grid if settings.grid else None
        self._chunked = 0  # the turn's tokens handed to the flow so far
        self.streaming = streaming
        self.max_segment_tokens = max_segment_tokens  # a ceiling on any segment's speech
        self.stats = TurnStats()
        self.output: asyncio.Queue[OutputItem] = asyncio.Queue(max_output_frames)
        self.tokens: list[int] = []
        self.pcm: list[np.ndarray] | None = [] if record_pcm else None
        self._segmenter = Segmenter(segmenter)
        self._segments: asyncio.Queue[str | None] = asyncio.Queue()
        self._text_ended = False
        self._gen = torch.Generator().manual_seed(settings.sampling.seed)
        self._lm: TokenStream | None = None
        self._acoustic: AcousticStream | None = None
        self._held = 0.0  # seconds waited on the output bound so far
        self._paused_ms = 0.0  # silence added while waiting for text (`_starved`)
        self._task: asyncio.Task[None] | None = None
        self._on_spoken = on_spoken
        self._starved_at: float | None = None  # loop time it began waiting for text

    # -- input ----------------------------------------------------------------------------

    @property
    def text_ended(self) -> bool:
        return self._text_ended

    @property
    def waiting_since(self) -> float | None:
        """Since when (the event loop's clock) the turn has had nothing to do but wait
        for more text: all it was given is made and taken. None while it has work."""
        return self._starved_at if self.output.empty() else None

    async def _next_segment(self) -> str | None:
        if self._segments.empty():
            self._starved_at = asyncio.get_running_loop().time()
        try:
            return await self._segments.get()
        finally:
            self._starved_at = None

    async def _starved(self) -> bool:
        """Whether the consumer takes every frame made before more text comes: waiting
        on, the listener would run dry before hearing the audio held for right context."""
        while self._segments.empty():
            if self.output.empty():
                return True
            await asyncio.sleep(STARVED_POLL_S)
        return False

    def push_text(self, delta: str) -> None:
        if delta and self.stats.first_text is None:
            self.stats.first_text = time.monotonic()
        for seg in self._segmenter.push(delta):
            self._segments.put_nowait(seg)

    @property
    def holds_text(self) -> bool:
        """Text has come that waits for its sentence's end (or a flush)."""
        return self._segmenter.holding

    def flush_text(self) -> None:
        """Start on the buffered text now, although no sentence has ended."""
        for seg in self._segmenter.flush():
            self._segments.put_nowait(seg)

    def end_text(self) -> None:
        if not self._text_ended:
            self._text_ended = True
            for seg in self._segmenter.flush():
                self._segments.put_nowait(seg)
            self._segments.put_nowait(None)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"turn-{self.id}")

    def close(self) -> None:
        """Stop all work of this turn now (cancel, or after completion). Idempotent."""
        if self._task and not self._task.done():
            self._task.cancel()
        if self._lm:
            self._lm.cancel()
        if self._acoustic:
            self._acoustic.closed = True

    async def wait(self) -> None:
        if self._task:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- production -----------------------------------------------------------------------

    async def _run(self) -> None:
        bind(turn_id=self.id)  # this task's log lines name the turn
        s = self.settings
        try:
            framer = Framer(s.frames.sample_rate, s.frames.tail_samples)
            self._acoustic = self.engine.acoustic.new_stream(
                s.voice, s.speed, framer, s.hold_back, s.crossfade, self._grid is not None
            )
            if self.streaming:
                await self._run_streaming()
            else:
                await self._run_whole()
            await self.output.put(None)
        except asyncio.CancelledError:
            raise
        except EngineUnavailable as exc:
            log.warning("turn %s: %s", self.id, exc)
            await self.output.put(TurnFailed("engine_unavailable", str(exc)))
        except EngineError as exc:  # the engine already said why (no traceback needed)
            log.warning("turn %s: %s", self.id, exc)
            await self.output.put(TurnFailed("synthesis_failed", f"synthesis failed: {exc}"))
        except Exception as exc:
            log.exception("turn %s failed", self.id)
            await self.output.put(TurnFailed("synthesis_failed", f"synthesis failed: {exc}"))

    async def _tokens_of(self, segment: str) -> TokenStream:
        text_ids = self.engine.model.tokenizer.encode(normalize(segment, self.settings.language))
        n = len(text_ids)
        lo, hi = self.engine.model.token_ratio
        self._lm = self.engine.lm.generate(
            text_ids,
            self.settings.voice,
            self.settings.sampling,
            self._gen,
            min_len=int(n * lo),
            max_len=max(1, min(int(n * hi), self.max_segment_tokens or 1 << 30)),
        )
        self._lm.urgent = self.stats.chunks == 0  # later segments: audio is on the way
        self.stats.prompt_tokens += self._lm.prompt_tokens
        if self.stats.synth_start is None:
            self.stats.synth_start = time.monotonic()
            self.stats.lm_submitted = self._lm.submitted
        return self._lm

    async def _run_streaming(self) -> None:
        look = self.engine.model.pre_lookahead
        final = False
        holding = False  # a segment's last audio waits in the acoustic stage
        while True:
            if holding and await self._starved():
                await self._pause()
                holding = False
            if (segment := await self._next_segment()) is None:
                break
            segment, break_ms = trailing_break(segment)
            if not said_text(segment).strip():  # markup alone: a pause, or nothing
                if break_ms and not self._last_segment():
                    await self._pause(break_ms)
                    holding = False
                continue
            pending: list[int] = []
            first = len(self.tokens)
            async for new in (lm := await self._tokens_of(segment)):
                if self.stats.first_token is None:
                    self.stats.first_token = lm.first_token_at
                self.tokens += new
                pending += new
                while len(pending) >= (n := self._chunk_size()) + look:
                    lm.urgent = False  # its first chunk is on the way
                    await self._chunk(pending[: n + look], final=False)
                    pending = pending[n:]
            self.stats.cached_tokens += lm.cached_tokens
            await self._spoken(segment, first)
            # End of segment: the tail gets zero lookahead; flow state carries on. It is
            # the turn's last chunk when only the end marker is left in the queue.
            final = self._last_segment()
            await self._chunk(pending + [PAD_TOKEN] * look, final=final)
            holding = not final
            if break_ms and not final:  # the text asked for a pause here
                await self._pause(break_ms)
                holding = False
        if not final:  # the text ended after the last segment's tail was sent
            await self._chunk([PAD_TOKEN] * look, final=True)

    def _last_segment(self) -> bool:
        """The segment just taken is the turn's last: only the end marker is queued."""
        return self._text_ended and self._segments.qsize() == 1

    async def _pause(self, break_ms: float = 0.0) -> None:
        """Let out the audio the acoustic stage holds, with silence after it: no more text
        has come, and the listener is about to hear all that was let out before; or the
        text asked for a break of `break_ms` (then at least that much silence)."""
        assert self._acoustic is not None
        speed = self.settings.speed
        extra = max(0, round(break_ms * speed / MEL_FRAME_MS))  # mel frames, pre-stretch
        look = self.engine.model.pre_lookahead
        await self._chunk([PAD_TOKEN] * look, final=False, pause=True, silence=extra)
        frames = self.engine.acoustic.pause_frames(self._acoustic) + extra
        self._paused_ms += frames * MEL_FRAME_MS / speed

    def _chunk_size(self) -> int:
        """New tokens in the next chunk: the schedule's, or up to the next grid line."""
        if self._grid is None:
            return self.schedule.size(self.stats.chunks)
        at = len(self.settings.voice.prompt_tokens) + self._chunked  # the grid's origin: 0
        return self._grid - at % self._grid

    async def _run_whole(self) -> None:
        """Naive baseline: all tokens first, then all audio (for benchmarks)."""
        look = self.engine.model.pre_lookahead
        while (segment := await self._next_segment()) is not None:
            first = len(self.tokens)
            async for new in await self._tokens_of(segment):
                self.tokens += new
            await self._spoken(segment, first)
        await self._chunk(self.tokens + [PAD_TOKEN] * look, final=True)

    async def _spoken(self, segment: str, first: int) -> None:
        speed = self.settings.speed
        # captions show the words said, not the markup or markdown around them
        text = said_text(segment)
        spoken = SpokenSegment.of_tokens(text, first, len(self.tokens), speed, self._paused_ms)
        if self._on_spoken is not None:
            await self._on_spoken(spoken)
        else:
            await self.output.put(spoken)

    async def _chunk(
        self, tokens: list[int], final: bool, pause: bool = False, silence: int = 0
    ) -> None:
        assert self._acoustic is not None
        self._chunked += len(tokens) - self.engine.model.pre_lookahead
        acoustic = self.engine.acoustic
        result = await acoustic.synthesize(self._acoustic, tokens, final, pause, silence)
        if not np.isfinite(result.pcm).all():  # a broken model must not reach a listener
            raise EngineError("the acoustic model produced non-finite audio")
        if self.stats.first_chunk is None:
            self.stats.first_chunk = result.times
        if self.stats.first_audible is None and result.frames:
            self.stats.first_audible = result.times
            self.stats.first_audible_chunk = self.stats.chunks + 1
        self.stats.chunks += 1
        self.stats.audio_samples += len(result.pcm)
        self.stats.tokens = len(self.tokens)
        if self.pcm is not None:
            self.pcm.append(result.pcm)
        if result.frames:
            now = time.monotonic()
            self.stats.first_audio = self.stats.first_audio or now
            self.stats.last_audio = now
            self.stats.held_s = self._held
        for frame in result.frames:
            if self.output.full():  # ahead of the consumer by the bound: wait for it
                held = time.monotonic()
                await self.output.put(frame)
                self._held += time.monotonic() - held
            else:
                self.output.put_nowait(frame)
