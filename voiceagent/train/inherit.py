"""A trained LM or flow carried over to a new codebook: each new code inherits its rows.

New speech tokens (a bigger codebook, `train tokens --codes`) would mean training the LM
and the flow again from scratch: every row of their speech embeddings and of the LM's
speech head stands for a code that no longer exists. But both codebooks are centroids
in the same mel space, so each new code has a nearest old code, its parent, whose
rows are a good start: the flow reads a new code as its parent's sound, and the LM gives
a parent's probability to its children in equal parts (its head's bias minus the log of
the number of children), so it starts as good as the old LM was, in the old codes.
Training then only has to tell siblings apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .tokens import Codebook, nearest


def parents(new: Codebook, old: Codebook) -> np.ndarray:
    """For each of `new`'s codes, the nearest of `old`'s codes, measured as `old`
    measures (its normalization of the mel)."""
    mel = new.centroids.numpy() * new.std + new.mean
    x = torch.from_numpy((mel - old.mean) / old.std)
    return nearest(x, old.centroids).numpy()


def codebook_parents(work: Path, old_codebook: Path | None) -> np.ndarray | None:
    """The parents of this work directory's codes in `old_codebook`'s; None when there is
    no old codebook or it is this one (nothing to carry over)."""
    if old_codebook is None:
        return None
    own = work / "tokens" / "codebook.npz"
    if own.resolve() == old_codebook.resolve() or own.read_bytes() == old_codebook.read_bytes():
        return None
    return parents(Codebook.load(own), Codebook.load(old_codebook))


def rows(weight: Tensor, parent: np.ndarray) -> Tensor:
    """`weight` with its first len(parent) rows taken from their parents' rows (the rows
    after, the LM's stop tokens, stay)."""
    out = weight.clone()
    out[: len(parent)] = weight[torch.from_numpy(parent).long()]
    return out


def head_bias(bias: Tensor, parent: np.ndarray) -> Tensor:
    """The LM head's bias for inherited rows: each child gets its parent's logit less
    log(children), so that the children's probabilities add up to the parent's."""
    children = np.bincount(parent)[parent]
    out = rows(bias, parent)
    out[: len(parent)] -= torch.from_numpy(np.log(children)).to(bias.dtype)
    return out


def lm_state(state: dict[str, Tensor], parent: np.ndarray) -> dict[str, Tensor]:
    """An LM state dict (`SpeechLM`'s names) whose speech rows are carried to new codes."""
    out = dict(state)
    out["speech_embedding.weight"] = rows(state["speech_embedding.weight"], parent)
    out["llm_decoder.weight"] = rows(state["llm_decoder.weight"], parent)
    out["llm_decoder.bias"] = head_bias(state["llm_decoder.bias"], parent)
    return out


def flow_state(state: dict[str, Tensor], parent: np.ndarray) -> dict[str, Tensor]:
    """A flow state dict (`CosyFlow`'s names) whose token embedding is carried to new codes."""
    out = dict(state)
    out["input_embedding.weight"] = rows(state["input_embedding.weight"], parent)
    return out
