"""Stage `flow`: train the CosyVoice2 flow (speech tokens -> mel) of our own voice.

`CosyFlow` is trained from scratch on our tokens (tokens stage) and the teacher's mel
(feats stage), by conditional flow matching as CosyVoice2 trains it (the reference's
CausalMaskedDiffWithXvec.forward and CausalConditionalCFM.compute_loss), through the
same modules and masks inference runs (`CosyFlow.training_loss`):

- x0 is Gaussian noise, x1 the target mel; t ~ U(0, 1) bent by the cosine schedule
  (t = 1 - cos(t pi / 2), as the reference did when the released model was trained; its
  Jan 2026 code samples t uniformly), x_t = (1 - (1 - sigma_min) t) x0 + t x1 and the
  target velocity is x1 - (1 - sigma_min) x0 (sigma_min 1e-6);
- the loss is the mean squared error of the estimator's velocity over the real frames;
- classifier-free guidance: for 20% of the utterances mu, speaker and prompt condition
  are all zero (inference guides with rate 0.7 against exactly such a row);
- prompt condition: for half of the utterances a random prefix (up to 30%) of the
  target mel, zeros after it;
- streaming: each batch has, with even odds, full attention or the static chunk mask
  (25 tokens, 50 frames, from the first token), as the released model was trained both
  ways, so both `synthesize(blocks=None)` and the streamed chunks are in distribution;
- the prior (`prior`, weight 1): the encoder's output mu is also pulled onto the target
  mel, so the tokens' reading is learnt as a regression first (a training aid from
  Grad-TTS and Matcha-TTS; the reference has none);
- one speaker: one fixed 192-d vector (`speaker.pt`), which the export writes as the
  voice's `flow_embedding`.

Batches hold utterances of similar length (neighbours in length order around a random
one) up to `batch_frames` mel frames, padding included; an utterance longer than
`max_tokens` is cut to a random window (its lookahead then reads the real next tokens).
Every draw of step s comes from a generator seeded with (seed, s), so a resumed run
repeats exactly the steps an uninterrupted one would.

On disk (DIR/flow/): checkpoint.pt (model, optimizer, step, sizes, training seconds;
written atomically every `save_every_s` and at the end), speaker.pt, log.tsv (one row
per `log_every` steps and per held-out evaluation).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..model.contract import PAD_TOKEN
from ..model.cosyvoice2.flow import CosyFlow, FlowConfig
from ..model.cosyvoice2.loader import flow_config
from ..model.cosyvoice2.yaml_config import read_yaml
from . import feats, inherit, tokens
from .files import save_torch
from .sizes import VOICE, voice_yaml
from .update import anneal_factor, anneal_span, anneal_stop, step_precision, update

# The keys of `sizes.VOICE` that size the flow.
FLOW_KEYS = (
    "flow_dim",
    "flow_heads",
    "flow_units",
    "flow_blocks",
    "dec_channels",
    "dec_head_dim",
    "dec_blocks",
    "dec_mid_blocks",
    "dec_heads",
)
CHECKPOINT = "checkpoint.pt"
SPEAKER = "speaker.pt"
LOG = "log.tsv"
LOG_HEADER = "step\tseconds\tsplit\tloss\tframes_per_s\tlr\n"


@dataclass(frozen=True)
class Params:
    batch_frames: int = 1000  # mel frames per batch, padding included (the reference: 2000)
    max_tokens: int = 300  # longer utterances are cut to a random window of this many
    lr: float = 1e-3
    warmup: int = 50  # steps of linear learning-rate warm-up
    # An anneal (`train flow --anneal`): from step `anneal_from` the rate falls linearly to
    # update.ANNEAL_FLOOR of itself over `anneal_steps` steps; 0: none.
    anneal_from: int = 0
    anneal_steps: int = 0
    grad_clip: float = 5.0
    cfg_drop: float = 0.2
    prompt_rate: float = 0.5
    prompt_max: float = 0.3  # longest prompt prefix, as a share of the utterance
    streaming_rate: float = 0.5
    cosine_t: bool = True
    sigma_min: float = 1e-6
    prior: float = 1.0  # weight of the encoder's mel loss (`CosyFlow.training_loss`)
    bf16: bool = True  # bfloat16 autocast in training steps (`update.step_precision`)
    seed: int = 0
    log_every: int = 10
    save_every_s: float = 180.0
    heldout_utts: int = 32  # held-out utterances of the evaluated loss


def flow_dir(work: Path) -> Path:
    return work / "flow"


def flow_sizes(sizes: dict[str, int] | None = None) -> dict[str, int]:
    """The flow's keys of `sizes` (default: the voice's, `sizes.VOICE`)."""
    s = VOICE if sizes is None else sizes
    return {k: int(s[k]) for k in FLOW_KEYS}


def config(sizes: dict[str, int]) -> FlowConfig:
    """The FlowConfig the loader reads from a directory written with these sizes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cosyvoice2.yaml"
        path.write_text(voice_yaml(sizes))
        return flow_config(read_yaml(path))


