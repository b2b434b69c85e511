"""The tiny random-weight model on disk and in memory: config, three stages, voices,
byte tokenizer; built, saved, loaded, and cached once under ~/.cache/voiceagent.

Directory layout (file names as in a CosyVoice2 release, so tools find what they expect):

    config.json   hyper-parameters (ModelConfig)
    llm.pt        SpeechLM state dict
    flow.pt       FlowModel state dict
    hift.pt       Vocoder state dict
    spk2info.pt   {voice name: {"prompt_text" (ids), "speech_token", "embedding"}}
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from ...text.tokenizer import ByteTokenizer
from ..contract import SPEECH_CODES, Voice
from ..lm import SpeechLM
from ..speech_model import SpeechModel
from ..weights import CheckpointError, load_strict, read_torch
from .config import ModelConfig
from .flow import FlowModel
from .vocoder import Vocoder

log = logging.getLogger(__name__)

FILES = ("config.json", "llm.pt", "flow.pt", "hift.pt", "spk2info.pt")
BUILTIN_VOICES = ("agent", "narrator", "supervisor")


def build_random(config: ModelConfig | None = None, seed: int = 0) -> SpeechModel:
    """A model with random weights (the `tiny` configuration unless told otherwise)."""
    config = config or ModelConfig()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    voices = {}
    for i, name in enumerate(BUILTIN_VOICES):
        tokens = torch.randint(0, SPEECH_CODES, (8 + 2 * i,), generator=gen)
        voices[name] = Voice(
            name=name,
            prompt_text_ids=tuple(ByteTokenizer().encode(f"This is the {name} speaking.")),
            prompt_tokens=tuple(int(t) for t in tokens),
            embedding=torch.randn(config.flow.spk_dim, generator=gen),
        )
    return SpeechModel(
        name=config.name,
        random_weights=config.random_weights,
        lm=SpeechLM(config.lm).eval(),
        flow=FlowModel(config.flow).eval(),
        vocoder=Vocoder(config.vocoder).eval(),
        voices=voices,
        tokenizer=ByteTokenizer(),
        pre_lookahead=config.flow.pre_lookahead,
        mel_bins=config.flow.mel_bins,
        token_ratio=(config.lm.min_tokens_per_text_token, config.lm.max_tokens_per_text_token),
        spk_dim=config.flow.spk_dim,
        spec=config,
    )


def save(model: SpeechModel, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if not isinstance(model.spec, ModelConfig):
        raise TypeError("only models built from a ModelConfig can be saved in this layout")
    (directory / "config.json").write_text(json.dumps(model.spec.to_dict(), indent=2))
    torch.save(model.lm.state_dict(), directory / "llm.pt")
    torch.save(model.flow.state_dict(), directory / "flow.pt")
    torch.save(model.vocoder.state_dict(), directory / "hift.pt")
    spk2info = {
        v.name: {
            "prompt_text": torch.tensor(v.prompt_text_ids, dtype=torch.long),
            "speech_token": torch.tensor(v.prompt_tokens, dtype=torch.long),
            "embedding": v.embedding,
        }
        for v in model.voices.values()
    }
    torch.save(spk2info, directory / "spk2info.pt")


def _load_state(module: torch.nn.Module, path: Path) -> None:
    load_strict(module, read_torch(path), path)


def _load_voices(path: Path, spk_dim: int) -> dict[str, Voice]:
    try:
        spk2info = torch.load(path, map_location="cpu", weights_only=True)
        voices = {
            str(name): Voice(
                name=str(name),
                prompt_text_ids=tuple(int(t) for t in info["prompt_text"]),
                prompt_tokens=tuple(int(t) for t in info["speech_token"]),
                embedding=info["embedding"].float().reshape(spk_dim),
            )
            for name, info in spk2info.items()
        }
    except Exception as exc:
        raise CheckpointError(f"{path}: not a valid voice table ({exc})") from exc
    if not voices:
        raise CheckpointError(f"{path}: holds no voice")
    return voices


def load_tiny(directory: Path, device: str = "cpu") -> SpeechModel:
    """A directory in the tiny layout (see the module docstring)."""
    for name in FILES:
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory / name}: required model file is missing")
    try:
        config = ModelConfig.from_dict(json.loads((directory / "config.json").read_text()))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{directory / 'config.json'}: invalid ({exc})") from exc
    model = build_random(config)
    _load_state(model.lm, directory / "llm.pt")
    _load_state(model.flow, directory / "flow.pt")
    _load_state(model.vocoder, directory / "hift.pt")
    model.voices = _load_voices(directory / "spk2info.pt", config.flow.spk_dim)
    for module in (model.lm, model.flow, model.vocoder):
        module.to(device)
    log.info("loaded model '%s' from %s (%d voices)", config.name, directory, len(model.voices))
    return model


TINY_LAYOUT = 2  # bump when the tiny checkpoint's files change, so old caches are not read


def default_tiny_dir() -> Path:
    return Path.home() / ".cache" / "voiceagent" / f"tiny-v{TINY_LAYOUT}"


def ensure_tiny(directory: Path | None = None) -> Path:
    """Write the random-weight `tiny` checkpoint once; later runs load the same weights."""
    directory = directory or default_tiny_dir()

    def complete() -> bool:
        return all((directory / f).is_file() for f in FILES)

    if complete():
        return directory
    # Written beside it and renamed into place: several processes (test workers, a
    # server and a bench) may start at once on a fresh machine, and none may read a
    # half-written file.
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    save(build_random(), staging)
    try:
        staging.rename(directory)
    except OSError:
        if complete():  # another process got there first, with the same weights
            shutil.rmtree(staging, ignore_errors=True)
        else:  # an incomplete copy left by a crash
            shutil.rmtree(directory, ignore_errors=True)
            staging.rename(directory)
    return directory
