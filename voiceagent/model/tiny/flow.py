"""Causal, chunk-aware conditional flow matching: speech tokens -> 80-bin mel at 50 Hz.

Every layer is causal except the pre-lookahead convolution, which reads
`pre_lookahead` future tokens (supplied with each chunk, or zeros at the end of the
turn). The Euler solver's per-step convolution caches and a fixed noise indexed by
absolute frame make each chunk cost work proportional to the chunk, while the
concatenated chunks equal one offline pass.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..contract import SPEECH_CODES, FlowStage, State, Voice
from .causal_conv import CausalConv1d
from .config import FlowConfig


class ResBlock(nn.Module):
    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.conv = CausalConv1d(channels, channels, kernel)

    def step(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        y, cache = self.conv.step(F.silu(x), cache)
        return x + y, cache


class Estimator(nn.Module):
    """Velocity field v(x_t, mu, spk, t): causal convolutions at the mel rate."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        m = cfg.mel_bins
        self.inp = CausalConv1d(3 * m, cfg.hidden, cfg.kernel)
        self.time_mlp = nn.Sequential(
            nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU(), nn.Linear(cfg.hidden, cfg.hidden)
        )
        self.blocks = nn.ModuleList(
            ResBlock(cfg.hidden, cfg.kernel) for _ in range(cfg.decoder_layers)
        )
        self.out = nn.Conv1d(cfg.hidden, m, 1)
        self.hidden = cfg.hidden

    def time_embedding(self, t: float, batch: int, device: torch.device) -> Tensor:
        half = self.hidden // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=device) / half)
        ang = 1000.0 * t * freqs
        emb = torch.cat([ang.sin(), ang.cos()])[None].expand(batch, -1)
        return self.time_mlp(emb.to(self.out.weight.dtype))

    def step(
        self, x: Tensor, mu: Tensor, spk: Tensor, t: float, caches: list[Tensor]
    ) -> tuple[Tensor, list[Tensor]]:
        spk_frames = spk[:, :, None].expand(-1, -1, x.shape[2])
        h, c0 = self.inp.step(torch.cat([x, mu, spk_frames], dim=1), caches[0])
        h = h + self.time_embedding(t, x.shape[0], x.device)[:, :, None]
        new = [c0]
        for block, cache in zip(cast(list[ResBlock], self.blocks), caches[1:], strict=True):
            h, c = block.step(h, cache)
            new.append(c)
        return self.out(F.silu(h)), new