# -- data --------------------------------------------------------------------------------


class Data:
    """The tokens and mel ([80, frames]) of one split, in memory."""

    def __init__(self, work: Path, split: str, limit: int | None = None) -> None:
        toks = tokens.load_tokens(work)
        utts = [u for u in feats.utterances(work) if u.split == split and u.id in toks]
        if limit is not None:
            utts = utts[:limit]
        if not utts:
            raise ValueError(f"no {split} utterances with tokens in {work}")
        self.ids = [u.id for u in utts]
        self.tokens: list[Tensor] = []
        self.mels: list[Tensor] = []
        for u in utts:
            with np.load(feats.feats_dir(work) / f"{u.id}.npz") as f:
                mel = torch.from_numpy(f["mel"].astype(np.float32)).t().contiguous()
            tok = torch.from_numpy(toks[u.id].astype(np.int64))
            if mel.shape[1] != feats.FRAMES_PER_TOKEN * tok.shape[0]:
                raise ValueError(f"{u.id}: {mel.shape[1]} mel frames for {tok.shape[0]} tokens")
            self.tokens.append(tok)
            self.mels.append(mel)
        self.lengths = np.array([t.shape[0] for t in self.tokens])
        self.order = np.argsort(self.lengths, kind="stable")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def frames(self) -> int:
        return int(self.lengths.sum()) * feats.FRAMES_PER_TOKEN


def speaker_vector(work: Path) -> Tensor:
    """The voice's one speaker vector [192] (made once, seeded, kept in speaker.pt)."""
    path = flow_dir(work) / SPEAKER
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    vec = torch.randn(192, generator=torch.Generator().manual_seed(17))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_torch(vec, path)
    return vec


def _pick(data: Data, rng: np.random.Generator, p: Params, ratio: int) -> list[int]:
    """Neighbours in length order around a random utterance, up to batch_frames."""
    order, n = data.order, len(data)
    pos = int(rng.integers(n))
    cap = [min(int(data.lengths[i]), p.max_tokens) * ratio for i in order]
    lo, hi = pos, pos + 1  # order[lo:hi] is the batch; lengths grow with the position
    while hi < n and (hi - lo + 1) * cap[hi] <= p.batch_frames:
        hi += 1
    while lo > 0 and (hi - lo + 1) * cap[hi - 1] <= p.batch_frames:
        lo -= 1
    return [int(i) for i in order[lo:hi]]


