"""Stages `snapshot` and `seed`: training carried from one machine to the next.

The three parts train for more hours than one machine may last, and a work directory
does not outlive its machine. A snapshot is the part of a work directory that cannot be
remade quickly: the speech-token codebook, the LM's text tokenizer, the three parts'
checkpoints, with their weights in float16 and without optimizer state (a third of the
size), and the corpus with the tokens of every sentence the teacher spoke (a few MB for
many hours). The rest is remade from the corpus: the teacher speaks it again, as much
of it as the flow and the vocoder need, and the tokens stage encodes that speech with
the kept codebook, so the codes mean what they meant. The LM, which reads text and
tokens only, trains on all of the kept tokens: its data outgrows one machine's
teacher hours.

`seed` copies a snapshot into a work directory. A part that already has a checkpoint
there keeps it. A seeded part resumes from its step with fresh optimizer moments (the
trainers accept a checkpoint without optimizer state), and the loader copies the
float16 weights into float32 parameters.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from . import corpus, flow_train, lm_train, tokens, vocoder_train

MARK = "SNAPSHOT"  # JSON: when, and each part's step
# Where a checkout keeps the snapshot of the voice in training (not installed with the
# package: a snapshot is for training, not for serving)
IN_CHECKOUT = Path(__file__).resolve().parents[2] / "deploy" / "voice-en-snapshot"


def _checkpoints(work: Path) -> dict[str, Path]:
    """Each part's checkpoint file in a work directory (or snapshot)."""
    return {
        "lm": lm_train.checkpoint_path(work),
        "flow": flow_train.flow_dir(work) / flow_train.CHECKPOINT,
        "vocoder": vocoder_train.vocoder_dir(work) / "checkpoint.pt",
    }


def _extras(work: Path) -> list[Path]:
    """What each part needs beside its checkpoint: the codebook, the tokenizer, the
    flow's speaker vector; and the corpus with its sentences' tokens (the LM's data)."""
    return [
        tokens.tokens_dir(work) / "codebook.npz",
        lm_train.tokenizer_dir(work),
        flow_train.flow_dir(work) / flow_train.SPEAKER,
        corpus.corpus_dir(work),
        tokens.tokens_dir(work) / "tokens.npz",
    ]


def _light(payload: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint without its optimizer state, its weights in float16. The LM's best
    held-out score is dropped with it: its weights (best.pt) are not carried."""
    out = {k: v for k, v in payload.items() if k != "optimizer"}
    out["model"] = {
        k: v.half() if v.is_floating_point() else v for k, v in payload["model"].items()
    }
    if isinstance(out.get("extra"), dict):
        out["extra"] = {k: v for k, v in out["extra"].items() if k != "best_heldout_ce"}
    return out


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)


def write(work: Path, to: Path) -> dict[str, int]:
    """The snapshot of `work` at `to` (replaced whole); returns each part's step. A work
    directory with no checkpoint is refused: it would replace a snapshot with nothing."""
    if not any(path.is_file() for path in _checkpoints(work).values()):
        raise FileNotFoundError(f"{work}: no checkpoint of lm, flow or vocoder to keep")
    tmp = to.with_name(to.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    steps = {}
    for part, path in _checkpoints(work).items():
        if not path.is_file():
            continue
        payload = torch.load(path, map_location="cpu", weights_only=True)
        steps[part] = int(payload["step"])
        target = _checkpoints(tmp)[part]
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(_light(payload), target)
    for src, dst in zip(_extras(work), _extras(tmp), strict=True):
        if src.exists():
            _copy(src, dst)
    mark = {"made": time.strftime("%Y-%m-%d %H:%M"), "steps": steps}
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / MARK).write_text(json.dumps(mark, indent=2) + "\n")
    if to.exists():
        shutil.rmtree(to)
    tmp.rename(to)
    return steps


def seed(work: Path, source: Path) -> Iterator[str]:
    """Copy the snapshot at `source` into `work`, part by part, never over what is there."""
    if not (source / MARK).is_file():
        raise FileNotFoundError(f"{source}: not a snapshot (no {MARK} file)")
    # The codebook and the tokenizer go with the checkpoints trained on them: one that
    # is already in the work directory keeps the parts there, and the snapshot's are
    # not used.
    book = tokens.tokens_dir(work) / "codebook.npz"
    if book.exists():
        yield f"seed: {work} has its own codebook: the snapshot's parts do not fit it"
        return
    for src, dst in zip(_extras(source), _extras(work), strict=True):
        if src.exists() and not dst.exists():
            _copy(src, dst)
    steps = json.loads((source / MARK).read_text())["steps"]
    if corpus.is_complete(work):
        params = json.loads((corpus.corpus_dir(work) / "stage.json").read_text())["params"]
        yield (
            f"seed: the corpus is --hours {params['hours']} --seed {params['seed']} "
            f"--heldout {params['heldout']}: keep these flags (`train all`, `train corpus`)"
        )
    for part, src in _checkpoints(source).items():
        dst = _checkpoints(work)[part]
        if not src.is_file():
            continue
        if dst.exists():
            yield f"seed: {part} keeps its own checkpoint"
            continue
        _copy(src, dst)
        yield f"seed: {part} from step {steps[part]}"
