"""The tiny model's streaming building block: a causal convolution whose left context is
explicit state (the batching convention of states is in ../contract.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalConv1d(nn.Conv1d):
    """Conv1d that sees only the past; the last `kernel - 1` input frames are the cache.

    A zero cache is exactly the zero left padding of an offline pass, so chunked output
    equals offline output.
    """

    def __init__(self, cin: int, cout: int, kernel: int) -> None:
        super().__init__(cin, cout, kernel)
        self.context = kernel - 1

    def empty_cache(self, batch: int) -> Tensor:
        w = self.weight
        return torch.zeros(batch, self.in_channels, self.context, device=w.device, dtype=w.dtype)

    def step(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        full = torch.cat([cache, x], dim=2)
        y = F.conv1d(full, self.weight, self.bias)
        return y, full[:, :, full.shape[2] - self.context :]