def make_batch(
    data: Data,
    step: int,
    p: Params,
    speaker: Tensor,
    cfg: FlowConfig,
    items: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of `CosyFlow.training_loss` for step `step` (every draw
    seeded with (seed, step)); `items` picks the utterances instead of the sampler."""
    rng = np.random.default_rng([p.seed, step])
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    r, look = cfg.token_mel_ratio, cfg.pre_lookahead
    chosen = list(items) if items is not None else _pick(data, rng, p, r)
    spans = []
    for i in chosen:
        length = int(data.lengths[i])
        n = min(length, p.max_tokens)
        start = int(rng.integers(length - n + 1))
        spans.append((i, start, n))
    b, width = len(spans), max(n for _, _, n in spans)
    toks = torch.full((b, width + look), PAD_TOKEN, dtype=torch.long)
    mel = torch.zeros(b, cfg.mel_bins, r * width)
    cond = torch.zeros_like(mel)
    for row, (i, start, n) in enumerate(spans):
        seg = data.tokens[i][start : start + n + look]  # the window, then its lookahead
        toks[row, : seg.shape[0]] = seg
        mel[row, :, : r * n] = data.mels[i][:, r * start : r * (start + n)]
        if rng.random() < p.prompt_rate:
            k = int(rng.integers(int(p.prompt_max * r * n) + 1))
            cond[row, :, :k] = mel[row, :, :k]
    t = torch.rand(b, generator=gen)
    if p.cosine_t:
        t = 1 - torch.cos(t * 0.5 * math.pi)
    return dict(
        tokens=toks,
        lengths=torch.tensor([n for _, _, n in spans]),
        mel=mel,
        cond=cond,
        spk=speaker[None].expand(b, -1),
        t=t,
        noise=torch.randn(mel.shape, generator=gen),
        keep=torch.rand(b, generator=gen) >= p.cfg_drop,
        streaming=bool(rng.random() < p.streaming_rate),
        sigma_min=p.sigma_min,
        prior=p.prior,
    )


def on(device: torch.device, batch: dict[str, Any]) -> dict[str, Any]:
    """A batch of `make_batch` with its tensors on `device`."""
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}


@torch.no_grad()
def heldout_loss(flow: CosyFlow, data: Data, p: Params, speaker: Tensor) -> float:
    """The flow matching loss over the first `heldout_utts` utterances of `data` with
    fixed draws (no prompt, no CFG drop, full attention, no prior), a frame-weighted mean:
    comparable across runs."""
    fixed = Params(
        **{
            **asdict(p),
            **dict(prompt_rate=0.0, cfg_drop=0.0, streaming_rate=0.0, prior=0.0, seed=99),
        }
    )
    total = frames = 0.0
    n = min(len(data), p.heldout_utts)
    was, device = flow.training, next(flow.parameters()).device
    flow.eval()
    for a in range(0, n, 8):
        batch = on(device, make_batch(data, a, fixed, speaker, flow.cfg, range(a, min(a + 8, n))))
        f = float(batch["lengths"].sum())
        total += float(flow.training_loss(**batch)) * f
        frames += f
    flow.train(was)
    return total / frames


# -- training ----------------------------------------------------------------------------


def _log(path: Path, rows: list[str]) -> None:
    new = not path.is_file()
    with path.open("a", encoding="utf-8") as f:
        if new:
            f.write(LOG_HEADER)
        f.writelines(rows)


def before_anneal_path(work: Path) -> Path:
    """The checkpoint an anneal started from: to train on at the full rate instead."""
    return flow_dir(work) / "checkpoint-before-anneal.pt"


def load_checkpoint(work: Path) -> dict[str, Any] | None:
    path = flow_dir(work) / CHECKPOINT
    return torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None


def new_flow(sizes: dict[str, int], seed: int = 0) -> CosyFlow:
    torch.manual_seed(seed)
    return CosyFlow(config(sizes))


def train(
    work: Path,
    budget_s: float,
    sizes: dict[str, int] | None = None,
    params: Params | None = None,
    steps: int | None = None,
    say: Callable[[str], None] = print,
    max_steps: int | None = None,
    warm_start: Path | None = None,
    parent: np.ndarray | None = None,
    device: torch.device | None = None,
    anneal: int | None = None,
) -> dict[str, Any]:
    """Train for `budget_s` seconds of wall time (or `steps` steps, or up to step
    `max_steps` of the whole training, whichever ends first), continuing from
    DIR/flow/checkpoint.pt if there is one; returns a summary.
    A new flow starts from another flow's checkpoint.pt, `warm_start`, and takes its
    sizes; `parent`: that flow's codes are another codebook's, and each of ours
    inherits its parent's embedding (`inherit.py`).

    sizes: the flow's sizes (keys of `sizes.VOICE`; default the voice's); a checkpoint
    keeps its own and refuses others. params: default `Params()`; a checkpoint keeps its
    own. device: where it trains (default the CPU; `update.train_device`); batches are
    drawn on the CPU and moved there. anneal: end a trained flow's training with this
    many steps on a linearly falling rate (`update.anneal_span`; the flow before them
    is kept in `before_anneal_path`).
    """
    begin = time.monotonic()
    out = flow_dir(work)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = load_checkpoint(work)
    # A new flow may start from another's weights, and then takes its sizes.
    warm = None
    if ckpt is None and warm_start is not None:
        warm = torch.load(warm_start, map_location="cpu", weights_only=True)
    source, source_path = (ckpt, out / CHECKPOINT) if ckpt is not None else (warm, warm_start)
    fs = flow_sizes(sizes) if source is None else {k: int(v) for k, v in source["sizes"].items()}
    if sizes is not None and flow_sizes(sizes) != fs:
        raise ValueError(f"{source_path} has sizes {fs}, not {flow_sizes(sizes)}")
    p = Params(**ckpt["params"]) if ckpt is not None else params or Params()
    device = device or torch.device("cpu")
    flow = new_flow(fs, p.seed).to(device)  # before the optimizer: its state follows
    opt = torch.optim.Adam(flow.parameters(), lr=p.lr)
    step, seconds = 0, 0.0
    if ckpt is not None:
        flow.load_state_dict(ckpt["model"])
        if "optimizer" in ckpt:  # a seeded checkpoint has none (train/snapshot.py)
            opt.load_state_dict(ckpt["optimizer"])
        step, seconds = int(ckpt["step"]), float(ckpt["seconds"])
    elif warm is not None:
        state = warm["model"]
        flow.load_state_dict(state if parent is None else inherit.flow_state(state, parent))
        say(f"flow: starting from {warm_start} (step {warm['step']})")
    annealed = anneal_span(
        (p.anneal_from, p.anneal_steps), step, anneal, out / CHECKPOINT, before_anneal_path(work)
    )
    p = replace(p, anneal_from=annealed[0], anneal_steps=annealed[1])
    # (a resumed anneal ends where it ends)
    if (stop := anneal_stop(annealed, max_steps)) is not None:
        left = max(0, stop - step)
        steps = left if steps is None else min(steps, left)
    speaker = speaker_vector(work)
    data, held = Data(work, "train"), Data(work, "heldout")
    n_params = sum(v.numel() for v in flow.parameters())
    say(
        f"flow: {n_params / 1e6:.2f} M parameters, {len(data)} train utterances "
        f"({data.frames / 50 / 3600:.2f} h), from step {step}"
    )
    log_path = out / LOG
    rows: list[str] = []

    def save() -> None:
        payload = {
            "model": flow.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "seconds": seconds,
            "sizes": fs,
            "params": asdict(p),
        }
        save_torch(payload, out / CHECKPOINT)
        _log(log_path, rows)
        rows.clear()

    first_heldout = None
    if step == 0:
        first_heldout = heldout_loss(flow, held, p, speaker)
        rows.append(f"0\t0.0\theldout\t{first_heldout:.5f}\t\t\n")
    flow.train()
    last_save = time.monotonic()
    window_loss, window_frames, window_s = 0.0, 0, 0.0
    losses: list[float] = []
    frames_done, train_s, steps_done = 0, 0.0, 0
    while time.monotonic() - begin < budget_s and (steps is None or steps_done < steps):
        t0 = time.monotonic()
        batch = on(device, make_batch(data, step, p, speaker, flow.cfg))
        warm_up = min(1.0, (step + 1) / max(p.warmup, 1))
        lr = p.lr * warm_up * anneal_factor(step, p.anneal_from, p.anneal_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        with step_precision(p.bf16, device):
            loss = flow.training_loss(**batch)
        if update(opt, flow.parameters(), loss, p.grad_clip) is None:
            say(f"flow: step {step}: loss or gradient not finite, batch skipped")
        step += 1
        steps_done += 1
        dt = time.monotonic() - t0
        frames = int(batch["lengths"].sum()) * flow.cfg.token_mel_ratio
        seconds += dt
        train_s += dt
        frames_done += frames
        losses.append(float(loss.detach()))
        window_loss += losses[-1]
        window_frames += frames
        window_s += dt
        if step % p.log_every == 0:
            rows.append(
                f"{step}\t{seconds:.1f}\ttrain\t{window_loss / p.log_every:.5f}\t"
                f"{window_frames / window_s:.0f}\t{lr:.2e}\n"
            )
            say(f"flow: step {step} loss {window_loss / p.log_every:.4f}")
            window_loss, window_frames, window_s = 0.0, 0, 0.0
        if time.monotonic() - last_save > p.save_every_s:
            save()
            last_save = time.monotonic()
    final_heldout = heldout_loss(flow, held, p, speaker)
    rows.append(f"{step}\t{seconds:.1f}\theldout\t{final_heldout:.5f}\t\t\n")
    save()
    head = losses[: p.log_every]
    tail = losses[-p.log_every :]
    return {
        "step": step,
        "steps": steps_done,
        "parameters": n_params,
        "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.monotonic() - begin, 1),
        "frames_per_s": round(frames_done / train_s, 1) if train_s else 0.0,
        "loss_first": round(sum(head) / len(head), 4) if head else None,
        "loss_last": round(sum(tail) / len(tail), 4) if tail else None,
        "heldout_first": None if first_heldout is None else round(first_heldout, 4),
        "heldout_last": round(final_heldout, 4),
        "device": str(device),
    }


# -- export and checks -------------------------------------------------------------------


def trained_flow(work: Path) -> CosyFlow:
    ckpt = load_checkpoint(work)
    if ckpt is None:
        raise FileNotFoundError(f"{flow_dir(work) / CHECKPOINT}: no flow trained yet")
    flow = new_flow({k: int(v) for k, v in ckpt["sizes"].items()})
    flow.load_state_dict(ckpt["model"])
    return flow.eval()


def export_state(work: Path) -> dict[str, Tensor]:
    """The trained flow's state dict in the released `flow.pt` key layout."""
    return {k: v.detach().clone() for k, v in trained_flow(work).state_dict().items()}


