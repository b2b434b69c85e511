"""Reading a released CosyVoice2 directory's own files: the yaml, the Qwen2 config and
the text tokenizer, without executing anything named in the yaml."""

from __future__ import annotations

import json

import pytest

from voiceagent.model.cosyvoice2.lm_config import read_lm_setup
from voiceagent.model.cosyvoice2.random_checkpoint import (
    SIZES,
    qwen_config,
    write_text_tokenizer,
    yaml_text,
)
from voiceagent.model.cosyvoice2.text_tokenizer import COSYVOICE2_SPECIALS, QwenTextTokenizer
from voiceagent.model.cosyvoice2.yaml_config import TAG_KEY, read_yaml


def test_yaml_tags_stay_inert_and_refs_resolve(tmp_path):
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(yaml_text(SIZES["full"]))
    y = read_yaml(path)
    assert y["llm"][TAG_KEY] == "!new:cosyvoice.llm.llm.Qwen2LM"
    assert y["llm"]["llm_input_size"] == 896  # !ref <llm_input_size>
    est = y["flow"]["decoder"]["estimator"]
    assert est["static_chunk_size"] == 50  # !ref <chunk_size> * <token_mel_ratio>
    assert y["hift"]["istft_params"] == {"n_fft": 16, "hop_len": 4}
    assert y["__set_seed1"] == {TAG_KEY: "!apply:random.seed", "args": [1986]}


def test_yaml_that_would_run_code_is_only_data(tmp_path):
    path = tmp_path / "evil.yaml"
    marker = tmp_path / "ran"
    path.write_text(
        f"x: !apply:os.system ['touch {marker}']\ny: !!python/object/apply:os.getcwd []\n"
    )
    with pytest.raises(ValueError):  # python/* tags are refused outright by the safe loader
        read_yaml(path)
    path.write_text(f"x: !apply:os.system ['touch {marker}']\n")
    assert read_yaml(path)["x"]["args"] == [f"touch {marker}"]
    assert not marker.exists()


def test_bad_refs_are_clear_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: !ref <nowhere>\n")
    with pytest.raises(ValueError, match="nowhere"):
        read_yaml(path)
    path.write_text("a: 2\nb: !ref <a> ** 99\n")
    with pytest.raises(ValueError, match="unsupported"):
        read_yaml(path)


def test_lm_setup_comes_from_qwen_config_and_yaml(tmp_path):
    (tmp_path / "cosyvoice2.yaml").write_text(yaml_text(SIZES["full"]))
    qwen = tmp_path / "CosyVoice-BlankEN"
    qwen.mkdir()
    (qwen / "config.json").write_text(json.dumps(qwen_config(SIZES["full"], 151936)))
    setup = read_lm_setup(read_yaml(tmp_path / "cosyvoice2.yaml"), qwen)
    cfg = setup.config
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads) == (896, 24, 14, 2)
    assert (cfg.intermediate, cfg.text_vocab, cfg.rope_theta) == (4864, 151936, 1e6)
    assert (setup.sampling.top_k, setup.sampling.top_p, setup.sampling.ras_window) == (25, 0.8, 10)
    assert setup.tie_word_embeddings


def test_qwen_tokenizer_from_vocab_and_merges_with_cosyvoice2_specials(tmp_path):
    n = write_text_tokenizer(tmp_path)
    tok = QwenTextTokenizer(tmp_path)
    # Configured specials keep their ids; CosyVoice2's additions follow in order.
    assert tok.token_id("<|endoftext|>") == n
    assert tok.token_id("<|endofprompt|>") == n + 3
    assert tok.vocab_size == n + len(COSYVOICE2_SPECIALS)
    text = "Hello there, 你好! The end."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges were applied ("th", "he", ...)
    assert tok.encode("a[breath]b") == [
        *tok.encode("a"),
        tok.token_id("[breath]"),
        *tok.encode("b"),
    ]


def test_missing_tokenizer_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"vocab\.json"):
        QwenTextTokenizer(tmp_path)
