"""The embedded engine: LM decode thread + acoustic worker thread over one model."""

from __future__ import annotations

import torch

from ..model.checkpoint import SpeechModel
from .acoustic import AcousticWorker
from .lm_engine import EmbeddedLM


class EmbeddedEngine:
    name = "embedded"

    def __init__(self, model: SpeechModel, max_batch: int = 16, threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.model = model
        self.lm = EmbeddedLM(model, max_batch=max_batch)
        self.acoustic = AcousticWorker(model)

    def start(self) -> None:
        self.lm.start()
        self.acoustic.start()

    def stop(self) -> None:
        self.lm.stop()
        self.acoustic.stop()
