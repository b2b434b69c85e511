"""`voiceagent bench --scenario chunk-cost`: does a late chunk cost what an early one does?

On a CosyVoice2-layout model (by default a full-size random-weight one, written once to
~/.cache/voiceagent), a long utterance's tokens are fed in chunks, and flow + vocoder
time is measured for chunk 1 and chunk 20:

- linear: voiceagent's streaming path (flow caches, vocoder overlap state);
- recompute: the reference's strategy, reimplemented as a baseline: for every chunk the
  flow re-runs over the whole token prefix (static 25-token chunk mask) and the new
  frames are cut from the end; the vocoder then runs on those frames as in `linear`.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..model.speech_model import SpeechModel

log = logging.getLogger(__name__)

CHUNK = 25  # tokens per chunk (one second of speech)
CHUNKS = 20


def default_full_random_dir() -> Path:
    return Path.home() / ".cache" / "voiceagent" / "cosyvoice2-full-random"


def ensure_full_random() -> Path:
    from ..model.cosyvoice2.random_checkpoint import write_random_cosyvoice2

    directory = default_full_random_dir()
    if not (directory / "RANDOM_WEIGHTS").is_file():
        log.warning("writing a full-size random-weight CosyVoice2 model to %s", directory)
        write_random_cosyvoice2(directory, size="full")
    return directory


@torch.inference_mode()
def measure(model: SpeechModel, repeats: int = 1) -> dict[str, Any]:
    voice = next(iter(model.voices.values()))
    gen = torch.Generator().manual_seed(0)
    n_tokens = CHUNK * CHUNKS
    tokens = torch.randint(0, 6561, (n_tokens + model.pre_lookahead,), generator=gen).tolist()
    dev = model.device
    spk = voice.embedding[None].to(dev)
    flow: Any = model.flow
    results: dict[str, dict[str, list[float]]] = {"linear": {}, "recompute": {}}

    for _ in range(repeats):
        fstate, vstate = model.flow.initial_state(voice), model.vocoder.initial_state()
        times = []
        for k in range(CHUNKS):
            chunk = tokens[k * CHUNK : (k + 1) * CHUNK + model.pre_lookahead]
            t0 = time.perf_counter()
            mel, fstate = model.flow.forward_chunk(torch.tensor([chunk], device=dev), spk, fstate)
            _, vstate = model.vocoder.forward_chunk(mel, vstate, False)
            times.append((time.perf_counter() - t0) * 1000)
        results["linear"].setdefault("c1", []).append(times[0])
        results["linear"].setdefault("c20", []).append(times[-1])

        assert voice.prompt_mel is not None, "the benchmark voice needs a prompt mel"
        prompt_tokens = torch.tensor([voice.prompt_tokens], device=dev)
        prompt_mel = voice.prompt_mel[None].to(dev)
        times = []
        for k in (0, CHUNKS - 1):  # each recompute is independent of the ones before it
            vstate = model.vocoder.initial_state()
            prefix = torch.tensor([tokens[: (k + 1) * CHUNK]], device=dev)
            t0 = time.perf_counter()
            mel = flow.synthesize(prefix, prompt_tokens, prompt_mel, spk, blocks=CHUNK)
            _, vstate = model.vocoder.forward_chunk(mel[:, :, -2 * CHUNK :], vstate, False)
            times.append((time.perf_counter() - t0) * 1000)
        results["recompute"].setdefault("c1", []).append(times[0])
        results["recompute"].setdefault("c20", []).append(times[-1])

    report: dict[str, Any] = {"model": model.name, "chunk_tokens": CHUNK}
    for mode, r in results.items():
        c1, c20 = statistics.median(r["c1"]), statistics.median(r["c20"])
        report[mode] = {
            "chunk1_ms": round(c1, 1),
            "chunk20_ms": round(c20, 1),
            "ratio": round(c20 / c1, 2),
        }
    return report
