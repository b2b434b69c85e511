"""Embedded LM engine: one thread decodes the speech tokens of all live turns.

Every iteration admits new requests (prefill, one at a time) and then runs a single
batched decode step over the active requests (continuous batching). A request whose turn
has stopped reading (it is far enough ahead of playback) sits out the steps, unless
other requests are waiting for a KV slot; then it runs to its end and frees its slot.
Each request owns a KV slot and a seeded generator, so its tokens do not depend on its
batch mates (nor on when it sat out).
Tokens reach the asyncio side through `TokenStream`, an async iterator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..model.contract import STOP_TOKENS, Voice
from ..model.lm import KVPool
from ..model.quantize import int8_layers, reduced_lm
from ..model.sampling import SamplingParams, sample_token
from ..model.speech_model import SpeechModel
from ..ops.metrics import Metrics
from .lm_graphs import DecodeGraphs
from .lm_prefix import PrefixCache

log = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """The engine could not produce tokens (a bug, or out of capacity)."""


class EngineUnavailable(EngineError):
    """The LM server cannot be reached or stopped answering."""


class TokenStream:
    """Speech tokens of one LM request, as lists of new tokens; `cancel()` aborts it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_cancel: Callable[[], None]) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[list[int] | BaseException | None] = asyncio.Queue()
        self._on_cancel = on_cancel
        self._done = False
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.fed = 0  # tokens produced (written by the engine thread only)
        self.taken = 0  # tokens the turn has read (written by the event loop only)
        self.submitted = time.monotonic()
        self.first_token_at: float | None = None  # when the first token was produced
        # Its turn has no audio on the way yet: it is on a listener's critical path
        # (the turn sets it False once its first chunk is handed over).
        self.urgent = True

    @property
    def backlog(self) -> int:
        """Tokens produced that the turn has not read yet."""
        return self.fed - self.taken

    # called from the engine thread
    def feed(self, item: list[int] | BaseException | None) -> None:
        if isinstance(item, list):
            if not self.fed:
                self.first_token_at = time.monotonic()
            self.fed += len(item)
        # (a closed loop raises: its reader is gone, there is nothing to tell)
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> TokenStream:
        return self

    async def __anext__(self) -> list[int]:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self.taken += len(item)
        return item

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._on_cancel()


@dataclass
class _Request:
    text_ids: list[int]  # prompt text + target text
    speech_ids: list[int]  # the voice's prompt speech tokens
    prefix: tuple[int, ...]  # the voice's prompt text (the start of text_ids)
    params: SamplingParams
    min_len: int
    max_len: int
    stream: TokenStream
    gen: torch.Generator  # owned by the turn; one turn's requests run one after another
    slot: int = -1
    length: int = 0  # positions in the KV slot
    produced: list[int] = field(default_factory=list)
    cancelled: bool = False
    queued: float = field(default_factory=time.monotonic)


# While nobody waits for a KV slot, a request whose turn has this many tokens unread
# (2 s of speech: the turn is waiting on its output bound) sits out decode steps.
MAX_BACKLOG = 50
PAUSED_POLL_S = 0.005  # how often the thread looks again when every request sits out


