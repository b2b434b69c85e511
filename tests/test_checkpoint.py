"""The tiny model on disk: written, loaded back identically; bad directories fail clearly."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

from voiceagent.model import checkpoint
from voiceagent.model.checkpoint import CheckpointError
from voiceagent.model.lm import LMConfig
from voiceagent.model.tiny import checkpoint as tiny
from voiceagent.model.tiny.config import ModelConfig


def test_saved_model_loads_with_every_key_and_the_same_output(tmp_path, tiny_model):
    original = tiny.build_random(seed=7)
    tiny.save(original, tmp_path)
    loaded = checkpoint.load(tmp_path)
    for a, b in (
        (original.lm, loaded.lm),
        (original.flow, loaded.flow),
        (original.vocoder, loaded.vocoder),
    ):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert loaded.voices.keys() == original.voices.keys()
    tokens = list(range(100, 140))
    voice = "narrator"
    np.testing.assert_array_equal(
        original.synthesize_offline(tokens, original.voices[voice]),
        loaded.synthesize_offline(tokens, loaded.voices[voice]),
    )


def test_lm_keys_follow_the_cosyvoice2_layout(tiny_model):
    keys = set(tiny_model.lm.state_dict())
    for key in (
        "llm.model.model.embed_tokens.weight",
        "llm.model.model.layers.0.self_attn.q_proj.bias",
        "llm.model.model.layers.0.mlp.gate_proj.weight",
        "llm.model.model.norm.weight",
        "llm.model.lm_head.weight",
        "llm_embedding.weight",
        "speech_embedding.weight",
        "llm_decoder.bias",
    ):
        assert key in keys


@pytest.mark.parametrize("missing", tiny.FILES)
def test_a_missing_file_is_named(tmp_path, tiny_dir, missing):
    shutil.copytree(tiny_dir, tmp_path / "m")
    (tmp_path / "m" / missing).unlink()
    with pytest.raises(CheckpointError, match=re.escape(missing)):
        checkpoint.load(tmp_path / "m")


def test_a_corrupted_weight_file_is_named(tmp_path, tiny_dir):
    shutil.copytree(tiny_dir, tmp_path / "m")
    (tmp_path / "m" / "flow.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=re.escape("flow.pt")):
        checkpoint.load(tmp_path / "m")


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path, tiny_dir):
    shutil.copytree(tiny_dir, tmp_path / "m")
    bigger = ModelConfig(lm=LMConfig(hidden=96, heads=4, kv_heads=2))
    (tmp_path / "m" / "config.json").write_text(json.dumps(bigger.to_dict()))
    with pytest.raises(CheckpointError, match=re.escape("llm.pt")):
        checkpoint.load(tmp_path / "m")


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "nowhere")
