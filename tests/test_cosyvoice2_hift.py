"""CosyVoice2 HiFT vocoder: released key layout, state loading, streaming == offline.

Streaming tolerance: 3e-5 absolute on PCM in [-1, 1] (one 16-bit step). With the exact
hold-back every emitted sample is computed from the same inputs as the offline pass; what
differs is float32 rounding of convolutions over other window lengths and batch sizes
(measured max ~6e-6 with these weights; ~1e-12 when run in float64).

The weights are random but scaled (gain ~1 per layer) so that distant mel frames still
move the output by more than the tolerance: a left context or hold-back 4 frames short,
a phase that is not carried, noise not indexed by absolute sample, or a wrong rebuild of
the turn's start (checked against a direct whole-turn evaluation) fails these tests.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from voiceagent.model.cosyvoice2.hift import (
    HiFT,
    HiFTConfig,
    load_hift_state,
    receptive_field,
    released_state_dict,
)

TOL = 3e-5
MANIFEST = Path(__file__).parent / "data" / "cosyvoice2" / "hift_keys.txt"
SMALL = HiFTConfig(base_channels=32, f0_cond_channels=32)


def randomize(model: HiFT, seed: int = 0) -> HiFT:
    """Unit-gain conv weights, varied snake alphas, and an F0 head that gives a mix of
    voiced (> 10 Hz) and unvoiced frames, so both source branches are exercised."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Conv1d | torch.nn.ConvTranspose1d):
                w = mod.weight
                fan = w.shape[1] * w.shape[2]
                if isinstance(mod, torch.nn.ConvTranspose1d):
                    fan = w.shape[0] * w.shape[2] // mod.stride[0]
                w.copy_(torch.randn(w.shape, generator=gen) / math.sqrt(fan))
            if isinstance(mod, torch.nn.Conv1d | torch.nn.ConvTranspose1d | torch.nn.Linear):
                assert mod.bias is not None  # the usual +-1/sqrt(fan in), but seeded
                bound = 1 / math.sqrt(mod.weight[0].numel())
                mod.bias.copy_((torch.rand(mod.bias.shape, generator=gen) * 2 - 1) * bound)
        lin = model.m_source.l_linear.weight
        lin.copy_((torch.rand(lin.shape, generator=gen) * 2 - 1) / 3)
        model.conv_post.weight.mul_(0.3)  # keep most samples below the clamp
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
        head = model.f0_predictor.classifier
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 30)
        head.bias.fill_(30.0)
    return model.eval()


def small_model(**kw: int) -> HiFT:
    return randomize(HiFT(SMALL, **kw))


@pytest.fixture(scope="module")
def model() -> HiFT:
    return small_model()


@pytest.fixture(scope="module")
def mel() -> torch.Tensor:
    return torch.randn(1, 80, 90, generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def offline(model: HiFT, mel: torch.Tensor) -> torch.Tensor:
    return model(mel)


def stream(
    model: HiFT, mel: torch.Tensor, sizes: list[int], zero_flush: bool = True
) -> torch.Tensor:
    """Feed mel in chunks of `sizes` (cycled); the end of the turn is a 0-frame final
    chunk, or the last data chunk marked final."""
    state, out, i, n = model.initial_state(), [], 0, mel.shape[2]
    for k in range(n):
        if i >= n:
            break
        size = sizes[k % len(sizes)]
        chunk, i = mel[:, :, i : i + size], i + size
        pcm, state = model.forward_chunk(chunk, state, final=i >= n and not zero_flush)
        assert pcm.shape[1] % model.samples_per_frame == 0
        out.append(pcm)
    if zero_flush:
        pcm, state = model.forward_chunk(mel[:, :, :0], state, final=True)
        out.append(pcm)
    return torch.cat(out, dim=1)


def read_manifest() -> dict[str, tuple[int, ...]]:
    rows = [ln.split() for ln in MANIFEST.read_text().splitlines() if not ln.startswith("#")]
    return {k: tuple(int(d) for d in shape.split(",")) for k, shape in rows}


# -- layout and loading ------------------------------------------------------------------


def test_full_size_keys_and_shapes_equal_the_release_manifest():
    manifest = read_manifest()
    full = HiFT()
    released = {k: tuple(v.shape) for k, v in released_state_dict(full).items()}
    assert released == manifest
    # The module itself holds the same layers with weight norm folded into `weight`.
    folded = {
        re.sub(r"\.parametrizations\.weight\.original1$", ".weight", k): v
        for k, v in manifest.items()
        if not k.endswith("original0")
    }
    assert {k: tuple(v.shape) for k, v in full.state_dict().items()} == folded


def test_released_config_receptive_field_and_latency():
    full = HiFT()
    assert receptive_field(HiFTConfig()) == (20, 20)
    assert (full.left_context, full.hold_back) == (20, 20)
    assert full.hold_back * 1000 * full.samples_per_frame // 24000 == 400  # ms
    assert HiFTConfig.from_params({"base_channels": 64}) == HiFTConfig(base_channels=64)


@pytest.mark.parametrize("naming", ["parametrizations", "weight_g"])
def test_loader_accepts_both_weight_norm_namings(model, mel, offline, naming):
    state = released_state_dict(model, naming)
    g_key = "conv_pre.parametrizations.weight.original0"
    v_key = "conv_pre.parametrizations.weight.original1"
    if naming == "weight_g":
        g_key, v_key = "conv_pre.weight_g", "conv_pre.weight_v"
    assert g_key in state and v_key in state
    state[v_key] = state[v_key] * 3.0  # weight norm: only v's direction counts
    fresh = HiFT(SMALL)
    load_hift_state(fresh, state)
    for k, v in model.state_dict().items():  # g * v / |v| is w again, up to rounding
        assert torch.allclose(fresh.state_dict()[k], v, rtol=1e-6, atol=1e-8), k
    assert (fresh.eval()(mel) - offline).abs().max() < 1e-3
    # A folded state dict (the module's own) loads as well.
    again = HiFT(SMALL)
    load_hift_state(again, model.state_dict())
    assert torch.equal(again.eval()(mel), offline)


def _broken(kind: str) -> tuple[dict[str, torch.Tensor], str]:
    state = released_state_dict(HiFT(SMALL))
    if kind == "missing":
        del state["resblocks.4.convs2.1.bias"]
        return state, "resblocks.4.convs2.1.bias"
    if kind == "missing_wn":
        del state["ups.1.parametrizations.weight.original0"]
        return state, "ups.1.parametrizations.weight.original0"
    if kind == "unexpected":
        state["m_source.extra.weight"] = torch.zeros(3)
        return state, "m_source.extra.weight"
    if kind == "shape":
        state["m_source.l_linear.weight"] = torch.zeros(1, 8)
        return state, "m_source.l_linear.weight"
    state["conv_post.parametrizations.weight.original1"] = torch.zeros(18, 4, 5)
    return state, "conv_post.parametrizations.weight.original1"


@pytest.mark.parametrize("kind", ["missing", "missing_wn", "unexpected", "shape", "shape_wn"])
def test_loader_rejects_a_bad_state_naming_the_key(kind):
    state, key = _broken(kind)
    module = HiFT(SMALL)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ValueError, match=re.escape(key)):
        load_hift_state(module, state)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