def mel_l1(
    flow: CosyFlow,
    data: Data,
    items: Sequence[int],
    speaker: Tensor,
    prompt: tuple[Tensor, Tensor] | None = None,
    blocks: int | None = None,
) -> float:
    """Mean |log-mel error| of the flow's inference (10 Euler steps, CFG 0.7) from each
    utterance's tokens against its mel. prompt: (tokens [P], mel [80, 2P]) or none."""
    errs = []
    for i in items:
        if prompt is None:
            pt, pm = torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, flow.cfg.mel_bins)
        else:
            pt, pm = prompt[0][None], prompt[1].t()[None]
        mel = flow.synthesize(data.tokens[i][None], pt, pm, speaker[None], blocks=blocks)
        errs.append(float((mel[0] - data.mels[i]).abs().mean()))
    return sum(errs) / len(errs)


def evaluate(work: Path, n: int = 2, prompt_tokens: int = 75) -> dict[str, float]:
    """mel_l1 of the trained and of the random-init flow on the first n held-out
    utterances: without a prompt, with a prompt (the first `prompt_tokens` of the first
    train utterance that long), and streamed (static chunk mask); and, for scale, that of
    one constant frame (the mean log-mel of 200 train utterances)."""
    held, train_data = Data(work, "heldout", limit=n), Data(work, "train", limit=200)
    speaker = speaker_vector(work)
    ready = [i for i in range(len(train_data)) if train_data.lengths[i] >= prompt_tokens]
    j = ready[0] if ready else int(np.argmax(train_data.lengths))
    k = min(prompt_tokens, int(train_data.lengths[j]))
    prompt = (train_data.tokens[j][:k], train_data.mels[j][:, : 2 * k])
    trained = trained_flow(work)
    ckpt = load_checkpoint(work)
    assert ckpt is not None
    random_init = new_flow({k: int(v) for k, v in ckpt["sizes"].items()}).eval()
    items = list(range(len(held)))
    # For scale: the error of one constant frame, the train utterances' mean log-mel.
    mean = torch.cat(train_data.mels, dim=1).mean(dim=1, keepdim=True)
    out = {"mean_frame": sum(float((held.mels[i] - mean).abs().mean()) for i in items) / len(items)}
    for name, flow in (("trained", trained), ("random", random_init)):
        out[f"{name}_no_prompt"] = mel_l1(flow, held, items, speaker)
        out[f"{name}_prompt"] = mel_l1(flow, held, items, speaker, prompt)
        out[f"{name}_streaming"] = mel_l1(flow, held, items, speaker, prompt, blocks=25)
    return {k: round(v, 4) for k, v in out.items()}
