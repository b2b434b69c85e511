"""Acoustic worker: flow matching + vocoder + framing for all turns, on one thread.

The worker takes every chunk job that is waiting. By default ("invariant") it runs them
one at a time, in queue order, so a turn's audio is a function of its own tokens and is
bit-identical whatever else runs. With "batched" it runs chunks of equal length through
the flow as one batch, and mel chunks of equal length through the vocoder as one batch
(states are concatenated along the batch axis; see model/contract.py); the float results
then depend in their last bits on the batch. In both modes an exception fails only the
job it came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from ..audio.features import SILENT_LOG_MEL
from ..audio.framing import Framer
from ..model.contract import PAD_TOKEN, State, VocoderStage, Voice
from ..model.quantize import FlowPrecision, reduced_flow
from ..model.speech_model import SpeechModel
from ..model.stretch import MelStretcher
from ..ops.metrics import Metrics

log = logging.getLogger(__name__)

# invariant: each chunk runs alone, so a turn's audio is bit-identical whatever runs beside
# it; batched: chunks of equal size of several turns run as one batch (float results then
# differ from a solo run in the last bits).
AcousticBatching = Literal["invariant", "batched"]
PromptTail = Literal["rerun", "primed"]
ACOUSTIC_BATCHING: tuple[AcousticBatching, ...] = ("invariant", "batched")
_Out = tuple[State | None, torch.Tensor]  # one job's result of a stage: new state, output


@dataclass
class AcousticStream:
    """Per-turn acoustic state: flow caches, vocoder overlap, speed and framing."""

    voice: Voice
    flow_state: State | None  # None until primed on the worker thread
    vocoder_state: State | None
    stretcher: MelStretcher
    framer: Framer | None
    closed: bool = False
    audible: bool = False  # a chunk of this turn has yielded audio
    # The turn's vocoder if not the model's: the same weights with another hold-back
    # (`VocoderStage.variant`); chunks of different vocoders never share a batch.
    vocoder: VocoderStage | None = None
    grid: bool = False  # chunks on the flow's grid (`FlowStage.initial_state(grid=True)`)


@dataclass
class ChunkTimes:
    """When one chunk passed each point (time.monotonic; 0.0: not reached). A handful of
    clock reads per chunk, always taken: the first-packet benchmark reads them."""

    queued: float  # handed to the worker (event loop)
    flow_start: float = 0.0
    flow_end: float = 0.0  # mel ready, stretched
    vocoder_start: float = 0.0
    vocoder_end: float = 0.0  # PCM ready
    framed: float = 0.0  # resampled and cut into frames


@dataclass
class ChunkResult:
    pcm: np.ndarray  # float32, 24 kHz
    # 20 ms frames at the output rate, not yet encoded (empty without a framer): the
    # sender encodes each one when it is due, so a gain change is applied at once.
    frames: list[np.ndarray]
    compute_ms: float
    times: ChunkTimes | None = None


@dataclass
class _Job:
    stream: AcousticStream
    tokens: list[int]  # chunk tokens + lookahead (PAD past the end)
    final: bool
    done: Callable[[ChunkResult | BaseException], None]
    pause: bool = False  # silence instead of the flow's mel (`synthesize`)
    silence: int = 0  # a pause's mel frames beyond what lets out the held audio
    mel: torch.Tensor | None = field(default=None)
    t0: float = field(default_factory=time.perf_counter)
    times: ChunkTimes = field(default_factory=lambda: ChunkTimes(time.monotonic()))


class AcousticWorker:
    def __init__(
        self,
        model: SpeechModel,
        metrics: Metrics | None = None,
        batching: AcousticBatching = "invariant",
        flow_precision: FlowPrecision = "float32",
        flow_window: int | None = None,
        warm: Sequence[Voice] = (),
        warm_hold_backs: Sequence[int] = (),
        prompt_tail: PromptTail = "rerun",
    ) -> None:
        """`flow_precision`: run the flow at this precision instead of the model's
        (`quantize.reduced_flow`: bfloat16 halves the cache bytes, int8 speeds up the
        estimator on the CPU; errors stated there and tested).
        `flow_window`: speech tokens of a turn's own past the flow reads back
        (`FlowStage.windowed`; None: all). Batched chunks need equal-length caches, so
        "batched" keeps everything. `prompt_tail`: "primed" primes each voice's prompt
        to its end, so that a turn's first chunk runs its own tokens only
        (`FlowStage.primed_tail`: cheaper, approximate); "rerun" runs the prompt's last
        tokens again with the turn's first ones as their lookahead (exact).
        `warm`: voices whose flow state the worker primes when it starts, before any
        chunk (`warmed` is set then), so that their first turn costs what later ones
        do; other voices are primed at their first turn.
        `warm_hold_backs`: vocoder hold-backs (`new_stream`) whose variants the warm-up
        runs too, besides the exact vocoder (each variant's first call sets up its own
        kernel shapes: measured 352 ms instead of 241 for a first chunk at full size)."""
        self.model = model
        self.flow = reduced_flow(model.flow, flow_precision)
        if flow_window is not None and batching == "invariant":
            self.flow = self.flow.windowed(flow_window)
        if prompt_tail == "primed":
            self.flow = self.flow.primed_tail()
        self.metrics = metrics or Metrics()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._primed_states: dict[tuple[str, bool], tuple[Voice, State]] = {}
        self._vocoders: dict[tuple[int, int], VocoderStage] = {}
        if batching not in ACOUSTIC_BATCHING:
            raise ValueError(f"acoustic batching is one of {ACOUSTIC_BATCHING}, not {batching!r}")
        self.batching = batching
        self._warm = list(warm)
        self._warm_hold_backs = list(warm_hold_backs)
        self.warmed = threading.Event()
        self.first_chunks = 0  # turns' first chunks being computed now (no audio out yet)
        self.working = 0  # chunks taken and not yet done
        self.rounds = 0  # times the worker took the waiting jobs
        self.max_round = 0  # most jobs taken at once
        self.batched_calls = 0  # flow or vocoder calls over more than one chunk

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="voiceagent-acoustic", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread:
            self._jobs.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def idle(self) -> bool:
        """No chunk is being computed or waiting (a chunk queued now may already have
        started: a hint, for sharing the CPU, never for correctness)."""
        return not self.working and self._jobs.empty()

    def new_stream(
        self,
        voice: Voice,
        speed: float,
        framer: Framer | None,
        hold_back: int | None = None,
        crossfade: int = 0,
        grid: bool = False,
    ) -> AcousticStream:
        """A turn's acoustic state; the flow state is primed on the worker thread.
        `hold_back`: mel frames the vocoder holds back for right context (None: the
        model's own, exact; fewer: approximate, see `VocoderStage.variant`)."""
        vocoder = None if hold_back is None else self._variant(hold_back, crossfade)
        stretcher = MelStretcher(speed)
        return AcousticStream(voice, None, None, stretcher, framer, vocoder=vocoder, grid=grid)

    def _variant(self, hold_back: int, crossfade: int = 0) -> VocoderStage:
        """The vocoder variant with this hold-back, made once and shared by turns."""
        vocoder = self._vocoders.get((hold_back, crossfade))
        if vocoder is None:
            vocoder = self.model.vocoder.variant(hold_back, crossfade)
            self._vocoders[(hold_back, crossfade)] = vocoder
        return vocoder

    def _primed(self, voice: Voice, grid: bool = False) -> State:
        """The flow state after the voice's prompt: computed once per voice and kind
        (it can cost a full flow pass over the prompt) and shared, since states are
        never mutated."""
        cached = self._primed_states.get((voice.name, grid))
        if cached is None or cached[0] is not voice:
            cached = (voice, self.flow.initial_state(voice, grid))
            self._primed_states[(voice.name, grid)] = cached
        return cached[1]

    def _rehearse(self, voice: Voice) -> None:
        """Prime the voice and run one first chunk's flow and vocoder from it, thrown
        away: the first real turn then finds the kernels' per-shape set-up done too."""
        primed = self._primed(voice)
        look, dev = self.model.pre_lookahead, self.model.device
        tokens = torch.tensor([[0] * 4 + [PAD_TOKEN] * look], device=dev)
        mel, _ = self.flow.forward_chunk(tokens, voice.embedding[None].to(dev), primed)
        vocoders = [self.model.vocoder, *(self._variant(h) for h in self._warm_hold_backs)]
        for vocoder in vocoders:  # a turn's first chunk (a second one may end it)
            vocoder.forward_chunk(mel.float(), vocoder.initial_state(), False)

    def primed_voices(self) -> set[str]:
        """The voices whose primed flow state is cached (of either kind)."""
        return {name for name, _ in self._primed_states}

    def forget_voice(self, name: str) -> None:
        """Drop the primed flow state cached for voice `name` (a deleted voice). A turn
        already running keeps its own reference to the state."""
        for grid in (False, True):
            self._primed_states.pop((name, grid), None)

    async def synthesize(
        self,
        stream: AcousticStream,
        tokens: list[int],
        final: bool,
        pause: bool = False,
        silence: int = 0,
    ) -> ChunkResult:
        """The audio of one chunk of a turn. `pause`: no tokens but silence, as much as
        the vocoder and the framing hold back, so that what they hold comes out (its
        right context silence) while the turn waits for text, and `silence` more mel
        frames (a break the text asked for); the turn goes on after it as after a pause
        in its speech."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ChunkResult] = loop.create_future()

        def done(result: ChunkResult | BaseException) -> None:
            def settle() -> None:
                if fut.done():
                    return
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)

            with contextlib.suppress(RuntimeError):  # its event loop is gone: nobody waits
                loop.call_soon_threadsafe(settle)

        self._jobs.put(_Job(stream, tokens, final, done, pause, silence))
        self.metrics.acoustic_waiting.inc()
        return await fut

    # -- worker thread --------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        for voice in self._warm:  # chunks that arrive meanwhile wait in the queue
            try:
                with torch.inference_mode():
                    self._rehearse(voice)
            except Exception:  # its first turn will try again, and fail on its own
                log.exception("priming voice %r failed", voice.name)
        self.warmed.set()
        while True:
            first = self._jobs.get()
            if first is None:
                return
            jobs = [first]
            while True:
                try:
                    nxt = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)
                    break
                jobs.append(nxt)
            now = time.perf_counter()
            self.metrics.acoustic_waiting.dec(len(jobs))
            for j in jobs:
                self.metrics.acoustic_wait.observe(now - j.t0)
            jobs = [j for j in jobs if not j.stream.closed]  # dropped turns cost nothing
            # The critical path first: chunks of turns that have no audio out yet run
            # before the rest (a stable sort keeps each turn's chunks in order).
            jobs.sort(key=lambda j: j.stream.audible)
            self.working = len(jobs)
            try:
                with torch.inference_mode():
                    self._process(jobs)
            except Exception as exc:  # a bug outside any one job: fail those not settled
                log.exception("acoustic round failed")
                for j in jobs:
                    j.done(exc)
            finally:
                self.working = 0

    def _process(self, jobs: list[_Job]) -> None:
        self.rounds += 1
        self.max_round = max(self.max_round, len(jobs))
        if self.batching == "batched":
            self._critical(jobs, self._stages)
        else:  # each chunk alone, in queue order: its result depends on its turn only
            for job in jobs:
                if not job.stream.closed:  # a turn cancelled during this round
                    self._critical([job], self._stages)

    def _critical(self, jobs: list[_Job], run: Callable[[list[_Job]], None]) -> None:
        """Run `jobs`, counted in `first_chunks` while any is a turn's first audio."""
        n = sum(not j.stream.audible for j in jobs)
        self.first_chunks += n
        try:
            run(jobs)
        finally:
            self.first_chunks -= n

    def _stages(self, jobs: list[_Job]) -> None:
        t0 = time.perf_counter()
        _stamp(jobs, "flow_start")
        jobs = self._stage(
            jobs,
            lambda j: (len(j.tokens), j.stream.grid, j.pause, j.silence),
            self._flow,
            self._flow_commit,
        )
        _stamp(jobs, "flow_end")
        t1 = time.perf_counter()
        self.metrics.chunk_seconds.labels("flow").observe(t1 - t0)
        if not jobs:
            return

        def key(j: _Job) -> object:
            voc = self._vocoder_of(j)
            frames = j.mel.shape[1] if j.mel is not None else 0
            return (id(voc), voc.batch_key(j.stream.vocoder_state, frames, j.final))

        _stamp(jobs, "vocoder_start")
        self._stage(jobs, key, self._vocoder, self._vocoder_commit)
        self.metrics.chunk_seconds.labels("vocoder").observe(time.perf_counter() - t1)

    def _vocoder_of(self, job: _Job) -> VocoderStage:
        return job.stream.vocoder or self.model.vocoder

    def _stage(
        self,
        jobs: list[_Job],
        key: Callable[[_Job], object],
        compute: Callable[[list[_Job]], list[_Out]],
        commit: Callable[[_Job, _Out], None],
    ) -> list[_Job]:
        """Run one stage over `jobs`, the jobs of equal `key` as one batch; return the
        jobs that did not fail. `compute` changes no job's stream, so a batch that raises
        is run again one job at a time; `commit` applies one job's result. Either way an
        exception fails only the job it came from."""
        ok: list[_Job] = []
        for group in [jobs] if len(jobs) == 1 else _group(jobs, key):
            try:
                outs = [(j, o) for j, o in zip(group, compute(group), strict=True)]
            except Exception as exc:
                if len(group) == 1:
                    self._fail(group[0], exc)
                    continue
                log.warning("acoustic batch of %d chunks failed: running them alone", len(group))
                outs = []
                for j in group:
                    try:
                        outs += [(j, compute([j])[0])]
                    except Exception as one:
                        self._fail(j, one)
            for j, o in outs:
                try:
                    commit(j, o)
                except Exception as exc:
                    self._fail(j, exc)
                else:
                    ok.append(j)
        return ok

    def _fail(self, job: _Job, exc: BaseException) -> None:
        log.error("acoustic chunk failed", exc_info=exc)
        job.done(exc)

    def _flow(self, group: list[_Job]) -> list[_Out]:
        """Mel (before stretching) and the new flow state of each job."""
        dev = self.model.device
        if group[0].pause:
            return [(None, self._silence(j)) for j in group]
        if len(group[0].tokens) == self.model.pre_lookahead:  # no new tokens: only drain
            return [(None, torch.zeros(self.model.mel_bins, 0, device=dev)) for _ in group]
        flow = self.flow
        states = []
        for j in group:
            if j.stream.flow_state is None:  # the primed state is shared and never mutated
                j.stream.flow_state = self._primed(j.stream.voice, j.stream.grid)
            states.append(j.stream.flow_state)
        tokens = torch.tensor([j.tokens for j in group], device=dev)
        spk = torch.stack([j.stream.voice.embedding for j in group]).to(dev)
        state = states[0] if len(group) == 1 else flow.cat_states(states)
        mel, state = flow.forward_chunk(tokens, spk, state)
        mel = mel.float()  # the vocoder's precision, whatever the flow's
        if len(group) > 1:
            self.batched_calls += 1
        split = [state] if len(group) == 1 else flow.split_states(state, len(group))
        return list(zip(split, mel, strict=True))

    def pause_frames(self, stream: AcousticStream) -> int:
        """Mel frames of silence a pause adds (`synthesize`): enough to let out all the
        vocoder and the framing hold: its hold-back, one frame the speed stretcher may
        keep, one for the resampler's delay and the framer's last part-frame."""
        return (stream.vocoder or self.model.vocoder).hold_back + 2

    def _silence(self, job: _Job) -> torch.Tensor:
        shape = (self.model.mel_bins, self.pause_frames(job.stream) + job.silence)
        return torch.full(shape, SILENT_LOG_MEL, device=self.model.device)

    def _flow_commit(self, job: _Job, out: _Out) -> None:
        state, mel = out
        if state is not None:
            job.stream.flow_state = state
        job.mel = job.stream.stretcher.push(mel, job.final)

    def _vocoder(self, group: list[_Job]) -> list[_Out]:
        """PCM and the new vocoder state of each job."""
        voc = self._vocoder_of(group[0])
        mels = [j.mel for j in group if j.mel is not None]
        vstates = [j.stream.vocoder_state or voc.initial_state() for j in group]
        state = vstates[0] if len(group) == 1 else voc.cat_states(vstates)
        pcm, state = voc.forward_chunk(torch.stack(mels), state, group[0].final)
        if len(group) > 1:
            self.batched_calls += 1
        split = [state] if len(group) == 1 else voc.split_states(state, len(group))
        return list(zip(split, pcm, strict=True))

    def _vocoder_commit(self, job: _Job, out: _Out) -> None:
        state, pcm = out
        job.stream.vocoder_state = state
        job.stream.audible = job.stream.audible or pcm.shape[-1] > 0
        self._finish(job, pcm.cpu().numpy().copy())

    def _finish(self, job: _Job, audio: np.ndarray) -> None:
        job.times.vocoder_end = time.monotonic()
        frames: list[np.ndarray] = []
        if job.stream.framer is not None:
            frames = job.stream.framer.frames(audio)
            if job.final:
                frames += job.stream.framer.flush()
        job.times.framed = time.monotonic()
        ms = (time.perf_counter() - job.t0) * 1000
        job.done(ChunkResult(audio, frames, ms, job.times))


def _stamp(jobs: list[_Job], point: str) -> None:
    now = time.monotonic()
    for j in jobs:
        setattr(j.times, point, now)


def _group(jobs: list[_Job], key: Callable[[_Job], object]) -> list[list[_Job]]:
    groups: dict[object, list[_Job]] = defaultdict(list)
    for j in jobs:
        groups[key(j)].append(j)
    return list(groups.values())
