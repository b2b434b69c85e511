"""CosyVoice2's LM hyper-parameters: the Qwen2 backbone from `CosyVoice-BlankEN/config.json`
and the speech head sizes and sampling defaults from `cosyvoice2.yaml`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import SPEECH_CODES
from ..lm import LMConfig
from ..sampling import SamplingParams
from .yaml_config import params

# Length bounds of the reference decoder, in speech tokens per text token.
MIN_TOKEN_TEXT_RATIO = 2.0
MAX_TOKEN_TEXT_RATIO = 20.0


@dataclass(frozen=True)
class LMSetup:
    config: LMConfig
    sampling: SamplingParams
    tie_word_embeddings: bool


def read_lm_setup(yaml: dict[str, Any], qwen_dir: Path) -> LMSetup:
    llm = params(yaml.get("llm"), "llm")
    path = qwen_dir / "config.json"
    try:
        qwen = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the Qwen2 config ({exc})") from exc
    if llm.get("speech_token_size", SPEECH_CODES) != SPEECH_CODES:
        raise ValueError(f"llm.speech_token_size must be {SPEECH_CODES} for CosyVoice2")
    try:
        config = LMConfig(
            text_vocab=int(qwen["vocab_size"]),
            hidden=int(qwen["hidden_size"]),
            layers=int(qwen["num_hidden_layers"]),
            heads=int(qwen["num_attention_heads"]),
            kv_heads=int(qwen.get("num_key_value_heads", qwen["num_attention_heads"])),
            intermediate=int(qwen["intermediate_size"]),
            rope_theta=float(qwen.get("rope_theta", 10000.0)),
            rms_eps=float(qwen.get("rms_norm_eps", 1e-6)),
            max_positions=int(qwen.get("max_position_embeddings", 32768)),
            min_tokens_per_text_token=MIN_TOKEN_TEXT_RATIO,
            max_tokens_per_text_token=MAX_TOKEN_TEXT_RATIO,
        )
    except KeyError as exc:
        raise ValueError(f"{path}: missing {exc}") from exc
    size = llm.get("llm_input_size", config.hidden)
    if size != config.hidden:
        raise ValueError(f"llm_input_size {size} != Qwen2 hidden_size {config.hidden}")
    sampling = llm.get("sampling") or {}
    return LMSetup(
        config=config,
        sampling=SamplingParams(
            # a key of ours (the reference's `ras_sampling` takes no temperature)
            temperature=float(yaml.get("sampling_temperature", 1.0)),
            top_k=int(sampling.get("top_k", 25)),
            top_p=float(sampling.get("top_p", 0.8)),
            ras_window=int(sampling.get("win_size", 10)),
            ras_tau=float(sampling.get("tau_r", 0.1)),
        ),
        tie_word_embeddings=bool(qwen.get("tie_word_embeddings", False)),
    )
