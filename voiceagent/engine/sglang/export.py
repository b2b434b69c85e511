"""`voiceagent export-sglang`: the speech-token LM as a plain Qwen2ForCausalLM.

Stock SGLang serves a Qwen2 checkpoint and knows nothing of speech tokens, so the export
merges vocabularies:

    ids [0, T)                  the text vocabulary (T = the Qwen2 vocab_size)
    ids [T, T + 6564)           speech codes 0..6560 and the stop tokens 6561..6563
    ids T + 6564, T + 6565      CosyVoice2's sos and task-id rows (`llm_embedding`)
    up to a multiple of 64      padding rows (zero)

`embed_tokens` stacks the text, speech and special rows, so a prompt is plain
`input_ids`. `lm_head` has the speech decoder's weights on the speech rows and zeros
elsewhere. SGLang's Qwen2 head has no bias (it drops one silently), so the decoder bias
travels in each request's `logit_bias`: bias + SPEECH_LIFT on every speech id. The lift
makes every non-speech id (logit 0) lose by e^-SPEECH_LIFT, which confines sampling to
speech tokens without a 150k-entry ban list. `voiceagent_sglang.json` records the
offsets and the bias for the client.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...model.contract import STOP_TOKENS
from ...model.speech_model import SpeechModel

SPEECH_LIFT = 1000.0
PAD_TO = 64
META = "voiceagent_sglang.json"


def export_sglang(model: SpeechModel, out: Path) -> dict[str, Any]:
    lm = model.lm
    cfg = lm.cfg
    text = lm.llm.model.model.embed_tokens.weight.detach().float().cpu()
    speech = lm.speech_embedding.weight.detach().float().cpu()
    special = lm.llm_embedding.weight.detach().float().cpu()
    t, s = text.shape[0], speech.shape[0]
    used = t + s + special.shape[0]
    vocab = -(-used // PAD_TO) * PAD_TO
    embed = torch.zeros(vocab, cfg.hidden)
    embed[:t], embed[t : t + s], embed[t + s : used] = text, speech, special
    head = torch.zeros(vocab, cfg.hidden)
    head[t : t + s] = lm.llm_decoder.weight.detach().float().cpu()

    state: dict[str, torch.Tensor] = {}
    for key, value in lm.llm.model.state_dict().items():  # `model.*`, `lm_head.weight`
        state[key] = value.detach().float().cpu().contiguous()
    state["model.embed_tokens.weight"] = embed
    state["lm_head.weight"] = head

    out.mkdir(parents=True, exist_ok=True)
    torch.save(state, out / "pytorch_model.bin")
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.intermediate,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "max_position_embeddings": cfg.max_positions,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "torch_dtype": "float32",
        "bos_token_id": t + s,
        "eos_token_id": [t + tok for tok in STOP_TOKENS],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"do_sample": True, "top_k": 25, "top_p": 0.8, "temperature": 1.0}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    meta = {
        "model": model.name,
        "text_vocab": t,
        "speech_offset": t,
        "speech_vocab": s,
        "sos_id": t + s,
        "task_id": t + s + 1,
        "stop_ids": [t + tok for tok in STOP_TOKENS],
        "speech_lift": SPEECH_LIFT,
        "decoder_bias": lm.llm_decoder.bias.detach().float().cpu().tolist(),
    }
    (out / META).write_text(json.dumps(meta))
    return meta


def logit_bias(meta: dict[str, Any]) -> dict[str, float]:
    """The per-request `logit_bias` carrying the decoder bias and the speech lift."""
    lift, off = float(meta["speech_lift"]), int(meta["speech_offset"])
    return {str(off + i): b + lift for i, b in enumerate(meta["decoder_bias"])}


def prompt_ids(meta: dict[str, Any], text_ids: list[int], speech_ids: list[int]) -> list[int]:
    """`[sos, text, task_id, prompt speech]` in the merged vocabulary."""
    off = int(meta["speech_offset"])
    return [meta["sos_id"], *text_ids, meta["task_id"], *(off + t for t in speech_ids)]
