"""Files a killed run cannot leave half written: each is made under a temporary name next
to its place and moved there once complete (a rename is atomic), so a stage that resumes
finds the old file, or none, never part of one. Stage markers read back as "not done"
when they cannot be read."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


@contextlib.contextmanager
def written(path: Path) -> Iterator[Path]:
    """A temporary path for the block to write; it becomes `path` when the block ends
    (the suffix stays last: np.savez would add ".npz" to another name)."""
    tmp = path.with_name(f"{path.stem}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_torch(obj: object, path: Path) -> None:
    with written(path) as tmp:
        torch.save(obj, tmp)


def write_json(path: Path, data: Any) -> None:
    with written(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")


def read_marker(path: Path) -> dict[str, Any] | None:
    """A stage's stage.json, or None when it is missing or unreadable (not done)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
