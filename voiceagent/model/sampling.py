"""Token sampling with per-turn seeded generators (reproducible across batch mates).

Nucleus sampling (top-k, then top-p) with repetition-aware resampling as CosyVoice2
uses it: if the sampled token already fills `ras_tau` of the last `ras_window`
tokens, it is banned and one token is drawn from the full distribution instead. That
keeps a semantic-token LM from looping on one sound.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .contract import SPEECH_CODES


@dataclass(frozen=True)
class SamplingParams:
    temperature: float | None = None  # None: the model's (CosyVoice2: 1.0)
    top_k: int | None = None  # None: the model's (its yaml's `sampling`; CosyVoice2: 25)
    top_p: float | None = None  # None: the model's (CosyVoice2: 0.8)
    seed: int = 0
    ras_window: int = 10
    ras_tau: float = 0.1

    def of_model(self, model: SamplingParams) -> SamplingParams:
        """These settings completed by `model`'s: a client chooses temperature, top-k,
        top-p and seed (the first three default to the model's, as its files state them:
        a voice knows how its tokens are best drawn); the model's files choose the
        repetition-aware window and threshold."""
        return replace(
            self,
            temperature=model.temperature if self.temperature is None else self.temperature,
            top_k=model.top_k if self.top_k is None else self.top_k,
            top_p=model.top_p if self.top_p is None else self.top_p,
            ras_window=model.ras_window,
            ras_tau=model.ras_tau,
        )

    @property
    def drawing(self) -> tuple[float, int, float]:
        """(temperature, top_k, top_p) once `of_model` has completed them."""
        if self.temperature is None or self.top_k is None or self.top_p is None:
            raise ValueError("sampling parameters not completed by the model's (of_model)")
        return self.temperature, self.top_k, self.top_p


# A model's sampling when its files state none: CosyVoice2's yaml (`ras_sampling`).
COSYVOICE2 = SamplingParams(1.0, top_k=25, top_p=0.8, ras_window=10, ras_tau=0.1)


def sample_token(
    logits: Tensor,
    params: SamplingParams,
    gen: torch.Generator,
    allow_stop: bool,
    history: list[int] | None = None,
) -> int:
    """Sample one speech token from logits [speech_vocab]. Stop tokens are masked
    until `allow_stop` (the minimum length is reached); `history` holds the tokens
    decoded so far in this request (for repetition-aware sampling)."""
    logits = logits.float().clone()
    if not allow_stop:
        logits[SPEECH_CODES:] = float("-inf")
    temperature = params.drawing[0]
    if temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits / temperature
    token = _nucleus(logits, params, gen)
    recent = (history or [])[-params.ras_window :]
    if params.ras_window > 0 and recent.count(token) >= params.ras_window * params.ras_tau:
        logits[token] = float("-inf")
        token = int(torch.multinomial(torch.softmax(logits, dim=0), 1, generator=gen))
    return token


def _nucleus(logits: Tensor, params: SamplingParams, gen: torch.Generator) -> int:
    logits = logits.clone()
    _, top_k, top_p = params.drawing
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits[logits < kth] = float("-inf")
    probs = torch.softmax(logits, dim=0)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=0)
        drop = cum - sorted_p >= top_p  # keep the smallest prefix reaching top_p
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen))