class EmbeddedLM:
    def __init__(
        self,
        model: SpeechModel,
        max_batch: int = 16,
        max_len: int = 2048,
        max_backlog: int = MAX_BACKLOG,
        prefix_cache: bool = True,
        int8_prefill: bool = False,
        int8_decode: bool = False,
        warm: Sequence[Voice] = (),
        dtype: torch.dtype = torch.float32,
        graphs: bool = False,
    ) -> None:
        """`prefix_cache`: keep each voice's `[sos, prompt text]` keys/values and start
        later prefills after them (lm_prefix.py); False prefills every prompt whole.
        `int8_prefill`, `int8_decode`: prefills, decode steps run int8 copies of the
        decoder layers (CPU only, float32 LM; model/quantize.py). `warm`: voices the
        thread runs a throwaway prefill and decode step for when it starts (`warmed` is
        set after). `dtype`: the LM's weights and KV slots (`quantize.reduced_lm`).
        `graphs`: decode steps through `DecodeGraphs` (CUDA graphs on a GPU; on the CPU
        the same bucketed steps run eagerly)."""
        if dtype != torch.float32 and (int8_prefill or int8_decode):
            raise ValueError("int8 layers are made from the float32 LM")
        self.model = model
        self.lm = reduced_lm(model.lm, dtype)
        self._warm = list(warm)
        self.warmed = threading.Event()
        self.prefix_cache = PrefixCache() if prefix_cache else None
        self._prefill_layers = int8_layers(model.lm) if int8_prefill else None
        self._decode_layers = int8_layers(model.lm) if int8_decode else None
        self._use_graphs = graphs
        self._graphs: DecodeGraphs | None = None
        self.max_backlog = max_backlog
        self._all_paused = False
        # While this says so (the acoustic worker is on a turn's first chunk), requests
        # that are not urgent sit out decode steps: the first audio gets the CPU first.
        self.yield_to: Callable[[], bool] | None = None
        # While this says so (the acoustic worker is idle), the LM's steps run on twice
        # its share of torch threads, the acoustic worker's share too (`_share_cpu`).
        self.spare_cores: Callable[[], bool] | None = None
        self.max_batch = max_batch
        self.max_len = max_len
        # With graphs, one more slot: the scratch rows of a batch bucket decode into it.
        slots = max_batch + 1 if graphs else max_batch
        self._pool = KVPool(model.lm.cfg, slots, max_len, model.device, dtype)
        self._free = list(range(max_batch))
        self._incoming: queue.Queue[_Request | None] = queue.Queue()
        self._active: list[_Request] = []
        self._waiting: list[_Request] = []
        self._thread: threading.Thread | None = None
        self.steps = 0  # batched decode steps run (for stats)
        self.metrics = Metrics()  # replaced by the engine's

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="voiceagent-lm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread:
            self._incoming.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def load(self) -> int:
        return len(self._active) + len(self._waiting) + self._incoming.qsize()

    async def healthy(self) -> bool:
        return True  # in-process: ready once constructed

    def generate(
        self,
        text_ids: list[int],
        voice: Voice,
        params: SamplingParams,
        gen: torch.Generator,
        min_len: int,
        max_len: int,
    ) -> TokenStream:
        loop = asyncio.get_running_loop()
        prompt_ids = list(voice.lm_text_ids) + text_ids
        speech_ids = list(voice.lm_speech_tokens)
        prompt_len = len(prompt_ids) + len(speech_ids) + 2  # + sos, task_id
        # A segment's speech may not outgrow its KV slot: cap its length there.
        max_len = min(max_len, self.max_len - prompt_len)
        min_len = min(min_len, max_len)
        if max_len < 1:
            raise EngineError(f"a prompt of {prompt_len} tokens leaves no room in the KV slot")
        req: _Request
        stream = TokenStream(loop, lambda: setattr(req, "cancelled", True))
        stream.prompt_tokens = prompt_len
        prefix = tuple(voice.lm_text_ids)
        params = params.of_model(self.model.sampling)
        req = _Request(prompt_ids, speech_ids, prefix, params, min_len, max_len, stream, gen)
        self._incoming.put(req)
        return stream

    # -- engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        share = torch.get_num_threads()  # this thread's, as the engine set them
        wide = min(2 * share, os.cpu_count() or 1)
        if self._use_graphs:
            try:
                with torch.inference_mode():
                    self._graphs = DecodeGraphs(
                        self.lm, self._pool, self.max_batch, self.max_batch, self._decode_layers
                    )
                log.info("LM decode graphs: %d captured", self._graphs.captured)
            except Exception:  # decode steps run as they would without
                log.exception("LM decode graphs could not be captured")
        for voice in self._warm:  # requests that arrive meanwhile wait in the queue
            try:
                with torch.inference_mode():
                    self._rehearse(voice)
            except Exception:  # its first turn will run it for real, and fail on its own
                log.exception("LM warm-up for voice %r failed", voice.name)
        self.warmed.set()
        while True:
            block = not self._active and not self._waiting
            timeout = None
            if self._all_paused:  # nothing to decode now: look again shortly, no spinning
                block, timeout = True, PAUSED_POLL_S
            try:
                while True:
                    item = self._incoming.get(block=block, timeout=timeout)
                    block = False
                    if item is None:
                        self._fail_all(EngineError("engine stopped"))
                        return
                    self._waiting.append(item)
            except queue.Empty:
                pass
            if self.spare_cores is not None and self.model.device.type == "cpu":
                self._share_cpu(wide if self.spare_cores() else share)
            try:
                with torch.inference_mode():
                    self._admit()
                    self._step()
            except Exception as exc:  # keep serving: fail only the affected requests
                log.exception("LM step failed")
                self._fail_all(EngineError(f"LM step failed: {exc}"))

    @staticmethod
    def _share_cpu(threads: int) -> None:
        """Run this thread's next steps on `threads` torch threads. A turn's prefill and
        its first tokens come before its first chunk, while the acoustic worker has
        nothing to do: at full size on the 2-core CPU an int8 prefill of 80 positions
        took 150-170 ms on 2 threads against 260 on 1, a decode step 44-53 against 65-68.
        (torch keeps the count per thread, as OpenMP does: the acoustic worker's own
        stays as it was.)"""
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def _rehearse(self, voice: Voice) -> None:
        """One prefill of the voice's prompt and one decode step, in the slot the first
        request takes, thrown away: the voice's prefix is cached and the kernels' first
        calls (int8 ones too) and the slot's first memory touch are behind us, so the
        voice's first turn costs what later ones do (measured: its prefill took 831 ms
        instead of 460 at full size, on the 2-core CPU)."""
        lm, slot = self.lm, self._free[-1]
        text = list(voice.lm_text_ids) + list(voice.lm_text_ids[:8] or [0])
        prompt = lm.prompt_embeds(text, list(voice.lm_speech_tokens))
        start = 0
        if self.prefix_cache is not None and voice.lm_text_ids:
            start, _ = self.prefix_cache.fill(
                lm, tuple(voice.lm_text_ids), prompt, self._pool, slot, self._prefill_layers
            )
        slots, pool = self._ids([slot]), self._pool
        lm.forward_embeds(prompt[:, start:], pool, slots, self._ids([start]), self._prefill_layers)
        step = lm.embed_speech(self._ids([0]))
        lm.forward_embeds(step, pool, slots, self._ids([prompt.shape[1]]), self._decode_layers)

    def _admit(self) -> None:
        self._waiting = [r for r in self._waiting if not r.cancelled]
        while self._waiting and self._free:
            req = self._waiting.pop(0)
            req.slot = self._free.pop()
            self._active.append(req)
            self.metrics.lm_wait.observe(time.monotonic() - req.queued)
            try:
                lm = self.lm
                prompt = lm.prompt_embeds(req.text_ids, req.speech_ids)
                start = 0
                if self.prefix_cache is not None and req.prefix:
                    start, hit = self.prefix_cache.fill(
                        lm, req.prefix, prompt, self._pool, req.slot, self._prefill_layers
                    )
                    req.stream.cached_tokens = start if hit else 0
                logits = lm.forward_embeds(
                    prompt[:, start:],
                    self._pool,
                    self._ids([req.slot]),
                    self._ids([start]),
                    self._prefill_layers,
                )
                req.length = prompt.shape[1]
                self._emit(req, logits[0].float().cpu())
            except Exception as exc:  # this request's prefill: only it fails
                self._fail(req, exc)
        self.metrics.lm_waiting.set(len(self._waiting))

    def _step(self) -> None:
        self._release(lambda r: r.cancelled)
        reqs = list(self._active)
        if not self._waiting:  # slots are not scarce: far-ahead requests may sit out
            reqs = [r for r in reqs if r.stream.backlog < self.max_backlog]
            if self.yield_to is not None and self.yield_to():
                reqs = [r for r in reqs if r.stream.urgent]
        self._all_paused = bool(self._active) and not reqs
        if not reqs:
            return
        try:
            self._decode(reqs)
        except Exception as exc:
            if len(reqs) == 1:  # (the others sat out: they are not to blame)
                self._fail(reqs[0], exc)
                return
            # Which request broke the batch? Each alone: a decode step only writes its
            # own KV positions, so running one again is safe; the others carry on.
            log.warning("an LM step of %d requests failed; running each alone", len(reqs))
            for r in reqs:
                try:
                    self._decode([r])
                except Exception as exc:
                    self._fail(r, exc)

    def _decode(self, reqs: list[_Request]) -> None:
        """One decode step of `reqs`; a request whose sampling fails fails alone."""
        tokens = [r.produced[-1] for r in reqs]
        slots = [r.slot for r in reqs]
        lengths = [r.length for r in reqs]
        if self._graphs is not None:
            logits = self._graphs.step(tokens, slots, lengths)
        else:
            x = self.lm.embed_speech(self._ids(tokens))
            args = (self._pool, self._ids(slots), self._ids(lengths), self._decode_layers)
            logits = self.lm.forward_embeds(x, *args)
        self.steps += 1
        self.metrics.lm_batch.observe(len(reqs))
        for r, row in zip(reqs, logits.float().cpu(), strict=True):
            r.length += 1
            try:
                self._emit(r, row)
            except Exception as exc:
                self._fail(r, exc)

    def _ids(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.model.device)

    def _emit(self, req: _Request, logits: torch.Tensor) -> None:
        if torch.isnan(logits).any():
            raise EngineError("the LM produced NaN logits")
        allow_stop = len(req.produced) >= req.min_len
        tok = sample_token(logits, req.params, req.gen, allow_stop, req.produced)
        if tok in STOP_TOKENS:
            req.stream.feed(None)
            self._release(lambda r: r is req)
            return
        req.produced.append(tok)
        req.stream.feed([tok])
        self.metrics.lm_tokens.inc()
        if len(req.produced) >= req.max_len:
            req.stream.feed(None)
            self._release(lambda r: r is req)

    def _release(self, which: Callable[[_Request], bool]) -> None:
        keep = []
        for r in self._active:
            if which(r):
                self._free.append(r.slot)
            else:
                keep.append(r)
        self._active = keep

    def _fail(self, req: _Request, exc: Exception) -> None:
        """End one request with an error; its slot is free again."""
        log.error("LM request failed: %s", exc, exc_info=not isinstance(exc, EngineError))
        req.stream.feed(exc if isinstance(exc, EngineError) else EngineError(f"LM failed: {exc}"))
        self._release(lambda r: r is req)

    def _fail_all(self, exc: BaseException) -> None:
        for r in self._active + self._waiting:
            r.stream.feed(exc)
        self._release(lambda r: True)
        self._waiting = []
