"""Acoustic worker: flow matching + vocoder + framing for all turns, on one thread.

The worker takes every chunk job that is waiting, runs chunks of equal length through
the flow as one batch, and mel chunks of equal length through the vocoder as one batch
(states are concatenated along the batch axis; see model/contract.py).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..audio.framing import Framer
from ..model.contract import State, Voice
from ..model.speech_model import SpeechModel
from ..model.stretch import MelStretcher
from ..ops.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass
class AcousticStream:
    """Per-turn acoustic state: flow caches, vocoder overlap, speed and framing."""

    voice: Voice
    flow_state: State | None  # None until primed on the worker thread
    vocoder_state: State | None
    stretcher: MelStretcher
    framer: Framer | None
    closed: bool = False


@dataclass
class ChunkResult:
    pcm: np.ndarray  # float32, 24 kHz
    # 20 ms frames at the output rate, not yet encoded (empty without a framer): the
    # sender encodes each one when it is due, so a gain change is applied at once.
    frames: list[np.ndarray]
    compute_ms: float


@dataclass
class _Job:
    stream: AcousticStream
    tokens: list[int]  # chunk tokens + lookahead (PAD past the end)
    final: bool
    done: Callable[[ChunkResult | BaseException], None]
    mel: torch.Tensor | None = field(default=None)
    t0: float = field(default_factory=time.perf_counter)


class AcousticWorker:
    def __init__(self, model: SpeechModel, metrics: Metrics | None = None) -> None:
        self.model = model
        self.metrics = metrics or Metrics()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._primed_states: dict[str, tuple[Voice, State]] = {}
        self.batches = 0
        self.batched_chunks = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="voiceagent-acoustic", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread:
            self._jobs.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    def new_stream(self, voice: Voice, speed: float, framer: Framer | None) -> AcousticStream:
        """A turn's acoustic state; the flow state is primed on the worker thread."""
        return AcousticStream(voice, None, None, MelStretcher(speed), framer)

    def _primed(self, voice: Voice) -> State:
        """The flow state after the voice's prompt: computed once per voice (it can cost
        a full flow pass over the prompt) and shared, since states are never mutated."""
        cached = self._primed_states.get(voice.name)
        if cached is None or cached[0] is not voice:
            cached = (voice, self.model.flow.initial_state(voice))
            self._primed_states[voice.name] = cached
        return cached[1]

    async def synthesize(
        self, stream: AcousticStream, tokens: list[int], final: bool
    ) -> ChunkResult:
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

            loop.call_soon_threadsafe(settle)

        self._jobs.put(_Job(stream, tokens, final, done))
        self.metrics.acoustic_waiting.inc()
        return await fut

    # -- worker thread --------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
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
            try:
                with torch.inference_mode():
                    self._process(jobs)
            except Exception as exc:
                log.exception("acoustic batch failed")
                for j in jobs:
                    j.done(exc)

    def _process(self, jobs: list[_Job]) -> None:
        self.batches += 1
        self.batched_chunks += len(jobs)
        look = self.model.pre_lookahead
        dev = self.model.device
        t0 = time.perf_counter()
        for group in _group(jobs, lambda j: len(j.tokens)):
            if len(group[0].tokens) == look:  # no new tokens: only drain the stretcher
                for j in group:
                    j.mel = j.stream.stretcher.push(
                        torch.zeros(self.model.mel_bins, 0, device=dev), j.final
                    )
                continue
            flow = self.model.flow
            for j in group:
                if j.stream.flow_state is None:
                    j.stream.flow_state = self._primed(j.stream.voice)
            tokens = torch.tensor([j.tokens for j in group], device=dev)
            spk = torch.stack([j.stream.voice.embedding for j in group]).to(dev)
            states = [j.stream.flow_state for j in group if j.stream.flow_state is not None]
            state = states[0] if len(group) == 1 else flow.cat_states(states)
            mel, state = flow.forward_chunk(tokens, spk, state)
            split = [state] if len(group) == 1 else flow.split_states(state, len(group))
            for j, s, m in zip(group, split, mel, strict=True):
                j.stream.flow_state = s
                j.mel = j.stream.stretcher.push(m, j.final)
        t1 = time.perf_counter()
        self.metrics.chunk_seconds.labels("flow").observe(t1 - t0)
        voc = self.model.vocoder
        for group in _group(
            jobs,
            lambda j: voc.batch_key(
                j.stream.vocoder_state, j.mel.shape[1] if j.mel is not None else 0, j.final
            ),
        ):
            mels = [j.mel for j in group if j.mel is not None]
            vstates = [j.stream.vocoder_state or voc.initial_state() for j in group]
            state = vstates[0] if len(group) == 1 else voc.cat_states(vstates)
            pcm, state = voc.forward_chunk(torch.stack(mels), state, group[0].final)
            split = [state] if len(group) == 1 else voc.split_states(state, len(group))
            for j, s, p in zip(group, split, pcm, strict=True):
                j.stream.vocoder_state = s
                self._finish(j, p.cpu().numpy().copy())
        self.metrics.chunk_seconds.labels("vocoder").observe(time.perf_counter() - t1)

    def _finish(self, job: _Job, audio: np.ndarray) -> None:
        frames: list[np.ndarray] = []
        if job.stream.framer is not None:
            frames = job.stream.framer.frames(audio)
            if job.final:
                frames += job.stream.framer.flush()
        job.done(ChunkResult(audio, frames, (time.perf_counter() - job.t0) * 1000))


def _group(jobs: list[_Job], key: Callable[[_Job], object]) -> list[list[_Job]]:
    groups: dict[object, list[_Job]] = defaultdict(list)
    for j in jobs:
        groups[key(j)].append(j)
    return list(groups.values())
