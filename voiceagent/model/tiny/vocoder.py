"""Streaming vocoder: 80-bin mel at 50 Hz -> 24 kHz PCM through an inverse STFT.

Each mel frame predicts a 2*hop-sample spectrum; frame i is windowed and overlap-added
over samples [i*hop, i*hop + 2*hop). Samples before (i+1)*hop are then final, so a chunk
of m frames yields exactly m*hop samples at once; the second half of the last frame is
the overlap carried to the next chunk (no added latency, no seam).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..contract import State, VocoderStage
from .causal_conv import CausalConv1d
from .config import VocoderConfig


class Vocoder(VocoderStage):
    window: Tensor

    def __init__(self, cfg: VocoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.conv_pre = CausalConv1d(cfg.mel_bins, cfg.hidden, cfg.kernel)
        self.convs = nn.ModuleList(
            CausalConv1d(cfg.hidden, cfg.hidden, cfg.kernel) for _ in range(cfg.layers)
        )
        bins = cfg.hop + 1  # rfft bins of a 2*hop frame
        self.conv_post = nn.Conv1d(cfg.hidden, 2 * bins, 1)
        self.register_buffer("window", torch.hann_window(2 * cfg.hop), persistent=False)

    def _convs(self) -> list[CausalConv1d]:
        return cast(list[CausalConv1d], list(self.convs))

    def initial_state(self) -> State:
        state = {"pre": self.conv_pre.empty_cache(1)}
        for i, c in enumerate(self._convs()):
            state[f"conv{i}"] = c.empty_cache(1)
        state["overlap"] = torch.zeros(1, self.cfg.hop, device=self.window.device)
        return state

    @torch.inference_mode()
    def forward_chunk(self, mel: Tensor, state: State, final: bool = False) -> tuple[Tensor, State]:
        """mel [b, mel, m] -> pcm [b, m * hop] in [-1, 1], and the new state. Nothing is
        held back, so `final` changes nothing."""
        if mel.shape[2] == 0:  # e.g. a final flush: nothing is held back here
            return mel.new_zeros(mel.shape[0], 0), state
        state = dict(state)
        hop = self.cfg.hop
        h, state["pre"] = self.conv_pre.step(mel, state["pre"])
        for i, conv in enumerate(self._convs()):
            y, state[f"conv{i}"] = conv.step(F.leaky_relu(h, 0.1), state[f"conv{i}"])
            h = h + y
        spec = self.conv_post(F.leaky_relu(h, 0.1))  # [b, 2*bins, m]
        log_mag, phase = spec.chunk(2, dim=1)
        mag = torch.exp(log_mag.clamp(max=4.0)) * 4.0  # ~0.1 RMS from random weights
        frames = torch.fft.irfft(torch.polar(mag, phase), n=2 * hop, dim=1)  # [b, 2hop, m]
        frames = frames * self.window[None, :, None]
        b, m = mel.shape[0], mel.shape[2]
        halves = frames.view(b, 2, hop, m)
        # Sample block i = first half of frame i + second half of frame i-1.
        first, second = halves[:, 0], halves[:, 1]
        prev = torch.cat([state["overlap"][:, :, None], second[:, :, :-1]], dim=2)
        out = (first + prev).transpose(1, 2).reshape(b, m * hop)
        state["overlap"] = second[:, :, -1]
        return out.clamp(-1.0, 1.0), state
