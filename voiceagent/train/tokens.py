"""Stage `tokens`: speech tokens of our own at 25 Hz, by k-means over the flow's mel.

CosyVoice2's tokens come from a supervised speech tokenizer we cannot ship; ours are
the nearest of K centroids to each pair of mel frames (one token per 40 ms, the rate
the LM and the flow expect), after normalizing each of the 160 dimensions over the
training set. One speaker, so the centroids spend their codes on what is said and how,
not on who says it. The LM learns text -> tokens; the flow learns tokens -> mel.

On disk (DIR/tokens/): codebook.npz (`mean`, `std` [160], `centroids` [K, 160]),
tokens.npz (each utterance's int16 tokens, length = mel frames / 2, packed: `ids`,
`lengths` and all tokens end to end in `tokens`, compressed; one array per id, as
earlier runs wrote, is read too; it may also hold an export's kept tokens of sentences
whose speech is not on this machine, which only the LM reads) and stage.json.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from . import feats
from .files import read_marker, write_json, written

# Griffin-Lim of each token's centroid (`train check`, 30 held-out sentences, 4 hours of
# teacher speech): WER 0.57 with 512 codes, 0.38 with 2048, 0.38 with 4096; the
# teacher's own mel 0.27. On 1.9 hours (2026-12-04): 2048 codes 0.42, 6561 0.35, 8192
# 0.31 (teacher's mel 0.30); the voice heard through the server went from 0.54 to 0.46
# with 6561 (docs/training-runs.md, twelfth run), all the LM's and the flow's vocabularies hold.
CODES = 6561
ITERATIONS = 40
SAMPLE = 200_000  # vectors k-means is fitted on (about 2.2 hours of speech)


def tokens_dir(work: Path) -> Path:
    return work / "tokens"


def pairs(mel: np.ndarray) -> np.ndarray:
    """[frames, 80] -> [frames / 2, 160]: the two mel frames of each token side by side."""
    return mel.reshape(-1, 2 * mel.shape[1])


class Codebook:
    def __init__(self, mean: np.ndarray, std: np.ndarray, centroids: np.ndarray) -> None:
        self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)
        self.centroids = torch.from_numpy(centroids.astype(np.float32))

    def encode(self, mel: np.ndarray) -> np.ndarray:
        """mel [frames, 80] (frames even) -> int16 tokens [frames / 2]."""
        x = torch.from_numpy((pairs(mel) - self.mean) / self.std)
        return nearest(x, self.centroids).numpy().astype(np.int16)

    def save(self, path: Path) -> None:
        with written(path) as tmp:
            np.savez(tmp, mean=self.mean, std=self.std, centroids=self.centroids.numpy())

    @classmethod
    def load(cls, path: Path) -> Codebook:
        with np.load(path) as f:
            return cls(f["mean"], f["std"], f["centroids"])


def codebook_size(path: Path) -> int:
    """How many codes a saved codebook has (read without loading its centroids)."""
    with np.load(path) as f:
        return int(f["centroids"].shape[0])


def nearest(x: torch.Tensor, centroids: torch.Tensor, batch: int = 65536) -> torch.Tensor:
    out = []
    c2 = (centroids**2).sum(1)
    for part in x.split(batch):
        out.append((c2[None] - 2 * part @ centroids.T).argmin(1))
    return torch.cat(out)


def fit(x: torch.Tensor, codes: int, iterations: int, seed: int = 0) -> torch.Tensor:
    """k-means (k-means++ start on a subset, then Lloyd steps); empty clusters restart at
    the points farthest from their centroids."""
    gen = torch.Generator().manual_seed(seed)
    start = x[torch.randperm(len(x), generator=gen)[:20_000]]
    centroids = start[torch.randint(len(start), (1,), generator=gen)]
    dist = ((start - centroids[0]) ** 2).sum(1)
    for _ in range(codes - 1):
        pick = torch.multinomial(dist / dist.sum(), 1, generator=gen)
        centroids = torch.cat([centroids, start[pick]])
        dist = torch.minimum(dist, ((start - start[pick]) ** 2).sum(1))
    for _ in range(iterations):
        assign = nearest(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=codes).to(x.dtype)
        empty = counts == 0
        centroids = sums / counts.clamp(min=1)[:, None]
        if empty.any():
            far = ((x - centroids[assign]) ** 2).sum(1).topk(int(empty.sum())).indices
            centroids[empty] = x[far]
    return centroids


def is_complete(work: Path) -> bool:
    """Every utterance of the teacher's manifest has its tokens, encoded from its speech
    on this machine (the manifest they were encoded for is the teacher's now)."""
    done = read_marker(tokens_dir(work) / "stage.json")
    return done is not None and done.get("manifest") == feats.manifest_digest(work)


def has_tokens(work: Path) -> bool:
    """Some sentences have tokens (all the LM needs)."""
    return (tokens_dir(work) / "tokens.npz").is_file()


def save_tokens(path: Path, tokens: dict[str, np.ndarray]) -> None:
    """Packed, since the file ships with the voice: one array per utterance cost about
    250 bytes of zip and .npy headers each, 13 of the 21 MB for 52,000 utterances."""
    ids = list(tokens)
    packed = np.concatenate([tokens[i].astype(np.int16) for i in ids] or [np.zeros(0, np.int16)])
    with written(path) as tmp:
        np.savez_compressed(
            tmp,
            ids=np.array(ids, dtype=str),
            lengths=np.array([len(tokens[i]) for i in ids], dtype=np.int64),
            tokens=packed,
        )


def read_tokens(path: Path) -> dict[str, np.ndarray]:
    """What `save_tokens` wrote, or one array per utterance id (earlier runs, tests)."""
    with np.load(path) as f:
        if "ids" not in f.files:
            return {k: f[k] for k in f.files}
        ends = np.cumsum(f["lengths"])
        parts = np.split(f["tokens"], ends[:-1]) if len(ends) else []
        return dict(zip(f["ids"].tolist(), parts, strict=True))


def load_tokens(work: Path) -> dict[str, np.ndarray]:
    return read_tokens(tokens_dir(work) / "tokens.npz")


def run(work: Path, codes: int = CODES, iterations: int = ITERATIONS) -> Iterator[str]:
    out = tokens_dir(work)
    out.mkdir(parents=True, exist_ok=True)
    utts = feats.utterances(work)
    if (out / "codebook.npz").is_file():
        # The codebook stays: the LM and the flow were trained on its codes. Every
        # utterance with speech here is encoded with it (again: speech remade on a new
        # machine differs a little from the one its kept tokens came from, and the flow
        # pairs tokens with this mel); kept tokens of sentences without speech here (a
        # export's, `train seed`) stay, for the LM, which needs no audio.
        book = Codebook.load(out / "codebook.npz")
        tokens = load_tokens(work) if (out / "tokens.npz").is_file() else {}
        kept = len(set(tokens) - {u.id for u in utts})
        yield (
            f"tokens: the codebook exists; encoding {len(utts)} utterances, keeping the "
            f"tokens of {kept} sentences without speech here"
        )
        tokens.update({u.id: book.encode(feats.load(work, u.id)[1]) for u in utts})
    else:
        mels = {u.id: feats.load(work, u.id)[1] for u in utts}
        train = np.concatenate([pairs(mels[u.id]) for u in utts if u.split == "train"])
        rng = np.random.default_rng(0)
        if len(train) > SAMPLE:
            train = train[rng.choice(len(train), SAMPLE, replace=False)]
        mean, std = train.mean(0), train.std(0) + 1e-5
        yield f"tokens: fitting {codes} centroids on {len(train)} mel pairs"
        centroids = fit(torch.from_numpy((train - mean) / std), codes, iterations)
        book = Codebook(mean, std, centroids.numpy())
        book.save(out / "codebook.npz")
        tokens = {uid: book.encode(mel) for uid, mel in mels.items()}
    save_tokens(out / "tokens.npz", tokens)
    used = len(np.unique(np.concatenate(list(tokens.values()))))
    summary = {
        "codes": len(book.centroids),
        "used": used,
        "utterances": len(tokens),
        "manifest": feats.manifest_digest(work),
    }
    write_json(out / "stage.json", summary)
    yield f"tokens: {len(tokens)} utterances, {used} of {len(book.centroids)} codes used"
