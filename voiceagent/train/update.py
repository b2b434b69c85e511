"""One optimizer update, shared by the three training stages."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor


def update(
    opt: torch.optim.Optimizer, params: Iterable[Tensor], loss: Tensor, clip: float
) -> float | None:
    """Backward, clip the gradient norm, step; returns the norm before clipping. If the
    loss or the gradient is not finite nothing changes and None is returned: one such
    update turns every weight NaN (the vocoder's first long run did, on a batch of
    near-silent segments)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(list(params), clip))
    if not (math.isfinite(norm) and bool(torch.isfinite(loss))):
        opt.zero_grad(set_to_none=True)
        return None
    opt.step()
    return norm
