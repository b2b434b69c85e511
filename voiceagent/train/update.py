"""What the training stages share: the device they train on, the precision of a
training step, and one optimizer update."""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from .files import written


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


ANNEAL_FLOOR = 0.05  # an anneal's last rate, as a share of the full one


def anneal_factor(step: int, start: int, steps: int) -> float:
    """The learning rate's factor at `step` of an anneal (`train lm|flow|vocoder --anneal`)
    that begins at `start`: 1 before it, falling linearly to ANNEAL_FLOOR over `steps`
    steps, then ANNEAL_FLOOR. No anneal (`steps` 0): 1."""
    if steps <= 0:
        return 1.0
    frac = min(1.0, max(0.0, (step - start) / steps))
    return 1.0 - (1.0 - ANNEAL_FLOOR) * frac


def anneal_span(
    held: tuple[int, int], step: int, asked: int | None, checkpoint: Path, kept: Path
) -> tuple[int, int]:
    """(start, steps) of the anneal that a run from `step` trains under: `asked` steps
    from here when asked (the checkpoint, the weights before it, is copied to `kept`
    first), unless the checkpoint is in an unfinished anneal of that length (a run of
    the same command cut short: it finishes that one); else the checkpoint's own anneal,
    `held`, while unfinished (a resumed run finishes it); else none: training on after
    an anneal (more speech, say) goes at the full rate."""
    start, steps = held
    unfinished = bool(steps) and step < start + steps
    if asked:
        if not checkpoint.is_file():
            raise ValueError(f"{checkpoint.parent}: nothing to anneal: train it first")
        if unfinished and steps == asked:  # the same anneal, cut short: it goes on
            return start, steps
        with written(kept) as tmp:
            shutil.copyfile(checkpoint, tmp)
        return step, asked
    return (start, steps) if unfinished else (0, 0)


def anneal_stop(span: tuple[int, int], max_steps: int | None) -> int | None:
    """The step a run stops at: an anneal's end, or `max_steps` if that comes first."""
    if not span[1]:
        return max_steps
    return sum(span) if max_steps is None else min(max_steps, sum(span))


DEVICES = ("auto", "cpu", "cuda")


def train_device(name: str = "auto") -> torch.device:
    """The device a stage trains on: "auto" is the first CUDA device when torch sees one,
    else the CPU; "cuda" (or "cuda:N") where torch sees none is an error, not a quiet
    fall-back to hours of CPU. Batches are drawn on the CPU either way (their random
    draws are seeded there), so a run draws the same data on any device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no CUDA device here (a CPU-only build?)")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, not {name!r}")
    if device.type == "cuda" and device.index is None:  # named as its tensors name it
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def step_precision(
    bf16: bool, device: torch.device | None = None
) -> contextlib.AbstractContextManager[object]:
    """The context of a training step's forward: bfloat16 autocast (float32 weights, the
    matrix products in bfloat16) when asked and the device has bfloat16 kernels, else
    none. Measured on one core of this machine (AVX512-BF16): the LM's steps 1.5 times
    and the flow's 1.35 times as fast. Held-out losses stay in float32."""
    if bf16 and device is not None and device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.autocast("cuda", dtype=torch.bfloat16)
    elif bf16 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()
