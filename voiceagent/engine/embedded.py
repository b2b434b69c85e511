"""The engine: an LM backend (the embedded decode thread, or an SGLang server) plus the
acoustic worker thread over one model."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import torch

from ..model.contract import Voice
from ..model.quantize import FlowPrecision
from ..model.sampling import SamplingParams
from ..model.speech_model import SpeechModel
from ..ops.metrics import Metrics
from .acoustic import AcousticBatching, AcousticWorker, PromptTail
from .lm_engine import EmbeddedLM, TokenStream


class LMBackend(Protocol):
    """What a turn needs of the speech-token LM: the embedded decode thread
    (`EmbeddedLM`) or an SGLang server (`SGLangLM`)."""

    metrics: Metrics  # the engine's, set when the engine takes the backend

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def load(self) -> int: ...

    async def healthy(self) -> bool: ...

    def generate(
        self,
        text_ids: list[int],
        voice: Voice,
        params: SamplingParams,
        gen: torch.Generator,
        min_len: int,
        max_len: int,
    ) -> TokenStream: ...


def lm_dtype(precision: str, device: torch.device, int8: bool = False) -> torch.dtype:
    """`engine.lm_precision` on `device`: "auto" is bfloat16 on CUDA, float32 elsewhere
    or with int8 layers (which are made from the float32 LM)."""
    if precision == "bfloat16" or (precision == "auto" and device.type == "cuda" and not int8):
        return torch.bfloat16
    return torch.float32


def default_threads() -> int:
    """torch's intra-op threads when none are set: half the cores, at least one. The LM
    thread and the acoustic thread compute side by side, and two pools as wide as the
    machine fight over it (full-size CosyVoice2 on 2 cores: first packet 2.1 s at 1
    thread, 4.2 s at 2; docs/operations.md, CPU threads)."""
    return max(1, (os.cpu_count() or 2) // 2)


class EmbeddedEngine:
    def __init__(
        self,
        model: SpeechModel,
        max_batch: int = 16,
        threads: int | None = None,
        lm: LMBackend | None = None,
        metrics: Metrics | None = None,
        acoustic_batching: AcousticBatching = "invariant",
        prefix_cache: bool = True,
        int8_prefill: bool = False,
        int8_decode: bool = False,
        flow_precision: FlowPrecision = "float32",
        first_audio_first: bool = False,
        flow_window: int | None = None,
        warm: Sequence[Voice] = (),
        warm_hold_backs: Sequence[int] = (),
        prompt_tail: PromptTail = "rerun",
        lm_dtype: torch.dtype = torch.float32,
        lm_graphs: bool = False,
    ) -> None:
        """`metrics`: where the engine's threads count (a registry of its own if None);
        the server exports the engine's. `acoustic_batching`: "invariant" runs each
        turn's chunks alone (audio bit-identical whatever runs beside it), "batched" runs
        chunks of several turns as one batch (see engine/acoustic.py). `prefix_cache`:
        the embedded LM reuses each voice's prompt-prefix keys/values (lm_prefix.py).
        `int8_prefill`, `int8_decode`: its prompt prefills, its decode steps run int8
        layers (model/quantize.py). `lm_dtype`: the embedded LM's weights and KV slots;
        `lm_graphs`: its decode steps replay CUDA graphs (engine/lm_graphs.py).
        `flow_precision`: the acoustic worker's flow precision (`quantize.reduced_flow`).
        `flow_window`: speech tokens of a turn's own past its flow reads back (None: all).
        `prompt_tail`: "primed": a turn's first chunk runs its own tokens only, the
        voice prompt primed to its end (approximate; `AcousticWorker`).
        `warm`: voices primed at start on both threads (the LM's prompt prefix and a
        throwaway prefill, the flow state and a throwaway first chunk: their first turn
        is then as quick as later ones; each holds its prompt's state, ~0.4 GB at full
        size); `warm_hold_backs`: the vocoder hold-backs turns will use, warmed too.
        `first_audio_first`: while the acoustic worker computes a turn's first chunk, the
        embedded LM decodes only for turns that have no audio on the way either (the
        others sit out, as when they are far ahead), so the first audio gets the CPU;
        and while the acoustic worker is idle (a turn's prefill and first tokens, before
        its first chunk) the LM's steps use its threads too."""
        if threads:
            torch.set_num_threads(threads)
        self.model = model
        self.metrics = metrics or Metrics()
        self.lm: LMBackend = lm or EmbeddedLM(
            model,
            max_batch=max_batch,
            prefix_cache=prefix_cache,
            int8_prefill=int8_prefill,
            int8_decode=int8_decode,
            warm=warm,
            dtype=lm_dtype,
            graphs=lm_graphs,
        )
        self.lm.metrics = self.metrics
        self.name = "embedded" if isinstance(self.lm, EmbeddedLM) else "sglang"
        self.acoustic = AcousticWorker(
            model,
            self.metrics,
            acoustic_batching,
            flow_precision,
            flow_window,
            warm,
            warm_hold_backs,
            prompt_tail,
        )
        if first_audio_first and isinstance(self.lm, EmbeddedLM):
            acoustic = self.acoustic
            self.lm.yield_to = lambda: acoustic.first_chunks > 0
            self.lm.spare_cores = lambda: acoustic.idle
        self.metrics.info.info({"model": model.name, "engine": self.name})

    async def ready(self) -> bool:
        return await self.lm.healthy()

    def start(self) -> None:
        self.lm.start()
        self.acoustic.start()

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until the `warm` voices are primed on both threads (True), or `timeout`."""
        lm = self.lm.warmed.wait(timeout) if isinstance(self.lm, EmbeddedLM) else True
        return lm and self.acoustic.warmed.wait(timeout)

    def stop(self) -> None:
        self.lm.stop()
        self.acoustic.stop()
