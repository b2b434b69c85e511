"""The configuration of CosyVoice2's HiFT vocoder (hift.py), and the receptive field it
implies: how many mel frames of context each way make a streamed chunk exact."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

F0_CONVS = 5  # the F0 predictor: five k=3 convs, one frame each way


@dataclass(frozen=True)
class HiFTConfig:
    """The `hift:` section of CosyVoice2's yaml; defaults are the released values."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_cond_channels: int = 512

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> HiFTConfig:
        """From the yaml section's keyword arguments (nested istft/f0 sections included)."""
        istft = p.get("istft_params", {})
        f0 = p.get("f0_predictor", {})
        if int(f0.get("num_class", 1)) != 1 or int(f0.get("in_channels", 80)) != int(
            p.get("in_channels", 80)
        ):
            raise ValueError("f0_predictor must have num_class 1 and the vocoder's in_channels")

        def ints(v: Sequence[Any]) -> tuple[int, ...]:
            return tuple(int(x) for x in v)

        d = cls()
        return cls(
            in_channels=int(p.get("in_channels", d.in_channels)),
            base_channels=int(p.get("base_channels", d.base_channels)),
            nb_harmonics=int(p.get("nb_harmonics", d.nb_harmonics)),
            sampling_rate=int(p.get("sampling_rate", d.sampling_rate)),
            nsf_alpha=float(p.get("nsf_alpha", d.nsf_alpha)),
            nsf_sigma=float(p.get("nsf_sigma", d.nsf_sigma)),
            nsf_voiced_threshold=float(p.get("nsf_voiced_threshold", d.nsf_voiced_threshold)),
            upsample_rates=ints(p.get("upsample_rates", d.upsample_rates)),
            upsample_kernel_sizes=ints(p.get("upsample_kernel_sizes", d.upsample_kernel_sizes)),
            n_fft=int(istft.get("n_fft", d.n_fft)),
            hop_len=int(istft.get("hop_len", d.hop_len)),
            resblock_kernel_sizes=ints(p.get("resblock_kernel_sizes", d.resblock_kernel_sizes)),
            resblock_dilation_sizes=tuple(
                ints(x) for x in p.get("resblock_dilation_sizes", d.resblock_dilation_sizes)
            ),
            source_resblock_kernel_sizes=ints(
                p.get("source_resblock_kernel_sizes", d.source_resblock_kernel_sizes)
            ),
            source_resblock_dilation_sizes=tuple(
                ints(x)
                for x in p.get("source_resblock_dilation_sizes", d.source_resblock_dilation_sizes)
            ),
            lrelu_slope=float(p.get("lrelu_slope", d.lrelu_slope)),
            audio_limit=float(p.get("audio_limit", d.audio_limit)),
            f0_cond_channels=int(f0.get("cond_channels", d.f0_cond_channels)),
        )

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * self.hop_len

    def source_down(self, i: int) -> tuple[int, int, int]:
        """(kernel, stride, padding) of the conv that brings the source STFT to stage i."""
        rates = [1, *self.upsample_rates[::-1][:-1]]
        u = math.prod(rates[: len(rates) - i])
        return (1, 1, 0) if u == 1 else (2 * u, u, u // 2)


def _resblock_reach(kernel: int, dilations: Sequence[int]) -> int:
    """Steps one residual block looks each way: per dilation a dilated and a plain conv."""
    return sum((kernel - 1) * d // 2 + (kernel - 1) // 2 for d in dilations)


def receptive_field(cfg: HiFTConfig) -> tuple[int, int]:
    """(left, right): mel frames before/after frame j that some sample of frame j reads.

    Walks the layers backwards from the samples of frame 0 as index intervals, through
    the decoder path (iSTFT, conv_post, resblocks, transposed convs, conv_pre) and every
    source branch (source resblocks, source downsampling, STFT, sine interpolation, F0
    predictor). The cumulative phase is not counted: it is carried in the state.
    """
    spf, n_fft, hop = cfg.samples_per_frame, cfg.n_fft, cfg.hop_len
    # iSTFT (centered): sample n reads frames f with 0 <= n + n_fft/2 - f*hop < n_fft.
    lo = -((n_fft - 1 - n_fft // 2) // hop)
    hi = (spf - 1 + n_fft // 2) // hop
    lo, hi = lo - 3, hi + 3  # conv_post, kernel 7
    stft_lo, stft_hi = lo, hi
    for i in reversed(range(len(cfg.upsample_rates))):
        reach = max(map(_resblock_reach, cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        lo, hi = lo - reach, hi + reach
        s_reach = _resblock_reach(
            cfg.source_resblock_kernel_sizes[i], cfg.source_resblock_dilation_sizes[i]
        )
        k, s, p = cfg.source_down(i)
        stft_lo = min(stft_lo, (lo - s_reach) * s - p)
        stft_hi = max(stft_hi, (hi + s_reach) * s - p + k - 1)
        if i == len(cfg.upsample_rates) - 1:
            lo, hi = lo - 1, hi - 1  # the one-sample reflection pad in front
        u, k = cfg.upsample_rates[i], cfg.upsample_kernel_sizes[i]
        p = (k - u) // 2
        lo, hi = -((-(lo + p - k + 1)) // u), (hi + p) // u
    mel_lo, mel_hi = lo - 3, hi + 3  # conv_pre, kernel 7
    # STFT frame g reads samples [g*hop - n_fft/2, g*hop + n_fft/2); sample n reads the
    # F0 of its own frame and the two frames its phase is interpolated between.
    s_lo, s_hi = stft_lo * hop - n_fft // 2, stft_hi * hop + n_fft // 2 - 1
    f_lo = min(math.floor((s_lo + 0.5) / spf - 0.5), s_lo // spf)
    f_hi = max(math.floor((s_hi + 0.5) / spf - 0.5) + 1, s_hi // spf)
    return max(-mel_lo, F0_CONVS - f_lo), max(mel_hi, f_hi + F0_CONVS)
