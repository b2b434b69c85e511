"""CosyVoice2's HiFT vocoder (neural source filter + iSTFT): 80-bin mel at 50 Hz -> 24 kHz.

Layer names and shapes follow the released `hift.pt`, so its state dict loads through
`load_hift_state`. Weight norm is folded into plain convolution weights at load time.

Synthesis: an F0 predictor reads the mel; F0 drives a harmonic sine source (plus noise)
at 24 kHz; the STFT of that source is fused into an upsampling conv stack whose output
is a magnitude/phase spectrogram, turned into audio by an iSTFT (n_fft 16, hop 4).

Streaming: every convolution looks both ways, so a chunk is computed over a window of
`left_context` past mel frames + the new frames, and the audio of the last `hold_back`
frames is held until enough future frames (or the end of the turn) arrive. Both equal the
receptive field (20 frames each for the released config), so every emitted sample is
computed from exactly the inputs an offline pass uses. The rest of the offline pass is
reproduced in any window by position: layer outputs before the turn's first frame are
zeroed (= the convolutions' zero padding), the reflect paddings at the start are rebuilt
where the start falls in the window, the cumulative sine phase is carried in the state,
and noise is a fixed table indexed by absolute sample. `forward` is one such window.
The configuration and the receptive field it implies are in hift_config.py.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..contract import State, VocoderStage
from .hift_config import F0_CONVS, HiFTConfig, receptive_field

_NOISE_PERIOD = 1 << 17  # noise table length in samples (~5.5 s at 24 kHz)
_WN = ("parametrizations.weight.original0", "parametrizations.weight.original1")
_WN_OLD = ("weight_g", "weight_v")


class _Snake(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        a = self.alpha[None, :, None]
        return x + (1.0 / (a + 1e-9)) * torch.sin(x * a).pow(2)


def _masked(x: Tensor, mask: Tensor | None) -> Tensor:
    return x if mask is None else x * mask


class _ResBlock(nn.Module):
    def __init__(self, ch: int, kernel: int, dilations: Sequence[int]) -> None:
        super().__init__()

        def conv(d: int) -> nn.Conv1d:
            return nn.Conv1d(ch, ch, kernel, dilation=d, padding=(kernel - 1) * d // 2)

        self.convs1 = nn.ModuleList(conv(d) for d in dilations)
        self.convs2 = nn.ModuleList(conv(1) for _ in dilations)
        self.activations1 = nn.ModuleList(_Snake(ch) for _ in dilations)
        self.activations2 = nn.ModuleList(_Snake(ch) for _ in dilations)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        # Masking every conv output keeps the zeros that offline zero padding assumes.
        for c1, c2, a1, a2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            xt = _masked(c1(a1(x)), mask)
            x = _masked(c2(a2(xt)), mask) + x
        return x


class _SourceModule(nn.Module):
    """Merges the harmonic sines (+ noise) into one excitation; holds `l_linear`."""

    def __init__(self, harmonics: int) -> None:
        super().__init__()
        self.l_linear = nn.Linear(harmonics, 1)


class _F0Predictor(nn.Module):
    def __init__(self, cin: int, ch: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(F0_CONVS):
            layers += [nn.Conv1d(cin if i == 0 else ch, ch, 3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(ch, 1)

    def forward(self, mel: Tensor, mask: Tensor | None) -> Tensor:
        """F0 [b, T] in float64: the sine phase integrates F0 over the whole turn, so
        float32 rounding (which differs with window length and batch size) would grow
        into audible phase differences between streamed and offline audio."""
        x = mel.double()
        mask = None if mask is None else mask.double()
        for layer in self.condnet:
            if isinstance(layer, nn.Conv1d):
                w, b = layer.weight.double(), cast(Tensor, layer.bias).double()
                x = _masked(F.conv1d(x, w, b, padding=1), mask)
            else:
                x = F.elu(x)
        head = self.classifier
        return F.linear(x.transpose(1, 2), head.weight.double(), head.bias.double())[..., 0].abs()


class HiFT(VocoderStage):
    """The vocoder. Streaming attributes, in mel frames (20 ms each):

    - `left_context`: past frames each chunk recomputes over (the receptive field).
    - `hold_back`: frames whose audio a non-final chunk holds back; adds that much
      latency. None gives `exact_hold_back` (the receptive field) and exact streaming;
      fewer frames are approximate, optionally crossfaded over `crossfade` frames.
    """

    noise: Tensor
    window: Tensor

    def __init__(
        self, cfg: HiFTConfig | None = None, hold_back: int | None = None, crossfade: int = 0
    ) -> None:
        super().__init__()
        self.cfg = cfg = cfg or HiFTConfig()
        base, n_bins = cfg.base_channels, cfg.n_fft + 2
        self.m_source = _SourceModule(cfg.nb_harmonics + 1)
        self.conv_pre = nn.Conv1d(cfg.in_channels, base, 7, padding=3)
        self.ups = nn.ModuleList()
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True)):
            cin, ch = base >> i, base >> (i + 1)
            self.ups.append(nn.ConvTranspose1d(cin, ch, k, u, padding=(k - u) // 2))
            dk, ds, dp = cfg.source_down(i)
            self.source_downs.append(nn.Conv1d(n_bins, ch, dk, ds, padding=dp))
            self.source_resblocks.append(
                _ResBlock(
                    ch,
                    cfg.source_resblock_kernel_sizes[i],
                    cfg.source_resblock_dilation_sizes[i],
                )
            )
            for rk, rd in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True):
                self.resblocks.append(_ResBlock(ch, rk, rd))
        self.conv_post = nn.Conv1d(base >> len(cfg.upsample_rates), n_bins, 7, padding=3)
        self.f0_predictor = _F0Predictor(cfg.in_channels, cfg.f0_cond_channels)
        # Fixed noise (seed 0) indexed by absolute sample, so chunks equal one pass.
        gen = torch.Generator().manual_seed(0)
        noise = torch.randn(_NOISE_PERIOD, cfg.nb_harmonics + 1, generator=gen)
        self.register_buffer("noise", noise, persistent=False)
        n = torch.arange(cfg.n_fft, dtype=torch.float64)
        hann = 0.5 - 0.5 * torch.cos(2 * math.pi * n / cfg.n_fft)  # periodic Hann
        self.register_buffer("window", hann.float(), persistent=False)

        self.left_context, self.exact_hold_back = receptive_field(cfg)
        self.samples_per_frame = cfg.samples_per_frame
        self._set_hold_back(hold_back, crossfade)

    def _set_hold_back(self, hold_back: int | None, crossfade: int) -> None:
        self.hold_back = self.exact_hold_back if hold_back is None else hold_back
        if not 0 <= self.hold_back <= self.exact_hold_back:
            raise ValueError(f"hold_back must be in [0, {self.exact_hold_back}]")
        # A shorter hold-back crossfades the seams over `crossfade` of the held frames.
        exact = self.hold_back == self.exact_hold_back
        self.crossfade = 0 if exact else min(crossfade, self.hold_back)

    def variant(self, hold_back: int, crossfade: int = 0) -> HiFT:
        """The same vocoder (shared weights and buffers) with another hold-back; the
        exact one if `hold_back` is at least the receptive field."""
        other = copy.copy(self)  # shallow: parameters and buffers are the same tensors
        other._set_hold_back(min(hold_back, self.exact_hold_back), crossfade)
        return other

    # -- streaming -----------------------------------------------------------------------

    @property
    def context(self) -> int:
        """Mel frames carried between chunks."""
        return self.left_context + self.hold_back

    def initial_state(self) -> State:
        """Per-turn state of one session (dim 0 is the session)."""
        w = self.conv_pre.weight
        state = {
            "mel": torch.zeros(
                1, self.cfg.in_channels, self.context, dtype=w.dtype, device=w.device
            ),
            # Frames received so far; on the CPU so chunk sizes are known without a sync.
            "pos": torch.zeros(1, dtype=torch.long),
            # Cumulative phase (in turns, mod 1) of each harmonic at the phase anchor.
            "phase": torch.zeros(
                1, self.cfg.nb_harmonics + 1, dtype=torch.float64, device=w.device
            ),
        }
        if self.crossfade:
            n = self.crossfade * self.samples_per_frame
            state["tail"] = torch.zeros(1, n, dtype=w.dtype, device=w.device)
        return state

    def output_frames(self, received: int, m: int, final: bool) -> int:
        """Frames of audio a chunk of m frames yields after `received` frames (state
        "pos"); sessions batched together must agree on it."""
        start = max(received - self.hold_back, 0)
        return received + m - start if final else max(received + m - self.hold_back, 0) - start

    def batch_key(self, state: State | None, frames: int, final: bool) -> object:
        received = 0 if state is None else int(state["pos"][0])
        return (frames, final, self.output_frames(received, frames, final))

    @torch.inference_mode()
    def forward_chunk(self, mel: Tensor, state: State, final: bool = False) -> tuple[Tensor, State]:
        """mel [b, in, m] -> pcm [b, k * 480], new state. Holds back the audio of the
        last `hold_back` frames until more frames come or `final` flushes them. With the
        exact hold-back, all chunks concatenated equal `forward` of all frames."""
        b, m, spf = mel.shape[0], mel.shape[2], self.samples_per_frame
        pos_list = [int(p) for p in state["pos"]]
        counts = {self.output_frames(p, m, final) for p in pos_list}
        if len(counts) != 1:
            raise ValueError(f"sessions in one batch would yield different lengths {counts}")
        k = counts.pop()
        window = torch.cat([state["mel"], mel.to(state["mel"].dtype)], dim=2)
        new = dict(state)
        new["mel"] = window[:, :, window.shape[2] - self.context :]
        new["pos"] = state["pos"] + m
        if k == 0:  # nothing to emit yet: the phase anchor is still before the turn
            return window.new_zeros(b, 0), new
        # Early in a turn most of the window lies before the turn's first frame, where
        # every layer sees zeros, exactly as at a window's own zero padding: compute from
        # one such frame on (the first chunk costs its own frames, not the whole window).
        trim = max(min(max(self.context - p, 0) for p in pos_list) - 1, 0)
        audio, phase = self._synthesize(window[:, :, trim:], pos_list, state["phase"], m, trim)
        new["phase"] = phase
        end = (self.context + m if final else self.left_context + m) - trim  # window frames
        out = audio[:, (end - k) * spf : end * spf]
        if self.crossfade:
            out, tail = self._crossfade(out, audio, state["tail"], pos_list, end)
            new["tail"] = state["tail"] if final else tail
        return out.clamp(-self.cfg.audio_limit, self.cfg.audio_limit), new

    def _crossfade(
        self, out: Tensor, audio: Tensor, tail: Tensor, pos: list[int], end: int
    ) -> tuple[Tensor, Tensor]:
        """Blend the previous chunk's estimate of the first samples after the seam into
        this one's (only with a shortened hold-back, whose seams are not exact)."""
        n, spf = tail.shape[1], self.samples_per_frame
        ahead = torch.cat([out, audio[:, end * spf : end * spf + n]], dim=1)
        ramp = torch.sin(0.5 * math.pi * (torch.arange(n, device=out.device) + 0.5) / n) ** 2
        # No blend where this chunk's audio starts the turn.
        starts = torch.tensor([p - self.hold_back <= 0 for p in pos], device=out.device)
        w = torch.where(starts[:, None], torch.ones_like(ramp), ramp).to(out.dtype)
        h = min(n, ahead.shape[1])  # a turn shorter than the hold-back: nothing to blend
        head = tail[:, :h] * (1 - w[:, :h]) + ahead[:, :h] * w[:, :h]
        ahead = torch.cat([head, ahead[:, h:]], dim=1)
        return ahead[:, : out.shape[1]], ahead[:, out.shape[1] :]

    def forward(self, mel: Tensor) -> Tensor:
        """Offline synthesis: mel [b, in, T] -> pcm [b, T * 480]."""
        state = {k: v.expand(mel.shape[0], *v.shape[1:]) for k, v in self.initial_state().items()}
        return self.forward_chunk(mel, state, final=True)[0]

    def segment(self, mel: Tensor, f0: Tensor, start: Sequence[int]) -> Tensor:
        """For training: audio [b, T * 480] of mel segments [b, in, T], each computed as a
        window with no context (zero padding at both ends) whose first frame is frame
        `start` of its turn (which picks the noise, as a streamed turn does). The source
        is driven by `f0` [b, T] in Hz, not by the F0 predictor; no gradient flows into
        `f0`. Every other weight gets gradients (call it outside inference mode)."""
        pos = [self.context + s for s in start]
        phase = mel.new_zeros(mel.shape[0], self.cfg.nb_harmonics + 1, dtype=torch.float64)
        return self._synthesize(mel, pos, phase, 1, f0=f0.detach().double())[0]

    # -- one window ----------------------------------------------------------------------

    def _synthesize(
        self,
        mel: Tensor,
        pos: list[int],
        phase: Tensor,
        m: int,
        trim: int = 0,
        f0: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Audio of every frame of a window [b, in, W] whose last frame is received frame
        pos + m - 1, and the phase at the anchor moved by m frames. `trim`: frames cut
        from the front of the full window, all before the turn's first frame but one.
        `f0`: the source's F0 [b, W] instead of the predictor's (training)."""
        cfg = self.cfg
        width = mel.shape[2]
        # Window frames before the turn's first frame ("virtual"), per session.
        virtual = [max(self.context - p, 0) - trim for p in pos]
        vt = torch.tensor(virtual, device=mel.device)

        def mask(rate: int, extra: int = 0) -> Tensor | None:
            if max(virtual) == 0:
                return None
            t = torch.arange(width * rate + extra, device=mel.device)
            return (t[None, None, :] >= rate * vt[:, None, None]).to(mel.dtype)

        if f0 is None:
            f0 = self.f0_predictor(mel, mask(1))
        if max(virtual):
            f0 = f0 * (torch.arange(width, device=mel.device) >= vt[:, None])
        s, phase = self._source(f0, phase, pos, vt, m, trim)
        top = math.prod(cfg.upsample_rates)  # STFT frames (and last stage steps) per frame
        spec = _masked(self._stft(s, vt), mask(top, 1))

        x = _masked(self.conv_pre(mel), mask(1))
        n_res, rate = len(cfg.resblock_kernel_sizes), 1
        for i, up in enumerate(self.ups):
            rate *= cfg.upsample_rates[i]
            x = _masked(up(F.leaky_relu(x, cfg.lrelu_slope)), mask(rate))
            extra = 0
            if i == len(self.ups) - 1:
                x, extra = self._reflect_start(x, rate * vt), 1
            mk = mask(rate, extra)
            si = _masked(self.source_downs[i](spec), mk)
            x = x + cast(_ResBlock, self.source_resblocks[i])(si, mk)
            xs = cast(_ResBlock, self.resblocks[i * n_res])(x, mk)
            for j in range(1, n_res):
                xs = xs + cast(_ResBlock, self.resblocks[i * n_res + j])(x, mk)
            x = xs / n_res
        x = self.conv_post(F.leaky_relu(x))  # default slope 0.01, as released
        return self._istft(x, vt, top), phase

    def _source(
        self, f0: Tensor, phase: Tensor, pos: list[int], vt: Tensor, m: int, trim: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Harmonic-plus-noise excitation [b, W * 480] of a window from frame F0 [b, W].

        Per frame, each harmonic advances by rad = frac(f0 * h / sr) turns; the sample
        phase is 480 * (linear interpolation of the running sum between frame centres),
        clamped at the turn's ends. The running sum is taken from the anchor (window frame
        `F0_CONVS`, whose F0 is already exact) in float64, mod 1, so it neither drifts
        nor loses precision on long turns.
        """
        cfg, spf = self.cfg, self.samples_per_frame
        b, width = f0.shape
        harm = torch.arange(1, cfg.nb_harmonics + 2, dtype=torch.float64, device=f0.device)
        rad = (f0[:, :, None] * harm / cfg.sampling_rate) % 1.0  # [b, W, H]
        total = rad.cumsum(1)
        # The anchor's window frame; when trimmed away it was before the turn, where the
        # running sum is still 0, as at the (virtual) first frame of a trimmed window.
        anchor = max(F0_CONVS - trim, 1)
        rel = total - total[:, anchor - 1 : anchor]
        n = width * spf
        t = (torch.arange(n, dtype=torch.float64, device=f0.device) + 0.5) / spf - 0.5
        t = torch.maximum(t[None, :], vt[:, None].double())  # before frame 0: frame 0
        i0 = t.floor().long()
        lam = (t - i0)[:, :, None]
        i1 = (i0 + 1).clamp(max=width - 1)
        h = rad.shape[2]
        r0 = rel.gather(1, i0[:, :, None].expand(b, n, h))
        r1 = rel.gather(1, i1[:, :, None].expand(b, n, h))
        turns = spf * (phase[:, None, :] + r0 + lam * (r1 - r0))
        sines = cfg.nsf_alpha * torch.sin(2 * math.pi * (turns % 1.0))
        uv = (f0 > cfg.nsf_voiced_threshold).repeat_interleave(spf, dim=1)[:, :, None]
        first = torch.tensor([spf * (p - self.context + trim) for p in pos], device=f0.device)
        idx = (first[:, None] + torch.arange(n, device=f0.device)) % _NOISE_PERIOD
        noise = self.noise[idx].double()  # [b, n, H]
        amp = torch.where(uv, cfg.nsf_sigma, cfg.nsf_alpha / 3)
        waves = (torch.where(uv, sines, 0.0) + amp * noise).to(self.noise.dtype)
        s = torch.tanh(self.m_source.l_linear(waves))[:, :, 0]
        new_phase = (phase + rel[:, max(F0_CONVS - 1 + m - trim, 0)]) % 1.0
        return s, new_phase

    def _stft(self, s: Tensor, vt: Tensor) -> Tensor:
        """Centered STFT [b, n_fft + 2, W * 120 + 1] (real parts, then imaginary), with
        the reflect padding put where the turn starts or ends."""
        half, n = self.cfg.n_fft // 2, s.shape[1]
        i = torch.arange(-half, n + half, device=s.device)[None, :]
        start = (self.samples_per_frame * vt)[:, None]
        idx = torch.where(i < start, 2 * start - i, i)
        idx = torch.where(idx >= n, 2 * (n - 1) - idx, idx).clamp(0, n - 1)  # clamp: virtual
        padded = s.gather(1, idx)
        spec = torch.stft(
            padded,
            self.cfg.n_fft,
            self.cfg.hop_len,
            self.cfg.n_fft,
            window=self.window.to(s.dtype),
            center=False,
            return_complex=True,
        )
        return torch.cat([spec.real, spec.imag], dim=1)

    @staticmethod
    def _reflect_start(x: Tensor, start: Tensor) -> Tensor:
        """Prepend one step, reflected (x[1]) where the turn starts at step `start`."""
        padded = F.pad(x, (1, 0), mode="reflect")
        t = torch.arange(padded.shape[2], device=x.device)
        at_start = (t[None, None, :] == start[:, None, None]) & (start[:, None, None] > 0)
        return torch.where(at_start, padded.roll(-2, dims=2), padded)

    def _istft(self, x: Tensor, vt: Tensor, rate: int) -> Tensor:
        """Centered inverse STFT of log-magnitude / phase frames [b, n_fft + 2, F]; frames
        before the turn add neither signal nor window weight, as offline they do not exist."""
        n_fft, hop = self.cfg.n_fft, self.cfg.hop_len
        bins = n_fft // 2 + 1
        mag = torch.exp(x[:, :bins]).clamp(max=1e2)
        ph = torch.sin(x[:, bins:])
        frames = torch.fft.irfft(
            torch.complex(mag * torch.cos(ph), mag * torch.sin(ph)), n=n_fft, dim=1
        )
        n_frames = frames.shape[2]
        real = (torch.arange(n_frames, device=x.device)[None, :] >= rate * vt[:, None]).to(x.dtype)
        w = self.window.to(x.dtype)[None, :, None]
        length = (n_frames - 1) * hop + n_fft

        def overlap_add(cols: Tensor) -> Tensor:
            out = F.fold(cols, (1, length), (1, n_fft), stride=(1, hop))
            return out[:, 0, 0, n_fft // 2 : length - n_fft // 2]

        y = overlap_add(frames * w * real[:, None, :])
        env = overlap_add(w * w * real[:, None, :])
        return torch.where(env > 1e-11, y / env.clamp(min=1e-11), 0.0)


# -- released state dicts --------------------------------------------------------------


def _normed(module: HiFT) -> list[str]:
    """Layers stored weight-normed in a released file: every conv but the source downs."""
    return [
        name
        for name, mod in module.named_modules()
        if isinstance(mod, nn.Conv1d | nn.ConvTranspose1d) and not name.startswith("source_downs")
    ]


def _norm(v: Tensor) -> Tensor:
    """L2 norm over all dims but 0, shaped like weight norm's g."""
    return v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))


