"""Any model directory -> a SpeechModel: a released CosyVoice2 layout (cosyvoice2/) or the
tiny layout (tiny/); with no directory, the tiny model, written once to the cache."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .speech_model import SpeechModel
from .tiny.checkpoint import ensure_tiny, load_tiny
from .weights import CheckpointError

__all__ = ["CheckpointError", "SpeechModel", "load", "load_model"]

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


def load_model(path: str | None, device: str = "auto") -> SpeechModel:
    """The model directory at `path` (None: the tiny model, written once) on `device`
    ("auto": cuda if present); a random-weight model says so in the log."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    directory = ensure_tiny() if path is None else Path(path)
    model = load(directory, device=device)
    cli_log.info("model '%s' on %s", model.name, device)
    if model.warning:
        cli_log.warning("%s", model.warning)
    return model
