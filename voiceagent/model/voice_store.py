"""Voices on disk: one `NAME.pt` file per voice made with `voiceagent voice add`.

A running server rescans the folder (see server/app.py), so a voice added from the
command line is usable by name without a restart.
"""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path

import torch

from .contract import Voice

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise ValueError(
            f"voice name {name[:80]!r} must be 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )


def save_voice(directory: Path, voice: Voice, prompt_text: str) -> Path:
    check_name(voice.name)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{voice.name}.pt"
    data = {
        "prompt_text": prompt_text,
        "prompt_text_ids": torch.tensor(voice.prompt_text_ids, dtype=torch.long),
        "prompt_tokens": torch.tensor(voice.prompt_tokens, dtype=torch.long),
        "prompt_mel": voice.prompt_mel,
        "embedding": voice.embedding,
    }
    # Serialized first, then written with plain file I/O: a full disk is an OSError
    # (ENOSPC) that names the problem, and the half-written file is removed.
    buffer = io.BytesIO()
    torch.save(data, buffer)
    tmp = path.with_suffix(".tmp")
    try:
        with tmp.open("wb") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)  # readers never see a half-written file
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_voice(path: Path) -> Voice:
    data = torch.load(path, map_location="cpu", weights_only=True)
    mel = data.get("prompt_mel")
    return Voice(
        name=path.stem,
        prompt_text_ids=tuple(int(t) for t in data["prompt_text_ids"]),
        prompt_tokens=tuple(int(t) for t in data["prompt_tokens"]),
        embedding=data["embedding"].float().flatten(),
        prompt_mel=None if mel is None else mel.float(),
    )


def load_voices(directory: Path | None) -> dict[str, Voice]:
    """Every readable voice in `directory`; unreadable files are logged and skipped."""
    voices: dict[str, Voice] = {}
    if directory is None or not directory.is_dir():
        return voices
    for path in sorted(directory.glob("*.pt")):
        try:
            voices[path.stem] = load_voice(path)
        except Exception as exc:  # one bad file must not hide the others
            log.warning("skipping voice file %s: %s", path, exc)
    return voices
