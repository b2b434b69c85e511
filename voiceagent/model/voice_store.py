"""Voices on disk: one `NAME.pt` file per voice, made with `voiceagent voice add` or
`POST /v1/voices` (voices/registry.py).

A running server rescans the folder (see server/app.py), so a voice added from the
command line is usable by name without a restart.

A file holds the prompt features only (never the reference audio): the transcript and its
text tokens, speech tokens, prompt mel, speaker vector, whether the LM uses the prompt
(`lm_prompt`, absent in older files: True), and `meta`, a dict of plain values about how
the voice was made (absent in older files: empty).
"""

from __future__ import annotations

import io
import logging
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .contract import Voice

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # (\Z: "$" allows a final newline)


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise ValueError(
            f"voice name {name[:80]!r} must be 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )


def save_voice(
    directory: Path,
    voice: Voice,
    prompt_text: str,
    meta: Mapping[str, Any] | None = None,
    replace: bool = True,
) -> Path:
    """Write `directory/NAME.pt` atomically. `meta`: plain values (str, int, float, bool,
    None, lists and dicts of them), read back by `read_voice_file`. `replace=False`:
    raise FileExistsError rather than replace a file of that name, also one another
    process (a server sharing the folder) wrote meanwhile."""
    check_name(voice.name)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{voice.name}.pt"
    data = {
        "prompt_text": prompt_text,
        "prompt_text_ids": torch.tensor(voice.prompt_text_ids, dtype=torch.long),
        "prompt_tokens": torch.tensor(voice.prompt_tokens, dtype=torch.long),
        "prompt_mel": voice.prompt_mel,
        "embedding": voice.embedding,
        "lm_prompt": voice.lm_prompt,
        "meta": dict(meta or {}),
    }
    # Serialized first, then written with plain file I/O: a full disk is an OSError
    # (ENOSPC) that names the problem, and the half-written file is removed.
    buffer = io.BytesIO()
    torch.save(data, buffer)
    # a name of its own (another process may be saving this voice) that no glob for
    # voices (*.pt) matches
    tmp = directory / f".{voice.name}.{secrets.token_hex(6)}.tmp"
    try:
        with tmp.open("wb") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        # readers never see a half-written file; a link, unlike a rename, fails where the
        # name exists (atomically, on NFS too)
        if replace:
            tmp.replace(path)
        else:
            _claim(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _claim(tmp: Path, path: Path) -> None:
    """`tmp` becomes `path` unless that exists (FileExistsError)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links: claim the name, then fill it
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        tmp.replace(path)


def read_voice_file(path: Path) -> tuple[Voice, str, dict[str, Any]]:
    """The voice in `path`, its transcript ("" if none) and its `meta` ({} in older files)."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    mel = data.get("prompt_mel")
    voice = Voice(
        name=path.stem,
        prompt_text_ids=tuple(int(t) for t in data["prompt_text_ids"]),
        prompt_tokens=tuple(int(t) for t in data["prompt_tokens"]),
        embedding=data["embedding"].float().flatten(),
        prompt_mel=None if mel is None else mel.float(),
        lm_prompt=bool(data.get("lm_prompt", True)),
    )
    meta = data.get("meta")
    text = data.get("prompt_text")
    return voice, text if isinstance(text, str) else "", meta if isinstance(meta, dict) else {}


def load_voice(path: Path) -> Voice:
    return read_voice_file(path)[0]


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
