"""Write a CosyVoice2-layout model directory with random weights.

For tests and benchmarks only: the weights are random, so the audio is noise. The
layout, file names, key names and the way hyper-parameters are stored are those of a
released CosyVoice2 directory, so the real loader is what reads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def _byte_unicode() -> dict[int, str]:
    """GPT-2 style byte -> printable character map used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_text_tokenizer(directory: Path, merges: int = 64) -> int:
    """A small byte-level BPE vocabulary in Qwen2's file format; returns its size
    (without special tokens)."""
    # Merge common English letter pairs so the BPE path is exercised.
    common = "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng"
    return write_bpe_files(directory, [(p[0], p[1]) for p in common.split()[:merges]])


def write_bpe_files(directory: Path, pairs: Sequence[tuple[str, str]]) -> int:
    """vocab.json (the 256 bytes, then one token per merge), merges.txt and
    tokenizer_config.json (Qwen2's three specials after them); returns the size
    without specials."""
    directory.mkdir(parents=True, exist_ok=True)
    chars = _byte_unicode()
    vocab = {chars[b]: b for b in range(256)}
    for a, b in pairs:
        vocab.setdefault(a + b, len(vocab))
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in pairs), encoding="utf-8"
    )
    n = len(vocab)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    config = {
        "added_tokens_decoder": {
            str(n + i): {"content": t, "special": True} for i, t in enumerate(specials)
        },
        "eos_token": "<|endoftext|>",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return n


def yaml_text(s: dict[str, int]) -> str:
    """A `cosyvoice2.yaml` in the released file's shape (hyperpyyaml tags included), with
    the sizes in `s` (see SIZES)."""
    return f"""# random-weight CosyVoice2 layout written by voiceagent (tests and benchmarks only)
__set_seed1: !apply:random.seed [1986]
sample_rate: 24000
llm_input_size: {s["lm_hidden"]}
llm_output_size: {s["lm_hidden"]}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: {s["flow_dim"]}
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {s["flow_dim"]}
        attention_heads: {s["flow_heads"]}
        linear_units: {s["flow_units"]}
        num_blocks: {s["flow_blocks"]}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {s["flow_dim"]}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [{s["dec_channels"]}]
            dropout: 0.0
            attention_head_dim: {s["dec_head_dim"]}
            n_blocks: {s["dec_blocks"]}
            num_mid_blocks: {s["dec_mid_blocks"]}
            num_heads: {s["dec_heads"]}
            act_fn: 'gelu'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: {s["hift_channels"]}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {s["hift_channels"]}

get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
"""


# The released sizes, and a scaled-down set for CPU tests.
SIZES: dict[str, dict[str, int]] = {
    "full": dict(
        lm_hidden=896,
        lm_layers=24,
        lm_heads=14,
        lm_kv_heads=2,
        lm_intermediate=4864,
        text_vocab=151936,
        flow_dim=512,
        flow_heads=8,
        flow_units=2048,
        flow_blocks=6,
        dec_channels=256,
        dec_head_dim=64,
        dec_blocks=4,
        dec_mid_blocks=12,
        dec_heads=8,
        hift_channels=512,
    ),
    "small": dict(
        lm_hidden=64,
        lm_layers=2,
        lm_heads=4,
        lm_kv_heads=2,
        lm_intermediate=128,
        text_vocab=0,
        flow_dim=64,
        flow_heads=2,
        flow_units=128,
        flow_blocks=2,
        dec_channels=64,
        dec_head_dim=16,
        dec_blocks=1,
        dec_mid_blocks=2,
        dec_heads=2,
        hift_channels=32,
    ),
}


def qwen_config(s: dict[str, int], vocab: int) -> dict[str, object]:
    """`CosyVoice-BlankEN/config.json` with the backbone sizes in `s`."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": s["lm_hidden"],
        "num_hidden_layers": s["lm_layers"],
        "num_attention_heads": s["lm_heads"],
        "num_key_value_heads": s["lm_kv_heads"],
        "intermediate_size": s["lm_intermediate"],
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }


def write_random_cosyvoice2(directory: Path, size: str = "small", seed: int = 0) -> Path:
    """A complete CosyVoice2 directory with random weights (no ONNX frontends), marked
    with a `RANDOM_WEIGHTS` file so servers say that its audio is noise."""
    import torch

    from ..lm import SpeechLM
    from .flow import CosyFlow
    from .hift import HiFT, HiFTConfig, released_state_dict
    from .lm_config import read_lm_setup
    from .loader import QWEN_DIR, flow_config
    from .text_tokenizer import COSYVOICE2_SPECIALS
    from .yaml_config import params, read_yaml

    s = SIZES[size]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cosyvoice2.yaml").write_text(yaml_text(s))
    qwen = directory / QWEN_DIR
    n = write_text_tokenizer(qwen)
    vocab = s["text_vocab"] or n + len(COSYVOICE2_SPECIALS)
    (qwen / "config.json").write_text(json.dumps(qwen_config(s, vocab), indent=2))
    yaml = read_yaml(directory / "cosyvoice2.yaml")

    torch.manual_seed(seed)
    lm = SpeechLM(read_lm_setup(yaml, qwen).config)
    # tied, as the released file's (its Qwen config says tie_word_embeddings)
    lm.llm.model.lm_head.weight = lm.llm.model.model.embed_tokens.weight
    torch.save(lm.state_dict(), directory / "llm.pt")
    del lm
    fcfg = flow_config(yaml)
    torch.save(CosyFlow(fcfg).state_dict(), directory / "flow.pt")
    hift = HiFT(HiFTConfig.from_params(params(yaml["hift"], "hift")))
    torch.save(released_state_dict(hift), directory / "hift.pt")

    gen = torch.Generator().manual_seed(seed + 1)
    spk2info = {}
    for i, name in enumerate(("agent", "narrator")):
        tokens = torch.randint(0, 6561, (1, 50 + 10 * i), generator=gen)
        spk2info[name] = {
            "prompt_text": torch.randint(0, n, (1, 12), generator=gen),
            "llm_prompt_speech_token": tokens,
            "flow_prompt_speech_token": tokens,
            "prompt_speech_feat": torch.randn(1, 2 * tokens.shape[1], 80, generator=gen) - 6,
            "llm_embedding": torch.randn(1, 192, generator=gen),
            "flow_embedding": torch.randn(1, 192, generator=gen),
        }
    torch.save(spk2info, directory / "spk2info.pt")
    (directory / "RANDOM_WEIGHTS").write_text(
        "These weights are random (written by voiceagent for tests and benchmarks).\n"
    )
    return directory
