"""The engine: an LM backend (the embedded decode thread, or an SGLang server) plus the
acoustic worker thread over one model."""

from __future__ import annotations

import torch

from ..model.checkpoint import SpeechModel
from .acoustic import AcousticWorker
from .lm_engine import EmbeddedLM
from .sglang_lm import SGLangLM


class EmbeddedEngine:
    def __init__(
        self,
        model: SpeechModel,
        max_batch: int = 16,
        threads: int | None = None,
        lm: SGLangLM | None = None,
    ) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.model = model
        self.lm: EmbeddedLM | SGLangLM = lm or EmbeddedLM(model, max_batch=max_batch)
        self.name = "sglang" if lm is not None else "embedded"
        self.acoustic = AcousticWorker(model)

    async def ready(self) -> bool:
        return await self.lm.healthy() if isinstance(self.lm, SGLangLM) else True

    def start(self) -> None:
        self.lm.start()
        self.acoustic.start()

    def stop(self) -> None:
        self.lm.stop()
        self.acoustic.stop()
