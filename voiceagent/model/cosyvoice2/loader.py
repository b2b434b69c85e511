"""Load a released CosyVoice2 directory as it is downloaded.

cosyvoice2.yaml            hyper-parameters (read as data; never executed)
llm.pt                     Qwen2 LM + speech embedding/head  -> model.lm.SpeechLM
flow.pt                    causal flow matching              -> cosyvoice2.flow.CosyFlow
hift.pt                    HiFT vocoder                      -> cosyvoice2.hift.HiFT
CosyVoice-BlankEN/         Qwen2 config.json + tokenizer files
spk2info.pt                stored voices (may be empty)
campplus.onnx, speech_tokenizer_v2.onnx
                           prompt frontends, used by `voiceagent voice add` and
                           `POST /v1/voices` (optional: without them no new voices)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..contract import Voice
from ..lm import SpeechLM
from ..speech_model import SpeechModel
from ..weights import CheckpointError, load_strict, read_torch
from .flow import CosyFlow, FlowConfig
from .hift import HiFT, HiFTConfig, load_hift_state
from .lm_config import read_lm_setup
from .text_tokenizer import QwenTextTokenizer
from .yaml_config import params, read_yaml

log = logging.getLogger(__name__)

REQUIRED = ("cosyvoice2.yaml", "llm.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN/config.json")
FRONTEND_FILES = ("campplus.onnx", "speech_tokenizer_v2.onnx")  # speaker vector, speech tokens
QWEN_DIR = "CosyVoice-BlankEN"


ModelDirError = CheckpointError  # a file is missing, unreadable or does not fit


def is_cosyvoice2_dir(directory: Path) -> bool:
    return (directory / "cosyvoice2.yaml").is_file()


def flow_config(yaml: dict[str, Any]) -> FlowConfig:
    flow = params(yaml.get("flow"), "flow")
    enc = params(flow.get("encoder"), "flow.encoder")
    dec = params(flow.get("decoder"), "flow.decoder")
    est = params(dec.get("estimator"), "flow.decoder.estimator")
    cfm = (dec.get("cfm_params") or {}).get("content", {})
    channels = est.get("channels", [256])
    if len(channels) != 1:
        raise ValueError(f"flow.decoder.estimator.channels must hold one width, not {channels}")
    return FlowConfig(
        vocab_size=int(flow.get("vocab_size", 6561)),
        encoder_dim=int(enc.get("output_size", 512)),
        encoder_heads=int(enc.get("attention_heads", 8)),
        encoder_linear_units=int(enc.get("linear_units", 2048)),
        encoder_blocks=int(enc.get("num_blocks", 6)),
        pre_lookahead=int(flow.get("pre_lookahead_len", 3)),
        token_mel_ratio=int(flow.get("token_mel_ratio", 2)),
        mel_bins=int(flow.get("output_size", 80)),
        spk_embed_dim=int(flow.get("spk_embed_dim", 192)),
        decoder_channels=int(channels[0]),
        decoder_heads=int(est.get("num_heads", 8)),
        attention_head_dim=int(est.get("attention_head_dim", 64)),
        decoder_blocks=int(est.get("n_blocks", 4)),
        mid_blocks=int(est.get("num_mid_blocks", 12)),
        cfg_rate=float(cfm.get("inference_cfg_rate", 0.7)),
        start_t=float(cfm.get("start_t", 0.0)),  # ours (FlowConfig.start_t)
        n_timesteps=int(cfm.get("n_timesteps", 10)),  # ours; the released code passes 10
        static_chunk_size=int(enc.get("static_chunk_size", 25)),
    )


HEAD = "llm.model.lm_head.weight"
EMBED = "llm.model.model.embed_tokens.weight"


def _load_lm(lm: SpeechLM, path: Path, tied: bool) -> None:
    """With `tie_word_embeddings` (the released Qwen config) the text embedding and the
    LM head are one tensor, as in the reference: it builds Qwen2 with the two tied and
    loads `llm.pt` into it with `load_state_dict`, which copies the embedding first and
    the head last, so a file holding two different tensors leaves the head's in both.
    A file may also hold the embedding alone."""
    state = dict(read_torch(path))
    if tied:
        shared = state.get(HEAD, state.get(EMBED, torch.empty(0)))
        state[HEAD] = state[EMBED] = shared
    load_strict(lm, state, path)
    if tied:  # one tensor in memory too (136 M values in the 0.5B model)
        lm.llm.model.lm_head.weight = lm.llm.model.model.embed_tokens.weight


def _voices(path: Path, tokenizer: QwenTextTokenizer) -> dict[str, Voice]:
    """Voices in `spk2info.pt`: CosyVoice2's zero-shot entries (a full prompt) or the
    older SFT entries (a speaker vector only)."""
    if not path.is_file():
        return {}
    table = read_torch(path)
    voices = {}
    for name, info in table.items():
        try:
            emb = info.get("flow_embedding", info.get("embedding"))
            mel = info.get("prompt_speech_feat")
            voices[str(name)] = Voice(
                name=str(name),
                prompt_text_ids=tuple(
                    int(t) for t in info.get("prompt_text", torch.zeros(0)).flatten()
                ),
                prompt_tokens=tuple(
                    int(t) for t in info.get("flow_prompt_speech_token", torch.zeros(0)).flatten()
                ),
                embedding=emb.float().flatten(),
                prompt_mel=None if mel is None else mel.float().reshape(-1, mel.shape[-1]),
            )
        except Exception as exc:
            raise ModelDirError(f"{path}: entry {name!r} is not a voice ({exc})") from exc
    return voices


def load_cosyvoice2(directory: Path, device: str = "cpu") -> SpeechModel:
    for name in REQUIRED:
        if not (directory / name).is_file():
            raise ModelDirError(f"{directory / name}: required model file is missing")
    try:
        yaml = read_yaml(directory / "cosyvoice2.yaml")
        setup = read_lm_setup(yaml, directory / QWEN_DIR)
        fcfg = flow_config(yaml)
        hcfg = HiFTConfig.from_params(params(yaml.get("hift"), "hift"))
        tokenizer = QwenTextTokenizer(directory / QWEN_DIR)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise ModelDirError(f"{directory}: {exc}") from exc

    lm = SpeechLM(setup.config).eval()
    _load_lm(lm, directory / "llm.pt", setup.tie_word_embeddings)
    flow = CosyFlow(fcfg).eval()
    hift = HiFT(hcfg).eval()
    try:
        load_flow_state(flow, read_torch(directory / "flow.pt"))
    except ValueError as exc:
        raise ModelDirError(f"{directory / 'flow.pt'}: {exc}") from exc
    try:
        load_hift_state(hift, read_torch(directory / "hift.pt"))
    except ValueError as exc:
        raise ModelDirError(f"{directory / 'hift.pt'}: {exc}") from exc
    random = (directory / "RANDOM_WEIGHTS").is_file()
    model = SpeechModel(
        name=directory.name,
        random_weights=random,
        lm=lm,
        flow=flow,
        vocoder=hift,
        voices=_voices(directory / "spk2info.pt", tokenizer),
        tokenizer=tokenizer,
        sampling=setup.sampling,
        pre_lookahead=fcfg.pre_lookahead,
        mel_bins=fcfg.mel_bins,
        token_ratio=(
            setup.config.min_tokens_per_text_token,
            setup.config.max_tokens_per_text_token,
        ),
        spk_dim=fcfg.spk_embed_dim,
        spec=yaml,
        frontend_dir=(
            directory if all((directory / f).is_file() for f in FRONTEND_FILES) else None
        ),
    )
    for module in (lm, flow, hift):
        module.to(device)
    log.info("loaded CosyVoice2 from %s (%d stored voices)", directory, len(model.voices))
    return model


def load_flow_state(module: nn.Module, state_dict: Mapping[str, Tensor]) -> None:
    """Load a released flow state dict into `module` (e.g. a CosyFlow), strictly.

    Every key must be present with the model's shape, and no key may be left over; the
    ValueError names each offender. The CosyVoice2 flow has no weight-normed layer, so
    `weight_g`/`weight_v` or `parametrizations.weight.original*` keys are foreign here.
    """
    expected = module.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    wrong = [
        f"{k} {tuple(v.shape)} (model {tuple(expected[k].shape)})"
        for k, v in state_dict.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    problems = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
        if keys:
            shown = ", ".join(keys[:20]) + (f", ... ({len(keys)} in all)" if len(keys) > 20 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise ValueError(
            "flow state dict does not match the CosyVoice2 flow: " + "; ".join(problems)
        )
    module.load_state_dict(dict(state_dict), strict=True)