# -- streaming ---------------------------------------------------------------------------


def direct(model: HiFT, mel: torch.Tensor) -> torch.Tensor:
    """The same layers evaluated once over the whole turn, with plain zero padding,
    torch's own centered STFT/iSTFT, and the phase summed from the first frame: an
    independent check of how `forward` rebuilds the turn's start inside its window."""
    cfg, spf = model.cfg, model.samples_per_frame
    with torch.inference_mode():
        f0 = model.f0_predictor(mel, None)  # [b, T] float64
        frames = f0.shape[1]
        harm = torch.arange(1, cfg.nb_harmonics + 2, dtype=torch.float64)
        turns = ((f0[:, :, None] * harm / cfg.sampling_rate) % 1).cumsum(1)  # [b, T, H]
        t = ((torch.arange(frames * spf, dtype=torch.float64) + 0.5) / spf - 0.5).clamp(min=0)
        i0 = t.floor().long()
        lam = (t - i0)[None, :, None]
        at = turns[:, i0] * (1 - lam) + turns[:, (i0 + 1).clamp(max=frames - 1)] * lam
        sines = cfg.nsf_alpha * torch.sin(2 * math.pi * ((spf * at) % 1))
        uv = (f0 > cfg.nsf_voiced_threshold).repeat_interleave(spf, 1)[:, :, None]
        noise = model.noise[torch.arange(frames * spf) % model.noise.shape[0]].double()
        amp = torch.where(uv, cfg.nsf_sigma, cfg.nsf_alpha / 3)
        waves = (sines * uv + amp * noise).float()
        s = torch.tanh(model.m_source.l_linear(waves))[:, :, 0]
        spec = torch.stft(s, 16, 4, 16, window=model.window, return_complex=True)
        spec = torch.cat([spec.real, spec.imag], dim=1)
        x = model.conv_pre(mel)
        for i, up in enumerate(model.ups):
            x = up(torch.nn.functional.leaky_relu(x, cfg.lrelu_slope))
            if i == len(model.ups) - 1:
                x = torch.nn.functional.pad(x, (1, 0), mode="reflect")
            x = x + model.source_resblocks[i](model.source_downs[i](spec), None)
            blocks = model.resblocks[3 * i : 3 * i + 3]
            x = (blocks[0](x, None) + blocks[1](x, None) + blocks[2](x, None)) / 3
        x = model.conv_post(torch.nn.functional.leaky_relu(x))
        mag, ph = torch.exp(x[:, :9]).clamp(max=1e2), torch.sin(x[:, 9:])
        y = torch.istft(torch.polar(mag, ph), 16, 4, 16, window=model.window)
    return y.clamp(-cfg.audio_limit, cfg.audio_limit)


def test_offline_equals_a_direct_whole_turn_evaluation(model, mel, offline):
    assert (offline - direct(model, mel)).abs().max() < TOL
    short = mel[:, :, :3]  # shorter than every receptive field
    assert (model(short) - direct(model, short)).abs().max() < TOL


