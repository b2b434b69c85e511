"""Training carried from one machine to the next: an export's `training/` folder, and
stage `seed`.

The three parts train for more hours than one machine may last, and a work directory
does not outlive its machine. So an export (the voice's model directory, what `serve`
reads, its weights in float16) keeps a `training/` folder beside the voice's files,
with what training cannot remake quickly: each part's checkpoint without its weights
and optimizer state (step, sizes, hyper-parameters), the speech-token codebook, and the
corpus (its train sentences gzipped) with the tokens of every sentence the teacher
spoke (a few MB for many hours).
The voice the checkout ships (`SHIPPED_VOICE`) is where training goes on from: one copy
of the weights. The rest is remade from the corpus: the teacher speaks it again, as much of
it as the flow and the vocoder need, and the tokens stage encodes that speech with the
kept codebook, so the codes mean what they meant. The LM, which reads text and tokens
only, trains on all of the kept tokens: its data outgrows one machine's teacher hours.

`seed` turns an export back into a work directory: each part's checkpoint is its
training state with the voice's weights (the LM's are its best held-out ones, which
`export` ships). A part that already has a checkpoint there keeps it. A seeded part
resumes from its step with fresh optimizer moments (the trainers accept a checkpoint
without optimizer state), and the loaders copy the float16 weights into float32
parameters.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..model.checkpoint import SHIPPED_VOICE
from ..model.cosyvoice2.hift import HiFT, load_hift_state
from . import corpus, flow_train, lm_train, tokens, vocoder_train
from .files import save_torch

TRAINING = "training"  # an export's folder beside the voice's files
PACKED = "train.tsv"  # kept gzipped: 5.2 MB of text, 1.5 MB packed (50 MB for the voice)
MARK = "SNAPSHOT"  # in training/: JSON, when, and each part's step
PARTS = ("lm", "flow", "vocoder")


def checkpoints(work: Path) -> dict[str, Path]:
    """Each part's checkpoint file in a work directory."""
    return {
        "lm": lm_train.checkpoint_path(work),
        "flow": flow_train.flow_dir(work) / flow_train.CHECKPOINT,
        "vocoder": vocoder_train.vocoder_dir(work) / "checkpoint.pt",
    }


def _kept(root: Path) -> list[Path]:
    """What a work directory keeps in an export's training/ folder, as paths under
    `root`: the codebook, and the corpus with its sentences' tokens (the LM's data)."""
    return [
        tokens.tokens_dir(root) / "codebook.npz",
        corpus.corpus_dir(root),
        tokens.tokens_dir(root) / "tokens.npz",
    ]


