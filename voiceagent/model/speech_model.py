"""What the engine needs of a speech model: three streaming stages, voices, a tokenizer.

A stage's streaming state is a `dict[str, Tensor]` whose tensors have the session as
dim 0 (see streaming.py), so chunks of several turns can run as one batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..text.tokenizer import TextTokenizer
from .flow_pad import PAD_TOKEN
from .lm import SpeechLM
from .streaming import State, cat_states, split_state
from .stretch import MelStretcher


@dataclass(frozen=True)
class Voice:
    """A role: the prompt the LM continues from and the speaker conditioning of the flow."""

    name: str
    prompt_text_ids: tuple[int, ...]  # the transcript of the prompt audio, as text tokens
    prompt_tokens: tuple[int, ...]  # speech tokens of the prompt audio
    embedding: Tensor  # speaker vector of the flow, [spk_dim]
    prompt_mel: Tensor | None = None  # [frames, 80] mel of the prompt audio, if the model uses it


class FlowStage(nn.Module):
    """Speech tokens -> mel, chunk by chunk."""

    def initial_state(self, voice: Voice) -> State:
        """Per-turn state of one session, primed with the voice's prompt if the model
        uses one."""
        raise NotImplementedError

    def forward_chunk(self, tokens: Tensor, spk: Tensor, state: State) -> tuple[Tensor, State]:
        """tokens [b, n + lookahead] (PAD_TOKEN past the end) -> mel [b, bins, frames] and
        the new state (the input state is not mutated)."""
        raise NotImplementedError

    def cat_states(self, states: Sequence[State]) -> State:
        """One batch state from several sessions' states (override for ragged caches)."""
        return cat_states(list(states))

    def split_states(self, state: State, n: int) -> list[State]:
        return split_state(state, n)


class VocoderStage(nn.Module):
    """Mel -> 24 kHz PCM, chunk by chunk."""

    def initial_state(self) -> State:
        raise NotImplementedError

    def forward_chunk(self, mel: Tensor, state: State, final: bool) -> tuple[Tensor, State]:
        """mel [b, bins, m] -> pcm [b, samples]; `final` flushes audio held back for
        right context. The input state is not mutated."""
        raise NotImplementedError

    def batch_key(self, state: State | None, frames: int, final: bool) -> object:
        """Chunks of several sessions run as one batch only when their keys are equal."""
        return (frames, final)

    def cat_states(self, states: Sequence[State]) -> State:
        return cat_states(list(states))

    def split_states(self, state: State, n: int) -> list[State]:
        return split_state(state, n)


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
