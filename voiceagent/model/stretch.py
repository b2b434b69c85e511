"""Speaking-rate control by resampling the mel timeline, chunk by chunk.

Output frame j reads source position j * speed (linear interpolation), so chunked
stretching equals stretching the whole utterance at once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class MelStretcher:
    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._buf: Tensor | None = None  # source frames from index `_buf_start` on
        self._buf_start = 0
        self._next = 0  # next output frame index

    def push(self, mel: Tensor, final: bool) -> Tensor:
        """mel [bins, m] of one turn -> the output frames that are now determined."""
        if self.speed == 1.0:
            return mel
        buf = mel if self._buf is None else torch.cat([self._buf, mel], dim=1)
        total = self._buf_start + buf.shape[1]
        # Frame j needs source frames floor(j*s) and floor(j*s)+1 (the latter clamped at
        # the end of the turn).
        limit = math.ceil(total / self.speed) if final else math.ceil((total - 1) / self.speed)
        j = torch.arange(self._next, max(self._next, limit), dtype=torch.float64)
        pos = j * self.speed
        lo = pos.floor().long()
        hi = (lo + 1).clamp(max=total - 1)
        frac = (pos - lo.double()).float().to(buf.device)
        a = buf[:, lo - self._buf_start]
        b = buf[:, hi - self._buf_start]
        out = a * (1 - frac) + b * frac
        self._next = max(self._next, limit)
        keep_from = min(int(self._next * self.speed), total - 1)
        self._buf = buf[:, keep_from - self._buf_start :]
        self._buf_start = keep_from
        return out