def _state(payload: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint without its weights and optimizer state. The LM's best held-out
    score goes too: the next held-out evaluation starts that record again."""
    out = {k: v for k, v in payload.items() if k not in ("model", "optimizer")}
    if isinstance(out.get("extra"), dict):
        out["extra"] = {k: v for k, v in out["extra"].items() if not k.startswith("best_")}
    return out


def _copy(src: Path, dst: Path) -> None:
    """Copied whole or not at all (a seed killed midway leaves no part that looks done)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if src.is_dir():
        shutil.copytree(src, tmp)
        _unpack(tmp)
    else:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _pack(corpus_dir: Path) -> None:
    src = corpus_dir / PACKED
    if src.is_file():
        # No name or time in the header: the same corpus packs to the same bytes, so a
        # new export of the voice changes in git only what changed.
        with (
            src.open("rb") as f,
            src.with_name(PACKED + ".gz").open("wb") as raw,
            gzip.GzipFile("", "wb", 9, raw, mtime=0) as out,
        ):
            shutil.copyfileobj(f, out)
        src.unlink()


def _unpack(corpus_dir: Path) -> None:
    src = corpus_dir / (PACKED + ".gz")
    if src.is_file():
        with gzip.open(src, "rb") as f, (corpus_dir / PACKED).open("wb") as out:
            shutil.copyfileobj(f, out)
        src.unlink()


def keep(work: Path, folder: Path) -> dict[str, int]:
    """Write `work`'s training state into `folder` (an export's training/); returns each
    part's step. A work directory without all three parts is refused."""
    missing = [part for part, path in checkpoints(work).items() if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"{work}: no checkpoint of {', '.join(missing)} to keep")
    folder.mkdir(parents=True, exist_ok=True)
    steps = {}
    for part, path in checkpoints(work).items():
        payload = torch.load(path, map_location="cpu", weights_only=True)
        steps[part] = int(payload["step"])
        torch.save(_state(payload), folder / f"{part}.pt")
    for src, dst in zip(_kept(work), _kept(folder), strict=True):
        if src.exists():
            _copy(src, dst)
    _pack(corpus.corpus_dir(folder))
    mark = {"made": time.strftime("%Y-%m-%d %H:%M"), "steps": steps}
    (folder / MARK).write_text(json.dumps(mark, indent=2) + "\n")
    return steps


def _weights(source: Path, part: str, state: dict[str, Any]) -> dict[str, Tensor]:
    """A part's weights in its trainer's key layout, from the voice's files."""
    if part == "lm":  # llm.pt's keys are the trainer's (the tied head included)
        return dict(torch.load(source / "llm.pt", map_location="cpu", weights_only=True))
    if part == "flow":  # flow.pt's keys are the trainer's
        return dict(torch.load(source / "flow.pt", map_location="cpu", weights_only=True))
    # hift.pt has weight-normed layers as (g, v) pairs: fold them in float32
    released = torch.load(source / "hift.pt", map_location="cpu", weights_only=True)
    hift = HiFT(vocoder_train.hift_config({"hift_channels": int(state["hift_channels"])}))
    load_hift_state(hift, {k: v.float() for k, v in released.items()})
    return hift.state_dict()


def seed(work: Path, source: Path = SHIPPED_VOICE) -> Iterator[str]:
    """Start `work` from the export at `source`, part by part, never over what is there."""
    kept = source / TRAINING
    if not (kept / MARK).is_file():
        raise FileNotFoundError(f"{source}: no {TRAINING}/{MARK}: not an export to train on")
    # The codebook and the tokenizer go with the parts trained on them: a work directory
    # with a codebook of its own keeps its parts, and the export's are not used. The
    # codebook is copied last, so a seed cut short goes on where it stopped.
    book, *rest = zip(_kept(kept), _kept(work), strict=True)
    if book[1].exists():
        yield f"seed: {work} has its own codebook: the export's parts do not fit it"
        return
    for src, dst in rest:
        if src.exists() and not dst.exists():
            _copy(src, dst)
    if not lm_train.tokenizer_dir(work).exists():
        _copy(source / "CosyVoice-BlankEN", lm_train.tokenizer_dir(work))
    speaker = flow_train.flow_dir(work) / flow_train.SPEAKER
    if not speaker.exists():
        info = torch.load(source / "spk2info.pt", map_location="cpu", weights_only=True)
        speaker.parent.mkdir(parents=True, exist_ok=True)
        (entry,) = info.values()  # an export has one voice
        save_torch(entry["embedding"].reshape(-1).clone(), speaker)
    steps = json.loads((kept / MARK).read_text())["steps"]
    if corpus.is_complete(work):
        params = json.loads((corpus.corpus_dir(work) / "stage.json").read_text())["params"]
        flags = f"--hours {params['hours']} --seed {params['seed']} --heldout {params['heldout']}"
        if params.get("wordnet"):
            flags += f" --wordnet {params['wordnet']}"
        if params.get("asterisk") is False:
            flags += " --no-asterisk"
        yield f"seed: the corpus is {flags}: keep these flags (`train all`, `train corpus`)"
    for part, dst in checkpoints(work).items():
        if dst.exists():
            yield f"seed: {part} keeps its own checkpoint"
            continue
        state = torch.load(kept / f"{part}.pt", map_location="cpu", weights_only=True)
        state["model"] = _weights(source, part, state)
        dst.parent.mkdir(parents=True, exist_ok=True)
        save_torch(state, dst)
        yield f"seed: {part} from step {steps[part]}"
    if book[0].exists():
        _copy(*book)
