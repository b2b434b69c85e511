"""`voiceagent bench --scenario chunk-cost`: does a late chunk cost what an early one does?

On a CosyVoice2-layout model (by default a full-size random-weight one, written once to
~/.cache/voiceagent), a long utterance's tokens are fed in chunks, and flow + vocoder
time is measured for chunk 1 and chunk 20:

- linear: voiceagent's streaming path (flow caches, vocoder overlap state);
- recompute: the reference's strategy, reimplemented as a baseline: for every chunk the
  flow re-runs over the whole token prefix (static 25-token chunk mask) and the new
  frames are cut from the end; the vocoder then runs on those frames as in `linear`;
- linear_int8: `linear` with the int8 estimator (`engine.flow_precision = "int8"`, what
  the first-packet bench's optimized mode runs): its chunk 1 is cheaper, attention over
  the past is not, so its ratio is the larger;
- windows: `linear` with the flow reading back at most a window of the turn's own past
  (`engine.flow_window_s`), for each of WINDOWS_S seconds, with how far its mel moves
  from the unwindowed mel over the 20 chunks (the price of the bound).
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..model.quantize import reduced_flow
from ..model.speech_model import SpeechModel

log = logging.getLogger(__name__)

CHUNK = 25  # tokens per chunk (one second of speech)
CHUNKS = 20
WINDOWS_S = (20, 8, 4)  # flow windows measured, seconds (serve's default is 20)


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
def measure(
    model: SpeechModel,
    repeats: int = 1,
    chunk: int = CHUNK,
    chunks: int = CHUNKS,
    windows_s: tuple[float, ...] = WINDOWS_S,
) -> dict[str, Any]:
    """The report; `chunk`, `chunks` and `windows_s` are other than the defaults only in
    tests (the keys keep their names: `chunk20_ms` is then the last chunk's)."""
    voice = next(iter(model.voices.values()))
    gen = torch.Generator().manual_seed(0)
    n_tokens = chunk * chunks
    tokens = torch.randint(0, 6561, (n_tokens + model.pre_lookahead,), generator=gen).tolist()
    dev = model.device
    spk = voice.embedding[None].to(dev)
    flow: Any = model.flow
    results: dict[str, dict[str, list[float]]] = {"linear": {}, "linear_int8": {}, "recompute": {}}
    int8 = reduced_flow(flow, "int8")

    def stream(flow: Any) -> tuple[list[float], torch.Tensor]:
        """Per-chunk flow + vocoder ms, and the whole mel."""
        fstate, vstate = flow.initial_state(voice), model.vocoder.initial_state()
        times, mels = [], []
        for k in range(chunks):
            ids = tokens[k * chunk : (k + 1) * chunk + model.pre_lookahead]
            t0 = time.perf_counter()
            mel, fstate = flow.forward_chunk(torch.tensor([ids], device=dev), spk, fstate)
            _, vstate = model.vocoder.forward_chunk(mel, vstate, False)
            times.append((time.perf_counter() - t0) * 1000)
            mels.append(mel)
        return times, torch.cat(mels, dim=2)

    # Untimed: a process's first chunk of a flow also pays for memory touched the first
    # time and kernels set up; chunk 1 is then measured warm, as chunk 20 is.
    for f in (flow, int8):
        ids = torch.tensor([tokens[: chunk + model.pre_lookahead]], device=dev)
        mel, _ = f.forward_chunk(ids, spk, f.initial_state(voice))
        model.vocoder.forward_chunk(mel, model.vocoder.initial_state(), False)
    full_mel = None
    windows: dict[str, dict[str, list[float]]] = {f"{w:g}": {} for w in windows_s}
    deviation: dict[str, dict[str, float]] = {}
    for _ in range(repeats):
        times, full_mel = stream(flow)
        results["linear"].setdefault("c1", []).append(times[0])
        results["linear"].setdefault("c20", []).append(times[-1])
        times, _ = stream(int8)
        results["linear_int8"].setdefault("c1", []).append(times[0])
        results["linear_int8"].setdefault("c20", []).append(times[-1])
        for w in windows_s:
            times, mel = stream(flow.windowed(round(w * 25)))
            windows[f"{w:g}"].setdefault("c1", []).append(times[0])
            windows[f"{w:g}"].setdefault("c20", []).append(times[-1])
            err = (mel - full_mel).float()
            deviation[f"{w:g}"] = {
                "mel_max_abs": round(float(err.abs().max()), 4),
                "mel_rel_rms": round(float(err.norm() / full_mel.float().norm()), 5),
            }

        assert voice.prompt_mel is not None, "the benchmark voice needs a prompt mel"
        prompt_tokens = torch.tensor([voice.prompt_tokens], device=dev)
        prompt_mel = voice.prompt_mel[None].to(dev)
        times = []
        for k in (0, chunks - 1):  # each recompute is independent of the ones before it
            vstate = model.vocoder.initial_state()
            prefix = torch.tensor([tokens[: (k + 1) * chunk]], device=dev)
            t0 = time.perf_counter()
            mel = flow.synthesize(prefix, prompt_tokens, prompt_mel, spk, blocks=CHUNK)
            _, vstate = model.vocoder.forward_chunk(mel[:, :, -2 * chunk :], vstate, False)
            times.append((time.perf_counter() - t0) * 1000)
        results["recompute"].setdefault("c1", []).append(times[0])
        results["recompute"].setdefault("c20", []).append(times[-1])

    report: dict[str, Any] = {"model": model.name, "chunk_tokens": chunk}
    for mode, r in results.items():
        report[mode] = _costs(r)
    report["windows"] = {w: {**_costs(r), **deviation[w]} for w, r in windows.items()}
    return report


def _costs(r: dict[str, list[float]]) -> dict[str, float]:
    c1, c20 = statistics.median(r["c1"]), statistics.median(r["c20"])
    return {"chunk1_ms": round(c1, 1), "chunk20_ms": round(c20, 1), "ratio": round(c20 / c1, 2)}


def table(report: dict[str, Any]) -> str:
    rows = [(mode, report[mode]) for mode in ("linear", "linear_int8", "recompute")]
    rows += [(f"window {w} s", r) for w, r in report["windows"].items()]
    lines = [
        f"{mode:<13} chunk 1: {r['chunk1_ms']:>9} ms   chunk 20: {r['chunk20_ms']:>9} ms   "
        f"ratio {r['ratio']}"
        + (
            f"   mel vs no window: max {r['mel_max_abs']}, relative RMS {r['mel_rel_rms']}"
            if "mel_rel_rms" in r
            else ""
        )
        for mode, r in rows
    ]
    return "\n".join(lines)