def released_state_dict(module: HiFT, naming: str = "parametrizations") -> dict[str, Tensor]:
    """The module's weights in a released file's layout: weight-normed layers as
    (g, v) = (|w|, w) named `parametrizations.weight.original0/1` or `weight_g/weight_v`."""
    if naming not in ("parametrizations", "weight_g"):
        raise ValueError(f"unknown naming {naming!r}")
    g_name, v_name = _WN if naming == "parametrizations" else _WN_OLD
    out = dict(module.state_dict())
    for name in _normed(module):
        w = out.pop(f"{name}.weight")
        out[f"{name}.{g_name}"] = _norm(w)
        out[f"{name}.{v_name}"] = w.clone()
    return out


def load_hift_state(module: HiFT, state: Mapping[str, Tensor]) -> None:
    """Load a released `hift.pt` state dict (either weight-norm naming, or already folded
    weights). Every key must be used and every weight found, with the right shape;
    otherwise ValueError names the offending keys."""
    rest = dict(state)
    expected = module.state_dict()
    found: dict[str, Tensor] = {}
    missing: list[str] = []
    wrong: list[str] = []
    normed = _normed(module)
    for name in normed:
        want = expected[f"{name}.weight"].shape
        forms = [(f"{name}.{g}", f"{name}.{v}") for g, v in (_WN, _WN_OLD)]
        pair = next(((g, v) for g, v in forms if g in rest and v in rest), None)
        if pair is None:
            if f"{name}.weight" not in rest:
                missing.append(f"{forms[0][0]} / {forms[0][1]}")
            continue
        g, v = rest.pop(pair[0]), rest.pop(pair[1])
        if v.shape != want or g.shape != (want[0],) + (1,) * (len(want) - 1):
            wrong.append(
                f"{pair[1]} {tuple(v.shape)} / {pair[0]} {tuple(g.shape)} for {tuple(want)}"
            )
            continue
        found[f"{name}.weight"] = v * (g / _norm(v))
    for key in expected:
        if key in found:
            continue
        if key not in rest:
            if key.removesuffix(".weight") not in normed:
                missing.append(key)
            continue
        value = rest.pop(key)
        if value.shape != expected[key].shape:
            wrong.append(f"{key} {tuple(value.shape)} != {tuple(expected[key].shape)}")
        found[key] = value
    problems = []
    if missing:
        problems.append(f"missing {len(missing)}: {', '.join(missing[:5])}")
    if rest:
        problems.append(f"unexpected {len(rest)}: {', '.join(sorted(rest)[:5])}")
    if wrong:
        problems.append(f"wrong shape {len(wrong)}: {', '.join(wrong[:5])}")
    if problems:
        raise ValueError("hift state dict does not fit the model: " + "; ".join(problems))
    module.load_state_dict(found, strict=True)
