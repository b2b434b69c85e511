"""Stage `vocoder`: train the HiFT vocoder (mel -> 24 kHz speech) from scratch on the
teacher's speech, at the voice's size (`sizes.VOICE["hift_channels"]`).

What is learned, and from what (CosyVoice2 trains HiFT the same way, less its
discriminators: HiFiGan.forward_generator's mel-reconstruction and F0 terms):

- the F0 predictor reads the mel and is fitted (L1, in Hz) to the teacher's F0 at the
  mel frame rate, from our own pitch tracker (`pitch`: YIN's dips and a Viterbi path
  through them; 0 Hz = unvoiced);
- the rest of the vocoder turns random segments of the teacher's mel (`SEGMENT` frames)
  into audio, scored against the teacher's audio of those frames by a multi-resolution
  STFT loss (spectral convergence + L1 of log magnitudes, `stft_loss`) plus an L1 loss
  on the log-mel of the output (`log_mel`: the flow's mel, `prompt_mel`, in torch).

Which F0 drives the sine source (never with a gradient: CosyVoice2's sine generator
runs without one either): the teacher's for the first TEACHER_F0_STEPS steps, then the
predictor's. At inference the vocoder only ever gets the predictor's F0 (of the flow's
mel), so that is what it trains on in the end: the filter learns to live with the
predictor's errors (voicing edges, smoothed pitch) rather than trust an excitation it
will never get. But at the start the predictor is untrained (L1 above 20 Hz, voicing
mostly wrong) and a correct excitation teaches the filter faster: in 80-step runs on
the teacher's speech, the teacher-driven one ended 6% lower in training loss and 3%
lower in held-out log-mel distance (vocoded with the predictor's F0).

On disk (DIR/vocoder/): f0.npz (the tracker's F0 of every utterance, one array per
id), checkpoint.pt (model + optimizer + step + seconds, replaced atomically every
`CHECKPOINT_EVERY_S` and at the end of a run), log.tsv (losses every `LOG_EVERY` steps).
`train` resumes from the checkpoint; `export_state` gives hift.pt's state dict in the
released key layout (weight-normed convolutions as g/v pairs).

Over 500 lines: the whole vocoder stage (pitch tracker, losses, segments, the loop,
checkpoints, the held-out check) in the order it runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import soxr
import torch
import torch.nn.functional as F
from torch import Tensor

from ..audio.features import MEL_BINS, MEL_FFT, MEL_FMAX, MEL_HOP, MEL_RATE, slaney_mel_filters
from ..model.cosyvoice2.hift import HiFT, HiFTConfig, released_state_dict
from . import feats
from .files import save_torch
from .sizes import VOICE
from .update import anneal_factor, anneal_span, anneal_stop, update

RATE = MEL_RATE  # 24 kHz
HOP = MEL_HOP  # samples per mel frame
SEGMENT = 32  # mel frames per training item (0.64 s)
BATCH = 8
LR = 3e-4  # 1e-3 blew up near step 915 on the first long run
BETAS = (0.8, 0.99)  # HiFi-GAN's
CLIP = 10.0  # gradient norm
TEACHER_F0_STEPS = 1000  # steps whose source is driven by the teacher's F0 (see above)
LOG_EVERY = 10  # steps per log.tsv row
CHECKPOINT_EVERY_S = 180.0
# multi-resolution STFT (n_fft, hop, window) at 24 kHz: 10, 25 and 50 ms windows
RESOLUTIONS = ((512, 60, 240), (1024, 120, 600), (2048, 240, 1200))
PITCH_RATE = 8000  # the tracker's working rate
F0_MIN, F0_MAX = 45.0, 500.0  # the pitch tracker's search range, Hz
CANDIDATES = 4  # periods considered per frame (the deepest dips)
UNVOICED_COST = (
    0.8  # a frame with no dip below this is unvoiced unless its neighbours say otherwise
)
OCTAVE_COST = 2.0  # per octave of F0 change between frames
LAG_COST = 0.1  # per octave below F0_MAX
SURE_DIP = 0.15 + 0.25  # a dip (+ its lag cost) this low is periodic beyond doubt
RANGE_OCTAVES = 1.5  # F0 stays this close to the speaker's median
SWITCH_COST = 0.3  # per change of voicing
SILENCE_DB = -45.0  # frames this far below the utterance's loudest are unvoiced
LOG_COLUMNS = ("step", "seconds", "loss", "mel", "sc", "mag", "f0", "grad_norm")


def vocoder_dir(work: Path) -> Path:
    return work / "vocoder"


def hift_config(sizes: dict[str, int] | None = None) -> HiFTConfig:
    """The vocoder's configuration at these sizes, as `random_checkpoint.yaml_text` (and
    so the loader) spells it: only the channel counts scale."""
    ch = (sizes or VOICE)["hift_channels"]
    return HiFTConfig(base_channels=ch, f0_cond_channels=ch)


# -- the pitch tracker ------------------------------------------------------------------


def _cmnd(
    x: np.ndarray, frames: int, hop: int, win: int, t_max: int
) -> tuple[np.ndarray, np.ndarray]:
    """YIN's cumulative mean normalized difference [frames, t_max + 1] of windows of
    `win` samples centred at hop * i + hop / 2, and each window's mean power."""
    span = win + t_max
    xp = np.concatenate([np.zeros(win), x, np.zeros(span)])
    segs = np.lib.stride_tricks.sliding_window_view(xp, span)[win + hop // 2 - win // 2 :: hop]
    segs = segs[:frames]
    n_fft = 1 << (span - 1).bit_length()
    a = np.fft.rfft(segs[:, :win], n_fft)
    r = np.fft.irfft(np.conj(a) * np.fft.rfft(segs, n_fft), n_fft)[:, : t_max + 1]
    sq = np.concatenate([np.zeros((frames, 1)), np.cumsum(segs**2, axis=1)], axis=1)
    lags = np.arange(t_max + 1)
    energy = sq[:, lags + win] - sq[:, lags]  # energy of the window shifted by tau
    d = np.maximum(energy[:, :1] + energy - 2 * r, 0.0)
    d[:, 0] = 0.0
    running = np.cumsum(d, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cmnd = np.where(running > 0, d * lags / running, 1.0)
    cmnd[:, 0] = 1.0
    return cmnd, energy[:, 0] / win


def pitch(wav: np.ndarray, rate: int = RATE, hop: int = HOP) -> np.ndarray:
    """F0 in Hz of each mel frame (float32 [len // hop]; 0 = unvoiced).

    Frame i is centred where the mel's frame i is (sample hop * i + hop / 2; the HiFT
    source puts frame F0s there too). At PITCH_RATE, YIN's normalized difference of a
    window as long as the longest period gives each frame's candidate periods (its
    CANDIDATES deepest dips, refined by a parabola) with the dip's depth as their cost;
    "unvoiced" costs UNVOICED_COST. A Viterbi path then picks one per frame, paying
    OCTAVE_COST per octave of F0 change and SWITCH_COST per voicing change, so octave
    errors and one-frame voicing flips are not taken for a slightly deeper dip. Frames
    quieter than SILENCE_DB under the loudest one are unvoiced.
    """
    frames = len(wav) // hop
    if frames == 0:
        return np.zeros(0, np.float32)
    # at 8 kHz (harmonics up to 4 kHz are plenty to find F0 <= 500 Hz): 9x less work
    hop = hop * PITCH_RATE // rate
    x = soxr.resample(np.asarray(wav, dtype=np.float64), rate, PITCH_RATE)
    x = np.concatenate([x, np.zeros(max(frames * hop - len(x), 0))])
    t_min, t_max = int(PITCH_RATE / F0_MAX), math.ceil(PITCH_RATE / F0_MIN)
    cmnd, power = _cmnd(x, frames, hop, t_max, t_max)
    # candidate dips: local minima at lags t_min .. t_max - 1; as every multiple of the
    # period dips too, a longer lag costs LAG_COST per octave more (the shortest is F0)
    left, right = cmnd[:, t_min - 1 : t_max - 1], cmnd[:, t_min + 1 : t_max + 1]
    inner = cmnd[:, t_min:t_max]
    lag_cost = LAG_COST * np.log2(np.arange(t_min, t_max) / t_min)
    depth = np.where((inner <= left) & (inner < right), inner + lag_cost, np.inf)
    k = np.argsort(depth, axis=1)[:, :CANDIDATES]
    cost = np.take_along_axis(depth, k, axis=1)
    a0, b0, c0 = (np.take_along_axis(v, k, axis=1) for v in (left, inner, right))
    curve = a0 - 2 * b0 + c0
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where(curve > 0, 0.5 * (a0 - c0) / curve, 0.0)
    log_f0 = np.log2(PITCH_RATE / (t_min + k + np.clip(shift, -0.5, 0.5)))
    # the speaker's range: RANGE_OCTAVES around the median F0 of clearly periodic frames
    sure = cost[:, 0] < SURE_DIP
    if sure.any():
        centre = float(np.median(log_f0[sure, 0]))
        cost[np.abs(log_f0 - centre) > RANGE_OCTAVES] = np.inf
    floor = power.max() * 10 ** (SILENCE_DB / 10) if power.max() > 0 else np.inf
    cost[power <= floor] = np.inf
    # states 0..C-1: the candidates; state C: unvoiced
    local = np.concatenate([cost, np.full((frames, 1), UNVOICED_COST)], axis=1)
    total = local[0].copy()
    back = np.zeros((frames, CANDIDATES + 1), dtype=np.int64)
    for t in range(1, frames):
        jump = OCTAVE_COST * np.abs(log_f0[t][None, :] - log_f0[t - 1][:, None])  # [from, to]
        trans = np.full((CANDIDATES + 1, CANDIDATES + 1), SWITCH_COST)
        trans[:CANDIDATES, :CANDIDATES] = jump
        trans[CANDIDATES, CANDIDATES] = 0.0
        with np.errstate(invalid="ignore"):
            paths = total[:, None] + trans
        paths = np.where(np.isnan(paths), np.inf, paths)
        back[t] = paths.argmin(axis=0)
        total = paths[back[t], np.arange(CANDIDATES + 1)] + local[t]
    state = int(total.argmin())
    f0 = np.zeros(frames)
    for t in range(frames - 1, -1, -1):
        if state < CANDIDATES:
            f0[t] = 2.0 ** log_f0[t, state]
        state = int(back[t, state])
    return f0.astype(np.float32)


def f0_table(work: Path, ids: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The tracker's F0 of every utterance (or of `ids`), cached in DIR/vocoder/f0.npz;
    what is missing there is computed and the file rewritten (atomically)."""
    path = vocoder_dir(work) / "f0.npz"
    table: dict[str, np.ndarray] = {}
    if path.is_file():
        with np.load(path) as f:
            table = {k: f[k] for k in f.files}
    wanted = list(ids) if ids is not None else [u.id for u in feats.utterances(work)]
    missing = [i for i in wanted if i not in table]
    for utt in missing:
        wav, _ = feats.load(work, utt)
        table[utt] = pitch(wav)
    if missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name("f0.tmp.npz")
        np.savez(tmp, **table)  # type: ignore[arg-type]
        tmp.replace(path)
    return {i: table[i] for i in wanted}


# -- features and losses ----------------------------------------------------------------


@cache
def _mel_filters(dtype: torch.dtype) -> Tensor:
    return torch.from_numpy(
        slaney_mel_filters(MEL_RATE, MEL_FFT, MEL_BINS, 0.0, MEL_FMAX).copy()
    ).to(dtype)


@cache
def _hann(n: int) -> Tensor:
    return torch.hann_window(n, periodic=True, dtype=torch.float64)


def log_mel(wav: Tensor) -> Tensor:
    """`audio.features.prompt_mel` in torch, differentiable: [b, n] -> [b, n // 480, 80]
    (reflect padding of 720 per side, uncentered periodic-Hann frames of 1920 every 480,
    magnitude sqrt(power + 1e-9), Slaney filters 0-8 kHz, natural log floored at 1e-5)."""
    pad = (MEL_FFT - MEL_HOP) // 2
    x = F.pad(wav[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(
        x,
        MEL_FFT,
        MEL_HOP,
        MEL_FFT,
        window=_hann(MEL_FFT).to(x),
        center=False,
        return_complex=True,
    )
    mag = torch.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    mel = _mel_filters(x.dtype).to(x.device) @ mag
    return torch.log(mel.clamp(min=1e-5)).transpose(1, 2)


def stft_loss(fake: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
    """Multi-resolution STFT loss of audio [b, n]: (spectral convergence, L1 of log
    magnitudes), each averaged over RESOLUTIONS. Convergence is over the whole batch,
    so a silent item does not divide by zero."""
    sc = mag = fake.new_zeros(())
    for n_fft, hop, win in RESOLUTIONS:

        def spec(x: Tensor, n_fft: int = n_fft, hop: int = hop, win: int = win) -> Tensor:
            s = torch.stft(x, n_fft, hop, win, window=_hann(win).to(x), return_complex=True)
            return torch.sqrt(s.real**2 + s.imag**2 + 1e-10)

        f, r = spec(fake), spec(real)
        sc = sc + torch.linalg.vector_norm(r - f) / torch.linalg.vector_norm(r).clamp(min=1e-5)
        mag = mag + (torch.log(f.clamp(min=1e-5)) - torch.log(r.clamp(min=1e-5))).abs().mean()
    n = len(RESOLUTIONS)
    return sc / n, mag / n


# -- data -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    mel: Tensor  # [b, 80, T]
    wav: Tensor  # [b, T * 480]
    f0: Tensor  # [b, T] the tracker's F0, Hz
    start: list[int]  # first frame of each segment in its utterance

    def to(self, device: torch.device) -> Batch:
        return Batch(self.mel.to(device), self.wav.to(device), self.f0.to(device), self.start)


class Segments:
    """Random segments of the train utterances (each utterance drawn in proportion to
    the segments it holds). A batch depends only on (seed, step), so a resumed run draws
    what an uninterrupted one would have."""

    def __init__(self, work: Path, ids: Sequence[str], segment: int, seed: int = 0) -> None:
        self.work, self.segment, self.seed = work, segment, seed
        self.f0 = f0_table(work, ids)
        self.ids = [i for i in ids if len(self.f0[i]) >= segment]
        if not self.ids:
            raise ValueError(f"no train utterance has {segment} mel frames")
        weight = np.array([len(self.f0[i]) - segment + 1 for i in self.ids], dtype=np.float64)
        self.p = weight / weight.sum()

    def batch(self, step: int, size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step])
        picks = rng.choice(len(self.ids), size=size, p=self.p)
        seg, mels, wavs, f0s, starts = self.segment, [], [], [], []
        for k in picks:
            utt = self.ids[k]
            with np.load(feats.feats_dir(self.work) / f"{utt}.npz") as f:
                wav, mel = f["wav"], f["mel"]
            s = int(rng.integers(0, len(mel) - seg + 1))
            mels.append(mel[s : s + seg].T)
            wavs.append(wav[s * HOP : (s + seg) * HOP].astype(np.float32) / 32767.0)
            f0s.append(self.f0[utt][s : s + seg])
            starts.append(s)
        return Batch(
            torch.from_numpy(np.stack(mels)),
            torch.from_numpy(np.stack(wavs)),
            torch.from_numpy(np.stack(f0s)),
            starts,
        )


# -- training ---------------------------------------------------------------------------


def losses(model: HiFT, batch: Batch, source: str = "predicted") -> dict[str, Tensor]:
    """Every loss of one batch; "loss" is what is minimized. `source`: whose F0 drives
    the sine source, "predicted" or "teacher". The F0 predictor's only gradient is its
    own L1 (the source never passes one back)."""
    if source not in ("predicted", "teacher"):
        raise ValueError(f"source must be 'predicted' or 'teacher', not {source!r}")
    f0 = model.f0_predictor(batch.mel, None).float()
    f0_loss = (f0 - batch.f0).abs().mean()
    drive = f0 if source == "predicted" else batch.f0
    audio = model.segment(batch.mel, drive, batch.start)
    mel_loss = (log_mel(audio) - log_mel(batch.wav)).abs().mean()
    sc, mag = stft_loss(audio, batch.wav)
    # F0 in Hz is about 100x the spectral losses; it only trains its own predictor, but
    # the scale keeps the total readable.
    loss = mel_loss + sc + mag + 0.01 * f0_loss
    return {"loss": loss, "mel": mel_loss, "sc": sc, "mag": mag, "f0": f0_loss}


def new_model(sizes: dict[str, int] | None = None, seed: int = 0) -> HiFT:
    torch.manual_seed(seed)
    return HiFT(hift_config(sizes))


def load_checkpoint(work: Path) -> dict[str, Any] | None:
    path = vocoder_dir(work) / "checkpoint.pt"
    if not path.is_file():
        return None
    return dict(torch.load(path, map_location="cpu", weights_only=True))


def before_anneal_path(work: Path) -> Path:
    """The checkpoint an anneal started from: to train on at the full rate instead."""
    return vocoder_dir(work) / "checkpoint-before-anneal.pt"


def _anneal_of(ckpt: dict[str, Any]) -> tuple[int, int]:
    return int(ckpt.get("anneal_from", 0)), int(ckpt.get("anneal_steps", 0))


def trained_model(work: Path) -> HiFT:
    """The vocoder of the last checkpoint (eval mode)."""
    ckpt = load_checkpoint(work)
    if ckpt is None:
        raise FileNotFoundError(f"{vocoder_dir(work)}: no vocoder checkpoint yet")
    model = HiFT(hift_config({"hift_channels": int(ckpt["hift_channels"])}))
    model.load_state_dict(ckpt["model"])
    return model.eval()


def export_state(work: Path) -> dict[str, Tensor]:
    """hift.pt's state dict in the released key layout (what `load_hift_state` reads)."""
    return released_state_dict(trained_model(work))


def _append_log(path: Path, rows: list[dict[str, float]]) -> None:
    new = not path.is_file()
    with path.open("a", encoding="utf-8") as f:
        if new:
            f.write("\t".join(LOG_COLUMNS) + "\n")
        for row in rows:
            f.write("\t".join(_fmt(row[c]) for c in LOG_COLUMNS) + "\n")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e12 else f"{v:.5g}"


def train(
    work: Path,
    budget_s: float,
    *,
    sizes: dict[str, int] | None = None,
    batch: int = BATCH,
    segment: int = SEGMENT,
    lr: float = LR,
    teacher_f0_steps: int = TEACHER_F0_STEPS,
    seed: int = 0,
    log_every: int = LOG_EVERY,
    checkpoint_every_s: float = CHECKPOINT_EVERY_S,
    threads: int | None = 1,
    max_steps: int | None = None,
    ids: Sequence[str] | None = None,
    device: torch.device | None = None,
    anneal: int | None = None,
) -> dict[str, Any]:
    """Train for about `budget_s` seconds of wall time (pitch tracking of utterances not
    yet in f0.npz included), continuing from DIR/vocoder/checkpoint.pt when there is one.
    `ids`: the utterances to train on (default: the train split). `max_steps`: stop at
    this total step count too. `device`: where it trains (default the CPU;
    `update.train_device`). `anneal` steps end the training of a trained vocoder with a
    learning rate falling linearly to a twentieth (`update.anneal_factor`; the
    checkpoint before them is kept in `before_anneal_path`); a resumed run finishes an
    anneal and stops at its end, a plain run after it trains on at the full rate.
    Returns a summary of this run."""
    began = time.perf_counter()
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _train(
            work,
            budget_s,
            began,
            sizes,
            batch,
            segment,
            lr,
            teacher_f0_steps,
            seed,
            log_every,
            checkpoint_every_s,
            max_steps,
            ids,
            device or torch.device("cpu"),
            anneal,
        )
    finally:
        torch.set_num_threads(before)


def _train(
    work: Path,
    budget_s: float,
    began: float,
    sizes: dict[str, int] | None,
    batch: int,
    segment: int,
    lr: float,
    teacher_f0_steps: int,
    seed: int,
    log_every: int,
    checkpoint_every_s: float,
    max_steps: int | None,
    ids: Sequence[str] | None,
    device: torch.device,
    anneal: int | None,
) -> dict[str, Any]:
    out = vocoder_dir(work)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = load_checkpoint(work)
    channels = (sizes or VOICE)["hift_channels"]
    if ckpt is not None and int(ckpt["hift_channels"]) != channels:
        raise ValueError(
            f"{out}/checkpoint.pt has hift_channels {ckpt['hift_channels']}, not {channels}: "
            "move it away to start over at another size"
        )
    model = new_model({"hift_channels": channels}, seed).to(device)  # before the optimizer
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=BETAS)
    step, seconds = 0, 0.0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        if "optimizer" in ckpt:  # a seeded checkpoint has none (train/snapshot.py)
            opt.load_state_dict(ckpt["optimizer"])
        step, seconds = int(ckpt["step"]), float(ckpt["seconds"])
    held = (0, 0) if ckpt is None else _anneal_of(ckpt)
    anneal_from, anneal_steps = anneal_span(
        held, step, anneal, out / "checkpoint.pt", before_anneal_path(work)
    )
    max_steps = anneal_stop((anneal_from, anneal_steps), max_steps)
    model.train()
    if ids is None:
        ids = [u.id for u in feats.utterances(work) if u.split == "train"]
    data = Segments(work, ids, segment, seed)

    def save() -> None:
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            raise FloatingPointError("vocoder weights are not finite: checkpoint not written")
        save_torch(
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "seconds": seconds,
                "hift_channels": channels,
                "anneal_from": anneal_from,
                "anneal_steps": anneal_steps,
            },
            out / "checkpoint.pt",
        )

    first_step = step
    skipped = 0
    sums: dict[str, float] = {}
    n_sum, rows, curve = 0, [], []
    last_save = time.perf_counter()
    step_s = 0.0
    train_began = time.perf_counter()
    while max_steps is None or step < max_steps:
        now = time.perf_counter()
        if now - began + 1.5 * step_s > budget_s:
            break
        b = data.batch(step, batch).to(device)
        for group in opt.param_groups:
            group["lr"] = lr * anneal_factor(step, anneal_from, anneal_steps)
        parts = losses(model, b, "teacher" if step < teacher_f0_steps else "predicted")
        # (the first long run turned NaN at step 915: a batch of nearly silent segments,
        # spectral convergence 19.9)
        norm = update(opt, model.parameters(), parts["loss"], CLIP)
        if norm is None:
            skipped += 1
            print(f"vocoder: step {step}: loss or gradient not finite, batch skipped")
        step += 1
        step_s = time.perf_counter() - now
        seconds += step_s
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + float(v.detach())
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + (norm or 0.0)
        n_sum += 1
        if step % log_every == 0:
            row = {k: v / n_sum for k, v in sums.items()}
            row.update(step=step, seconds=round(seconds, 1))
            rows.append(row)
            curve.append(row)
            sums, n_sum = {}, 0
            _append_log(out / "log.tsv", rows)
            rows = []
        if time.perf_counter() - last_save > checkpoint_every_s:
            save()
            last_save = time.perf_counter()
    save()
    trained_s = time.perf_counter() - train_began
    steps = step - first_step
    return {
        "step": step,
        "steps": steps,
        "skipped": skipped,
        "wall_s": round(time.perf_counter() - began, 1),
        "train_s": round(trained_s, 1),
        "items_per_s": round(steps * batch / trained_s, 3) if trained_s > 0 else 0.0,
        "audio_s_per_s": round(steps * batch * segment / 50 / trained_s, 3)
        if trained_s > 0
        else 0.0,
        "params": sum(p.numel() for p in model.parameters()),
        "device": str(device),
        "first": curve[0] if curve else None,
        "last": curve[-1] if curve else None,
    }


# -- checking a trained vocoder ---------------------------------------------------------


@torch.inference_mode()
def vocode(model: HiFT, mel: np.ndarray) -> np.ndarray:
    """Offline synthesis of one utterance's mel [frames, 80] -> float32 samples."""
    return model(torch.from_numpy(mel).T[None])[0].numpy()


@torch.inference_mode()
def distance(fake: np.ndarray, real: np.ndarray) -> dict[str, float]:
    """How far vocoded audio is from the teacher's: the losses of training, whole-turn."""
    f, r = torch.from_numpy(fake)[None].float(), torch.from_numpy(real)[None].float()
    n = min(f.shape[1], r.shape[1]) // HOP * HOP
    f, r = f[:, :n], r[:, :n]
    sc, mag = stft_loss(f, r)
    mel = (log_mel(f) - log_mel(r)).abs().mean()
    return {"sc": float(sc), "mag": float(mag), "mel": float(mel)}


def heldout_check(work: Path, n: int = 2, wer: bool = True) -> list[dict[str, Any]]:
    """Vocode the teacher's mel of the first n held-out utterances with the last
    checkpoint: distance to the teacher's audio and, with pocketsphinx installed, what
    the recognizer hears in each (word error rates against the sentence)."""
    model = trained_model(work)
    held = [u for u in feats.utterances(work) if u.split == "heldout"][:n]
    report = []
    for u in held:
        wav, mel = feats.load(work, u.id)
        fake = vocode(model, mel)
        row: dict[str, Any] = {"id": u.id, "text": u.text, **distance(fake, wav)}
        if wer:
            try:
                from . import wer as meter

                row["wer_vocoded"] = meter.word_error_rate(u.text, meter.transcribe(fake, RATE))
                row["wer_teacher"] = meter.word_error_rate(u.text, meter.transcribe(wav, RATE))
            except ImportError:
                pass
        report.append(row)
    return report


def run(
    work: Path,
    budget_s: float,
    check: int = 2,
    device: torch.device | None = None,
    anneal: int | None = None,
    max_steps: int | None = None,
) -> Iterator[str]:
    """The stage: train for the budget, or up to step `max_steps`, on `device`
    (`anneal`: see `train`), then vocode `check` held-out utterances (on the CPU);
    yields report lines."""
    # (threads=None: the caller's, `train vocoder --threads`; train's own default is 1)
    r = train(work, budget_s, device=device, anneal=anneal, max_steps=max_steps, threads=None)
    last = r["last"] or {}
    losses = ", ".join(
        f"{k} {last[k]:.4g}" for k in ("loss", "mel", "sc", "mag", "f0") if k in last
    )
    yield (
        f"vocoder: step {r['step']} (+{r['steps']} in {r['wall_s']} s on {r['device']}), "
        f"{r['audio_s_per_s']} s of audio per s; {losses}; {vocoder_dir(work)}"
    )
    for row in heldout_check(work, check) if check else []:
        wer = ""
        if "wer_vocoded" in row:
            wer = f", WER {row['wer_vocoded']:.2f} (teacher's audio {row['wer_teacher']:.2f})"
        yield (
            f"vocoder: held-out {row['id']}: mel L1 {row['mel']:.3f}, STFT convergence "
            f"{row['sc']:.3f}, log magnitude L1 {row['mag']:.3f}{wer}"
        )
