"""FAKE stand-ins for CosyVoice2's `campplus.onnx` and `speech_tokenizer_v2.onnx`.

The released files cannot be downloaded here, so tests use these small random-weight
graphs, built with onnx.helper, with the same interface as the real ones:

- campplus.onnx: input "input" float32 [1, T, 80] (mean-normalised Kaldi fbank) ->
  output "output" float32 [1, 192]. CosyVoice feeds `get_inputs()[0]` only; the name
  "input" and the [1, T, 80] profile are those of CosyVoice's TensorRT conversion
  (runtime/triton_trtllm/model_repo/speaker_embedding/1/model.py, get_spk_trt_kwargs),
  the output [1, 192] from the same file's output buffer.
- speech_tokenizer_v2.onnx: inputs "feats" float32 [1, 128, T] (Whisper log-mel) and
  "feats_length" int32 [1] -> output "indices" [1, ceil(T / 4)] integer tokens in
  0..6560. CosyVoice's frontend passes get_inputs()[0] / [1] with exactly these dtypes
  (cosyvoice/cli/frontend.py, _extract_speech_token); the names are those public C++/Rust
  ports of that frontend pass by name. Ports disagree on the output's integer width
  (int32 or int64), so the frontend accepts either; the fake emits int32.

They compute nothing meaningful: they only depend on their input (so tests can tell
different audio apart) and are deterministic for a given seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SPK_DIM = 192
FBANK_BINS = 80
WHISPER_MELS = 128
SPEECH_CODES = 6561
TOKEN_STRIDE = 4  # 100 Hz mel frames -> 25 Hz tokens
OPSET = 18


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by any onnxruntime >= 1.14
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _const(name: str, value: int, dtype: type[np.integer]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([value], dtype=dtype), name)


def write_fake_campplus(path: Path, seed: int = 0) -> Path:
    """[1, T, 80] -> statistics pooling of x @ W over time, as CAM++ pools: the mean of
    tanh(x @ W) and the log mean square of x @ W, 96 values each -> [1, 192]."""
    half = SPK_DIM // 2
    w = np.random.default_rng(seed).standard_normal((FBANK_BINS, half)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "w"], ["proj"]),
            helper.make_node("Tanh", ["proj"], ["act"]),
            helper.make_node("ReduceMean", ["act", "time"], ["mean"], keepdims=0),
            helper.make_node("Mul", ["proj", "proj"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "time"], ["msq"], keepdims=0),
            helper.make_node("Add", ["msq", "eps"], ["msq_eps"]),
            helper.make_node("Log", ["msq_eps"], ["logmsq"]),
            helper.make_node("Concat", ["mean", "logmsq"], ["output"], axis=1),
        ],
        "fake_campplus",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", FBANK_BINS])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, SPK_DIM])],
        initializer=[
            numpy_helper.from_array(w / np.float32(np.sqrt(FBANK_BINS)), "w"),
            _const("time", 1, np.int64),
            numpy_helper.from_array(np.array(1e-6, dtype=np.float32), "eps"),
        ],
    )
    return _save(graph, path)


def write_fake_speech_tokenizer(path: Path, seed: int = 1) -> Path:
    """Every 4th frame of feats, projected to 6561 logits and argmax'ed; the tokens are cut
    to ceil(feats_length / 4), so the length input matters as in the real model."""
    w = np.random.default_rng(seed).standard_normal((WHISPER_MELS, SPEECH_CODES))
    graph = helper.make_graph(
        [
            helper.make_node("Slice", ["feats", "zero", "big", "two", "stride"], ["every4"]),
            helper.make_node("Transpose", ["every4"], ["frames"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["frames", "w"], ["logits"]),
            helper.make_node("ArgMax", ["logits"], ["ids64"], axis=2, keepdims=0),
            helper.make_node("Cast", ["ids64"], ["ids"], to=TensorProto.INT32),
            # n = (feats_length + 3) / 4, then indices = ids[:, :n]
            helper.make_node("Add", ["feats_length", "three"], ["len3"]),
            helper.make_node("Div", ["len3", "four"], ["n32"]),
            helper.make_node("Cast", ["n32"], ["n"], to=TensorProto.INT64),
            helper.make_node("Slice", ["ids", "zero", "n", "one"], ["indices"]),
        ],
        "fake_speech_tokenizer_v2",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, WHISPER_MELS, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("indices", TensorProto.INT32, [1, "N"])],
        initializer=[
            numpy_helper.from_array(w.astype(np.float32), "w"),
            _const("zero", 0, np.int64),
            _const("big", 2**62, np.int64),
            _const("one", 1, np.int64),
            _const("two", 2, np.int64),
            _const("stride", TOKEN_STRIDE, np.int64),
            _const("three", TOKEN_STRIDE - 1, np.int32),
            _const("four", TOKEN_STRIDE, np.int32),
        ],
    )
    return _save(graph, path)
