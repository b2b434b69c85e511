"""Streaming building blocks: causal convolutions whose left context is explicit state.

A stage's streaming state is a flat `dict[str, Tensor]` whose tensors all have the
session (or session x CFG branch) as their leading dimension. That one convention lets
the engine batch chunks of many turns by concatenating states and split them back after.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

State = dict[str, Tensor]


class CausalConv1d(nn.Conv1d):
    """Conv1d that sees only the past; the last `kernel - 1` input frames are the cache.

    A zero cache is exactly the zero left padding of an offline pass, so chunked output
    equals offline output.
    """

    def __init__(self, cin: int, cout: int, kernel: int) -> None:
        super().__init__(cin, cout, kernel)
        self.context = kernel - 1

    def empty_cache(self, batch: int) -> Tensor:
        return torch.zeros(batch, self.in_channels, self.context, device=self.weight.device)

    def step(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        full = torch.cat([cache, x], dim=2)
        y = F.conv1d(full, self.weight, self.bias)
        return y, full[:, :, full.shape[2] - self.context :]


def cat_states(states: list[State]) -> State:
    return {k: torch.cat([s[k] for s in states], dim=0) for k in states[0]}


def split_state(state: State, n: int) -> list[State]:
    """Undo `cat_states` of n states (each tensor splits into n equal row blocks)."""
    parts = {k: torch.chunk(v, n, dim=0) for k, v in state.items()}
    return [{k: parts[k][i] for k in state} for i in range(n)]
