"""Any model directory -> a SpeechModel: a released CosyVoice2 layout (cosyvoice2/) or the
tiny layout (tiny/); with no directory, voiceagent's own voice where this copy ships one
(`voiceagent train export`), else the tiny random model, written once to the cache."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .speech_model import SpeechModel
from .tiny.checkpoint import ensure_tiny, load_tiny
from .weights import CheckpointError

__all__ = ["CheckpointError", "SpeechModel", "load", "load_model"]

# voiceagent's own English voice, when shipped: a TRAINED file marks a complete export
SHIPPED_VOICE = Path(__file__).resolve().parents[1] / "data" / "voice-en"

# load_model's lines were the command line's and keep its logger name ("voiceagent: model
# 'tiny' on cpu", as docs/operations.md shows them)
cli_log = logging.getLogger("voiceagent")


def load(directory: Path, device: str = "cpu") -> SpeechModel:
    """A model directory: a released CosyVoice2 layout, or the tiny layout."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: model directory does not exist")
    if (directory / "cosyvoice2.yaml").is_file() or (directory / "CosyVoice-BlankEN").is_dir():
        from .cosyvoice2.loader import load_cosyvoice2

        return load_cosyvoice2(directory, device)
    return load_tiny(directory, device)


def default_model_dir() -> Path:
    """Our own voice where this copy ships one, else the tiny random model."""
    if (SHIPPED_VOICE / "TRAINED").is_file():
        return SHIPPED_VOICE
    return ensure_tiny()


def load_model(path: str | None, device: str = "auto") -> SpeechModel:
    """The model directory at `path` on `device` ("auto": cuda if present); None: the
    default (`default_model_dir`), "tiny": the tiny random model (written once). A
    random-weight model says so in the log."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        cuda = torch.device(device).type == "cuda"
    except RuntimeError:
        raise CheckpointError(f"device {device!r}: give auto, cpu, cuda or cuda:N") from None
    if cuda and not torch.cuda.is_available():
        raise CheckpointError(f"device {device!r}: torch {torch.__version__} sees no CUDA device")
    if path is None:
        directory = default_model_dir()
    else:
        directory = ensure_tiny() if path == "tiny" else Path(path)
    model = load(directory, device=device)
    own = " (voiceagent's own voice, trained offline: docs/training.md)"
    cli_log.info(
        "model '%s' on %s%s", model.name, device, own if directory == SHIPPED_VOICE else ""
    )
    if model.warning:
        cli_log.warning("%s", model.warning)
    return model
