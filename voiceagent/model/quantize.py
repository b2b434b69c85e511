"""Reduced-precision copies of model parts, used where the measured error is stated.

`reduced_flow(flow, precision)`: the flow in bfloat16 (weights, activations, caches), or
with its estimator in int8. The estimator runs 10 times a chunk, once per solver step,
on the few frames of a chunk, where each call costs more than its arithmetic; its int8
copy is first made of Linear layers only (`Estimator.fast_copy`: convolutions as matrix
products, q/k/v as one projection), then each is dynamically quantized but those of
its first ResNet block (FLOAT_ESTIMATOR_PARTS). On the 2-core CPU, full size, one
thread, a 4-token first chunk took about 1.3 s against 1.5 with only the Linear layers
in int8 and 1.9 in float32 (interleaved runs, medians of 5); the streamed mel stays
within 0.08 log-mel of float32's (1.8 % of its spread; `bench --scenario first-packet`
reports it as `flow_precision_error`). Its attention caches are kept in bfloat16
(`FlowStage.cache_in`): half the per-turn bytes (9.2 -> 4.6 MB per token at full size).
Alone (float32 weights) they move the mel by at most 0.0019; with the int8 layers the
first-packet bench's optimized error went from 0.084 to 0.113. A 20 s turn's later
25-token chunks took 1.8-2.0 s instead of 2.2-2.4 (one run: the past is read in half
the bytes).

`reduced_lm(lm, dtype)`: the LM in bfloat16 (weights, activations and the KV slots the
engine then allocates), for a GPU: half the bytes a decode step reads.

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
from typing import Any, Literal, cast

import torch
from torch import nn

from .contract import FlowStage
from .lm import DecoderLayer, SpeechLM

log = logging.getLogger(__name__)


_made: dict[int, tuple[SpeechLM, list[DecoderLayer]]] = {}
_lms: dict[tuple[int, torch.dtype], tuple[SpeechLM, SpeechLM]] = {}
_flows: dict[tuple[int, str], tuple[FlowStage, FlowStage]] = {}

FlowPrecision = Literal["float32", "bfloat16", "int8"]


def reduced_flow(flow: FlowStage, precision: FlowPrecision) -> FlowStage:
    """A copy of `flow` at `precision`, made once per flow and precision: "bfloat16"
    (weights, activations and streaming caches: half the per-turn cache) or "int8" (the
    estimator's Linear layers, and its attention caches in bfloat16, `cache_in`; CPU
    only, else `flow` itself). "float32": `flow`."""
    if precision == "float32":
        return flow
    made = _flows.get((id(flow), precision))
    if made is not None and made[0] is flow:
        return made[1]
    if precision == "bfloat16":
        copy_ = copy.deepcopy(flow).to(torch.bfloat16)
    else:
        estimator = getattr(flow, "estimator", None)
        quantized = None
        if isinstance(estimator, nn.Module) and _device(flow) == "cpu":  # CPU kernels
            fast = getattr(estimator, "fast_copy", None)  # CosyVoice2's: all Linear layers
            quantized = _int8_linears(fast() if fast else estimator, FLOAT_ESTIMATOR_PARTS)
        if quantized is None:
            log.warning("int8 flow unavailable here: the flow stays float32")
            return flow
        copy_ = copy.deepcopy(flow)
        cast(Any, copy_).decoder.estimator = quantized
        copy_ = copy_.cache_in(torch.bfloat16)
    _flows[(id(flow), precision)] = (flow, copy_)
    return copy_


def _device(module: nn.Module) -> str:
    return next(module.parameters()).device.type


# The estimator's first ResNet block stays float32 in the int8 flow: it reads [x_t, mu,
# speaker, prompt mel] side by side, channels of unlike scales that one activation scale
# per call (dynamic quantization) reads coarsely. Measured on the small random model's
# stream: mel error 0.10 with it in int8, 0.05 without; full size 0.072 and 0.062.
FLOAT_ESTIMATOR_PARTS = ("down_blocks.0.0.",)


def _int8_linears(module: nn.Module, keep_float: tuple[str, ...] = ()) -> nn.Module | None:
    """A copy of `module` with every Linear dynamically quantized to int8 but those whose
    names start with one of `keep_float`; None if this torch cannot make one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

            names = [
                name
                for name, m in module.named_modules()
                if type(m) is nn.Linear and not name.startswith(keep_float)
            ]
            spec = dict.fromkeys(names, default_dynamic_qconfig)
            return cast(nn.Module, quantize_dynamic(copy.deepcopy(module), spec))
    except (ImportError, RuntimeError, AttributeError) as exc:
        log.warning("int8 layers unavailable (%s)", exc)
        return None


def reduced_lm(lm: SpeechLM, dtype: torch.dtype) -> SpeechLM:
    """A copy of `lm` in `dtype`, made once per LM and type (engines share it); `lm`
    itself for its own type. RoPE's frequencies stay float32 (`SpeechLM._rope`)."""
    if dtype == lm.llm_decoder.weight.dtype:
        return lm
    made = _lms.get((id(lm), dtype))
    if made is not None and made[0] is lm:
        return made[1]
    copy_ = copy.deepcopy(lm).to(dtype)
    copy_.inv_freq = lm.inv_freq.clone()
    _lms[(id(lm), dtype)] = (lm, copy_)
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
    quantized = [_int8_linears(layer) for layer in lm.llm.model.model.layers]
    if any(q is None for q in quantized):
        log.warning("int8 LM layers unavailable: prefills stay float32")
        return None
    layers = [cast(DecoderLayer, q) for q in quantized]
    _made[id(lm)] = (lm, layers)
    return layers