class PreLookahead(nn.Module):
    """conv1 reads each token and the next `lookahead`; conv2 is causal; residual."""

    def __init__(self, channels: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, channels, lookahead + 1)
        self.conv2 = CausalConv1d(channels, channels, 3)

    def step(self, x: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        n = x.shape[2] - self.lookahead
        y = F.leaky_relu(self.conv1(x))
        y, cache = self.conv2.step(y, cache)
        return x[:, :, :n] + y, cache


class FlowModel(FlowStage):
    rand_noise: Tensor

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(SPEECH_CODES, cfg.token_dim)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_dim, cfg.mel_bins)
        self.pre_lookahead_layer = PreLookahead(cfg.token_dim, cfg.pre_lookahead)
        self.encoder_in = CausalConv1d(cfg.token_dim, cfg.hidden, cfg.kernel)
        self.encoder_blocks = nn.ModuleList(
            ResBlock(cfg.hidden, cfg.kernel) for _ in range(cfg.encoder_layers)
        )
        self.upsampled = CausalConv1d(cfg.hidden, cfg.hidden, cfg.kernel)
        self.encoder_proj = nn.Conv1d(cfg.hidden, cfg.mel_bins, 1)
        self.estimator = Estimator(cfg)
        gen = torch.Generator().manual_seed(0)
        noise = torch.randn(cfg.mel_bins, cfg.noise_frames, generator=gen)
        self.register_buffer("rand_noise", noise, persistent=False)

    # -- state ---------------------------------------------------------------------------

    def _encoder_convs(self) -> list[CausalConv1d]:
        return [
            self.pre_lookahead_layer.conv2,
            self.encoder_in,
            *(b.conv for b in cast(list[ResBlock], self.encoder_blocks)),
            self.upsampled,
        ]

    def _estimator_convs(self) -> list[CausalConv1d]:
        return [self.estimator.inp, *(b.conv for b in cast(list[ResBlock], self.estimator.blocks))]

    def initial_state(self, voice: Voice | None = None, grid: bool = False) -> State:
        """Per-turn state for one session; CFG caches have 2 rows (cond, uncond). The
        tiny flow has no prompt conditioning, so the voice does not enter."""
        state = {f"enc{i}": c.empty_cache(1) for i, c in enumerate(self._encoder_convs())}
        for s in range(self.cfg.n_steps):
            for j, c in enumerate(self._estimator_convs()):
                state[f"est{s}.{j}"] = c.empty_cache(2)
        state["frame"] = torch.zeros(
            1, dtype=torch.long, device=self.rand_noise.device
        )  # mel frames emitted so far
        return state

    # -- compute -------------------------------------------------------------------------

    def _noise(self, start_frames: Tensor, n: int) -> Tensor:
        steps = torch.arange(n, device=start_frames.device)
        idx = (start_frames[:, None] + steps[None, :]) % self.cfg.noise_frames
        return self.rand_noise[:, idx].permute(1, 0, 2)  # [b, mel, n]

    def encode(self, tokens: Tensor, state: State) -> Tensor:
        """tokens [b, n + lookahead] (PAD_TOKEN past the end) -> mu [b, mel, 2n]."""
        emb = self.input_embedding(tokens.clamp(min=0)) * (tokens >= 0)[..., None]
        x = emb.transpose(1, 2)
        x, state["enc0"] = self.pre_lookahead_layer.step(x, state["enc0"])
        x, state["enc1"] = self.encoder_in.step(x, state["enc1"])
        for i, block in enumerate(cast(list[ResBlock], self.encoder_blocks), start=2):
            x, state[f"enc{i}"] = block.step(x, state[f"enc{i}"])
        x = x.repeat_interleave(self.cfg.token_mel_ratio, dim=2)
        last = f"enc{2 + len(self.encoder_blocks)}"
        x, state[last] = self.upsampled.step(x, state[last])
        return self.encoder_proj(x)

    @torch.inference_mode()
    def forward_chunk(self, tokens: Tensor, spk: Tensor, state: State) -> tuple[Tensor, State]:
        """One chunk for a batch of turns. tokens [b, n + lookahead], spk [b, spk_dim].

        Returns mel [b, mel, n * ratio] and the new state (the input state is not mutated).
        """
        state = dict(state)
        b = tokens.shape[0]
        mu = self.encode(tokens, state)
        frames = mu.shape[2]
        # in the weights' type (a bfloat16 copy, quantize.reduced_flow), as the caches are
        spk_m = self.spk_embed_affine_layer(F.normalize(spk.to(mu.dtype), dim=1))
        x = self._noise(state["frame"], frames).to(mu.dtype)
        # CFG as a batch of two per turn: rows (cond, uncond) interleaved per turn.
        mu2 = torch.stack([mu, torch.zeros_like(mu)], dim=1).flatten(0, 1)
        spk2 = torch.stack([spk_m, torch.zeros_like(spk_m)], dim=1).flatten(0, 1)
        n_steps, w = self.cfg.n_steps, self.cfg.cfg_rate
        ts = [1.0 - math.cos(i / n_steps * math.pi / 2) for i in range(n_steps + 1)]
        n_convs = len(self._estimator_convs())
        for s in range(n_steps):
            caches = [state[f"est{s}.{j}"] for j in range(n_convs)]
            v2, caches = self.estimator.step(x.repeat_interleave(2, 0), mu2, spk2, ts[s], caches)
            for j, c in enumerate(caches):
                state[f"est{s}.{j}"] = c
            v = v2.view(b, 2, *v2.shape[1:])
            x = x + (ts[s + 1] - ts[s]) * ((1 + w) * v[:, 0] - w * v[:, 1])
        state["frame"] = state["frame"] + frames
        return x, state
