"""The LM's decode step as the engine runs it on this device: ordinary, and through
`DecodeGraphs` (CUDA graphs on a GPU; on the CPU the same bucketed steps, eagerly),
reported by `bench --scenario first-packet` as `lm_decode`.

Every row of a step reads a slot of `POSITIONS` positions (a voice prompt and its
segment's text, about what a turn's first tokens see). The graphs' logits are compared
with the ordinary step's on the same inputs: on a GPU this is where a capture that went
wrong shows.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..engine.lm_graphs import DecodeGraphs
from ..model.lm import KVPool
from ..model.quantize import reduced_lm
from ..model.speech_model import SpeechModel

POSITIONS = 100


def _now(device: torch.device) -> float:
    """The clock, after the device's queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.inference_mode()
def decode_steps(
    model: SpeechModel,
    dtype: torch.dtype,
    batches: Sequence[int] = (1, 16),
    repeats: int = 5,
    max_len: int = 1024,
) -> dict[str, Any]:
    """Median ms of a decode step of each batch size, ordinary and through the graphs,
    and the largest logit difference between the two."""
    lm, dev = reduced_lm(model.lm, dtype), model.device
    top = max(batches)
    pool = KVPool(lm.cfg, top + 1, max_len, dev, dtype)  # + the graphs' scratch slot
    ids = torch.arange(POSITIONS, device=dev) % 4096
    lm.forward_embeds(lm.embed_speech(ids)[:, 0][None], pool, *_at([0], [0], dev))
    pool.k[:, 1:top] = pool.k[:, :1]  # every slot holds the same past
    pool.v[:, 1:top] = pool.v[:, :1]
    graphs = DecodeGraphs(lm, pool, top, top)
    steps: dict[str, dict[str, float]] = {}
    diff = 0.0
    for b in batches:
        tokens, slots, lengths = list(range(1, b + 1)), list(range(b)), [POSITIONS] * b
        x = lm.embed_speech(torch.tensor(tokens, device=dev))
        at = _at(slots, lengths, dev)
        times: dict[str, list[float]] = {"ordinary": [], "graphs": []}
        for _ in range(repeats + 1):  # the first round not timed
            t0 = _now(dev)
            ordinary = lm.forward_embeds(x, pool, *at).float().cpu()
            t1 = _now(dev)
            graphed = graphs.step(tokens, slots, lengths).float().cpu()
            times["ordinary"].append(t1 - t0)
            times["graphs"].append(_now(dev) - t1)
        diff = max(diff, float((graphed - ordinary).abs().max()))
        steps[str(b)] = {k: round(1000 * statistics.median(v[1:]), 2) for k, v in times.items()}
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "graphs_captured": graphs.captured,
        "step_ms": steps,
        "graphs_logits_max_abs_diff": round(diff, 6),
    }


def _at(slots: list[int], lengths: list[int], dev: torch.device) -> tuple[Tensor, Tensor]:
    """`forward_embeds`'s slots and start positions."""
    return torch.tensor(slots, device=dev), torch.tensor(lengths, device=dev)