def test_output_is_not_trivially_silent(model, mel, offline):
    assert offline.shape == (1, mel.shape[2] * 480)
    assert torch.isfinite(offline).all()
    assert offline.pow(2).mean().sqrt() > 0.05
    f0 = model.f0_predictor(mel, None)
    voiced = (f0 > model.cfg.nsf_voiced_threshold).float().mean()
    assert 0.2 < voiced < 0.98  # both voiced and unvoiced frames


@pytest.mark.parametrize(
    ("sizes", "frames"),
    [([8, 16, 32, 50], 90), ([3, 7], 50), ([50], 90), ([90], 90), ([13, 1, 29], 90), ([21], 63)],
)
def test_streaming_equals_offline(model, mel, offline, sizes, frames):
    expected = offline if frames == mel.shape[2] else model(mel[:, :, :frames])
    streamed = stream(model, mel[:, :, :frames], sizes)
    assert streamed.shape == expected.shape
    assert (streamed - expected).abs().max() < TOL


@pytest.mark.parametrize("zero_flush", [True, False])
def test_streaming_one_frame_chunks(model, mel, zero_flush):
    """Every chunk a single frame; the turn ends with a 0-frame flush or a final frame."""
    short = mel[:, :, 10:36]
    streamed = stream(model, short, [1], zero_flush)
    expected = model(short)
    assert streamed.shape == expected.shape
    assert (streamed - expected).abs().max() < TOL


def test_turn_shorter_than_hold_back(model, mel):
    short = mel[:, :, :7]
    assert (stream(model, short, [2]) - model(short)).abs().max() < TOL
    assert stream(model, mel[:, :, :0], [1]).shape == (1, 0)


def test_batched_sessions_at_different_positions_equal_separate_runs(model, mel):
    """Two turns batched mid-stream (one still near its start, one past it) give the
    same audio and states as running each alone; the concatenation of each turn's
    chunks equals its offline pass."""
    other = torch.randn(1, 80, 90, generator=torch.Generator().manual_seed(5))
    turns = [(mel, 25), (other, 60)]  # frames already received before the batch
    states, outs = [], []
    for m_, start in turns:
        state, pcm = model.initial_state(), []
        for i in range(0, start, 5):
            y, state = model.forward_chunk(m_[:, :, i : i + 5], state)
            pcm.append(y)
        states.append(state)
        outs.append(pcm)
    assert model.output_frames(25, 10, False) == model.output_frames(60, 10, False) == 10
    batch = {k: torch.cat([s[k] for s in states]) for k in states[0]}
    chunks = torch.cat([m_[:, :, s : s + 10] for m_, s in turns])
    pcm, batch_state = model.forward_chunk(chunks, batch)
    for j, (m_, start) in enumerate(turns):
        alone, state = model.forward_chunk(m_[:, :, start : start + 10], states[j])
        assert (pcm[j : j + 1] - alone).abs().max() < TOL
        split = {k: v[j : j + 1] for k, v in batch_state.items()}
        assert all((split[k].double() - state[k].double()).abs().max() < TOL for k in state)
        rest, _ = model.forward_chunk(m_[:, :, start + 10 :], split, final=True)
        full = torch.cat([*outs[j], pcm[j : j + 1], rest], dim=1)
        assert (full - model(m_)).abs().max() < TOL
    with pytest.raises(ValueError, match="different lengths"):
        model.forward_chunk(
            torch.cat([chunks, chunks]),
            {k: torch.cat([v, model.initial_state()[k].expand_as(v)]) for k, v in batch.items()},
        )


def test_state_has_constant_size_and_is_not_mutated(model):
    state = model.initial_state()
    shapes = {k: (v.shape, v.dtype) for k, v in state.items()}
    gen = torch.Generator().manual_seed(9)
    for step in range(30):
        before = {k: v.clone() for k, v in state.items()}
        pcm, new = model.forward_chunk(torch.randn(1, 80, 3, generator=gen), state)
        assert all(torch.equal(before[k], state[k]) for k in state)  # input untouched
        assert {k: (v.shape, v.dtype) for k, v in new.items()} == shapes
        assert pcm.shape == (
            1,
            max(3 * (step + 1) - model.hold_back, 0) * 480
            - max(3 * step - model.hold_back, 0) * 480,
        )
        state = new
    assert int(state["pos"]) == 90


def test_shorter_hold_back_is_approximate_and_measurably_so(mel, offline):
    """A hold-back below the receptive field keeps lengths and stays close, but is not
    exact with these weights (so the exact tests above can fail)."""
    for hold_back, crossfade, bound in ((16, 0, 1e-3), (12, 1, 0.3)):
        approx = small_model(hold_back=hold_back, crossfade=crossfade)
        streamed = stream(approx, mel, [10])
        err = (streamed - offline).abs().max()
        assert streamed.shape == offline.shape
        assert TOL < err < bound
        assert (approx(mel) - offline).abs().max() < TOL  # offline does not depend on it
