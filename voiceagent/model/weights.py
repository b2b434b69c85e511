"""Reading torch files from a model directory: without running code in them, and into a
module only when every key and shape fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class CheckpointError(RuntimeError):
    """A model directory is missing a file or holds one that does not fit."""


def read_torch(path: Path) -> Any:
    """A torch file read without running code in it (weights_only)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged file
        raise CheckpointError(f"{path}: cannot be read as a torch file ({exc})") from exc


def load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Load a state dict that must match `module` key for key and shape for shape."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k} {tuple(state[k].shape)} != {tuple(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    problems = [
        f"{label} ({len(keys)}): {', '.join(keys[:3])}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape", wrong))
        if keys
    ]
    if problems:
        raise CheckpointError(f"{path}: does not fit the model config: {'; '.join(problems)}")
    module.load_state_dict(state, strict=True)
