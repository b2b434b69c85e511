"""A speech model: the three streaming stages, voices and a text tokenizer, as the engine
uses it. The stage interfaces are in contract.py; the LM stage is lm.SpeechLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..text.tokenizer import TextTokenizer
from .contract import PAD_TOKEN, FlowStage, VocoderStage, Voice
from .lm import SpeechLM
from .sampling import COSYVOICE2, SamplingParams
from .stretch import MelStretcher


@dataclass
class SpeechModel:
    name: str
    random_weights: bool  # True: audio is noise; said in logs and session.created
    lm: SpeechLM
    flow: FlowStage
    vocoder: VocoderStage
    voices: dict[str, Voice]
    tokenizer: TextTokenizer
    pre_lookahead: int  # future tokens the flow reads per chunk
    mel_bins: int
    token_ratio: tuple[float, float]  # min, max speech tokens per text token of a segment
    spk_dim: int  # size of a voice's speaker vector
    spec: Any = None  # the configuration the model was built from (for saving)
    # A folder with the prompt frontend's ONNX files (FRONTEND_FILES): voices can be made
    # from reference audio (voices/registry.py). None: this model cannot clone voices.
    frontend_dir: Path | None = None
    # The model's own sampling settings (CosyVoice2: its yaml's `sampling`): its LM
    # engines complete every request's from here (`SamplingParams.of_model`).
    sampling: SamplingParams = COSYVOICE2

    @property
    def device(self) -> torch.device:
        return self.lm.llm_decoder.weight.device

    @property
    def warning(self) -> str | None:
        if self.random_weights:
            return (
                f"model '{self.name}' has random weights: audio will be noise "
                "until a real model directory is given (--model)"
            )
        return None

    def check_voice(self, voice: Voice) -> None:
        """Raise ValueError if `voice` was made for a model of other dimensions."""
        if voice.embedding.numel() != self.spk_dim:
            raise ValueError(
                f"speaker vector has {voice.embedding.numel()} values, not {self.spk_dim}"
            )
        if voice.prompt_mel is not None and voice.prompt_mel.shape[-1] != self.mel_bins:
            raise ValueError(
                f"prompt mel has {voice.prompt_mel.shape[-1]} bins, not {self.mel_bins}"
            )

    @torch.inference_mode()
    def synthesize_offline(self, tokens: list[int], voice: Voice, speed: float = 1.0) -> np.ndarray:
        """All tokens of a turn in one flow pass and one vocoder pass (the reference the
        streaming path must equal)."""
        ids = torch.tensor([[*tokens, *([PAD_TOKEN] * self.pre_lookahead)]], device=self.device)
        spk = voice.embedding[None].to(self.device)
        mel, _ = self.flow.forward_chunk(ids, spk, self.flow.initial_state(voice))
        mel = MelStretcher(speed).push(mel[0], final=True)[None]
        pcm, _ = self.vocoder.forward_chunk(mel, self.vocoder.initial_state(), final=True)
        return pcm[0].cpu().numpy()
