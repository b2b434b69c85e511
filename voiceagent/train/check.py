"""Stage `check`: how intelligible each trained part is on its own.

The whole voice is only as good as its weakest part, and a WER of the whole cannot say
which one that is. Here each part is heard alone, with the others replaced by what
needs no training: mel is made audible by Griffin-Lim (phase recovered by iteration
from the mel's magnitudes: rough, but a recognizer hears the words), and speech tokens
are made into mel by their k-means centroids (each token's two mel frames). So:

- `teacher`: the teacher's own audio (the meter's floor on these sentences);
- `teacher_mel`: the teacher's mel, Griffin-Lim (what Griffin-Lim itself costs);
- `tokens`: the teacher's tokens, centroids, Griffin-Lim (what the 25 Hz codes keep);
- `lm`: the LM's tokens for the text, centroids, Griffin-Lim (the LM alone);
- `flow`: the flow's mel of the teacher's tokens, Griffin-Lim (the flow alone);
- `lm_flow`: the flow's mel of the LM's tokens, Griffin-Lim (LM and flow);
- `vocoder`: our vocoder on the teacher's mel (the vocoder alone).

Each is a pooled pocketsphinx WER over the first `n` held-out sentences. Parts not yet
trained are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..audio.features import MEL_BINS, MEL_FFT, MEL_FMAX, MEL_HOP, MEL_RATE, slaney_mel_filters
from . import corpus, feats, tokens
from . import wer as meter

GL_ITERATIONS = 32


@cache
def _inverse_filters() -> torch.Tensor:
    """Pseudo-inverse of the mel filterbank [bins of the FFT, 80]."""
    fb = slaney_mel_filters(MEL_RATE, MEL_FFT, MEL_BINS, 0.0, MEL_FMAX)
    return torch.from_numpy(np.linalg.pinv(fb)).float()


def griffin_lim(mel: np.ndarray, iterations: int = GL_ITERATIONS, seed: int = 0) -> np.ndarray:
    """Log-mel [frames, 80] (`prompt_mel`'s) -> 24 kHz float32 samples, 480 per frame."""
    mag = (_inverse_filters() @ torch.from_numpy(np.exp(mel.T)).float()).clamp(min=0.0)
    window = torch.hann_window(MEL_FFT)
    length = mel.shape[0] * MEL_HOP
    gen = torch.Generator().manual_seed(seed)
    phase = torch.exp(2j * torch.pi * torch.rand(mag.shape, generator=gen))
    spec = mag * phase
    for _ in range(iterations):
        wav = torch.istft(spec, MEL_FFT, MEL_HOP, window=window, length=length)
        again = torch.stft(wav, MEL_FFT, MEL_HOP, window=window, return_complex=True)
        spec = mag * torch.exp(1j * torch.angle(again[:, : mag.shape[1]]))
    wav = torch.istft(spec, MEL_FFT, MEL_HOP, window=window, length=length)
    return (wav / max(float(wav.abs().max()), 1e-6) * 0.9).numpy()


def centroid_mel(book: tokens.Codebook, ids: np.ndarray) -> np.ndarray:
    """Speech tokens [n] -> mel [2n, 80]: each token's centroid, un-normalized. A token
    the codebook does not have (an LM may sample any of its 6,561) is the quietest one."""
    pairs = book.centroids.numpy() * book.std + book.mean
    ids = np.asarray(ids, dtype=np.int64)
    ids = np.where(ids < len(pairs), ids, int(pairs.mean(axis=1).argmin()))
    return pairs[ids].reshape(-1, MEL_BINS).astype(np.float32)


def _parts(work: Path, n: int) -> Iterator[tuple[str, Callable[[feats.Utterance], np.ndarray]]]:
    """(name, utterance -> 24 kHz audio) for each part that can be heard now."""
    from . import flow_train, lm_train, vocoder_train

    book = tokens.Codebook.load(tokens.tokens_dir(work) / "codebook.npz")
    speech = tokens.load_tokens(work)
    yield "teacher", lambda u: feats.load(work, u.id)[0]
    yield "teacher_mel", lambda u: griffin_lim(feats.load(work, u.id)[1])
    yield "tokens", lambda u: griffin_lim(centroid_mel(book, speech[u.id]))

    said: dict[str, np.ndarray] = {}
    if lm_train.checkpoint_path(work).is_file():
        model = lm_train.lm_model(work)
        voice = lm_train.no_prompt_voice()
        for u in _heldout(work, n):
            said[u.id] = np.array(lm_train.speak_tokens(model, u.text, voice), dtype=np.int64)
        yield "lm", lambda u: griffin_lim(centroid_mel(book, said[u.id]))

    if flow_train.load_checkpoint(work) is not None:
        flow = flow_train.trained_flow(work)
        spk = flow_train.speaker_vector(work)[None]
        none_t, none_m = torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, MEL_BINS)

        @torch.inference_mode()
        def flow_mel(ids: np.ndarray) -> np.ndarray:
            t = torch.from_numpy(np.asarray(ids, dtype=np.int64))[None]
            return flow.synthesize(t, none_t, none_m, spk)[0].T.numpy()

        yield "flow", lambda u: griffin_lim(flow_mel(speech[u.id]))
        if said:
            yield "lm_flow", lambda u: griffin_lim(flow_mel(said[u.id]))

    if vocoder_train.load_checkpoint(work) is not None:
        hift = vocoder_train.trained_model(work)
        yield "vocoder", lambda u: vocoder_train.vocode(hift, feats.load(work, u.id)[1])


def _heldout(work: Path, n: int) -> list[feats.Utterance]:
    return corpus.spread([u for u in feats.utterances(work) if u.split == "heldout"], n)


def run(work: Path, n: int = 20) -> dict[str, Any]:
    """{part: pooled WER} over `n` held-out sentences (spread over the set), and their count."""
    torch.manual_seed(0)
    held = _heldout(work, n)
    report: dict[str, Any] = {"sentences": len(held)}
    for name, hear in _parts(work, n):
        with torch.inference_mode():
            pairs = [(u.text, meter.transcribe(hear(u), feats.RATE)) for u in held]
        report[name] = round(meter.corpus_wer(pairs), 3)
    return report
