"""Token sampling with per-turn seeded generators (reproducible across batch mates)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .config import SPEECH_CODES


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 25
    top_p: float = 0.8
    seed: int = 0


def sample_token(
    logits: Tensor, params: SamplingParams, gen: torch.Generator, allow_stop: bool
) -> int:
    """Sample one speech token from logits [speech_vocab]. Stop tokens are masked
    until `allow_stop` (the minimum length is reached)."""
    logits = logits.float().clone()
    if not allow_stop:
        logits[SPEECH_CODES:] = float("-inf")
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits[logits < kth] = float("-inf")
    probs = torch.softmax(logits, dim=0)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=0)
        drop = cum - sorted_p > params.top_p  # keep the smallest prefix reaching top_p
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen))
