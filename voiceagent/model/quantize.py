"""Reduced-precision copies of model parts, used where the measured error is stated.

`reduced_flow(flow, dtype)`: the flow in bfloat16 (weights, activations, caches).

`int8_layers(lm)`: the LM's decoder layers, with every Linear dynamically quantized to
int8 (per-tensor activation scale computed per call, int8 weights; fbgemm/oneDNN with
VNNI on x86), for prompt prefills and/or decode steps (`EmbeddedLM(int8_prefill=...,
int8_decode=...)`). On the 2-core CPU measured (full size, one thread) a prefill of 78
positions took 210 ms instead of 600 and a decode step 50 ms instead of 120 (a step
reads every weight once: a quarter of the bytes). The speech head stays float32.
`voiceagent bench --scenario first-packet` reports how far the logits move.

This uses `torch.ao.quantization.quantize_dynamic`, deprecated upstream in favour of
torchao but present in the torch versions voiceagent supports (2.11-2.13); where it is
missing, `int8_layers` says so and returns None.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import cast

import torch
from torch import nn

from .contract import FlowStage
from .lm import DecoderLayer, SpeechLM

log = logging.getLogger(__name__)


_made: dict[int, tuple[SpeechLM, list[DecoderLayer]]] = {}
_flows: dict[tuple[int, torch.dtype], tuple[FlowStage, FlowStage]] = {}


def reduced_flow(flow: FlowStage, dtype: torch.dtype) -> FlowStage:
    """A copy of `flow` in `dtype` (weights; its activations and streaming caches follow
    them), made once per flow and dtype. torch.bfloat16 halves the per-turn cache."""
    made = _flows.get((id(flow), dtype))
    if made is not None and made[0] is flow:
        return made[1]
    copy_ = copy.deepcopy(flow).to(dtype)
    _flows[(id(flow), dtype)] = (flow, copy_)
    return copy_


def int8_layers(lm: SpeechLM) -> list[DecoderLayer] | None:
    """int8 copies of `lm`'s decoder layers, made once per LM (engines share them), for
    `SpeechLM.forward_embeds(layers=...)`; None if this torch cannot make them or the LM
    is not on the CPU (the kernels are CPU ones)."""
    made = _made.get(id(lm))
    if made is not None and made[0] is lm:
        return made[1]
    if lm.llm_decoder.weight.device.type != "cpu":
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.ao.quantization import quantize_dynamic

            layers = [
                cast(DecoderLayer, quantize_dynamic(copy.deepcopy(layer), {nn.Linear}))
                for layer in lm.llm.model.model.layers
            ]
    except (ImportError, RuntimeError, AttributeError) as exc:
        log.warning("int8 LM layers unavailable (%s): prefills stay float32", exc)
        return None
    _made[id(lm)] = (lm, layers)
    return layers
