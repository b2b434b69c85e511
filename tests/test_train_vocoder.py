"""Training the HiFT vocoder of our own voice (voiceagent/train/vocoder_train.py).

The data is a tiny synthetic work directory in the feats stage's on-disk format:
"utterances" of harmonic tones with gliding pitch, noise bursts and silence at 24 kHz,
with the flow's mel of each. It is enough to show that the losses are the right ones,
that training learns, resumes where it stopped, and exports a vocoder the project's
loader reads and streams like the released one.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from voiceagent.audio.features import prompt_mel
from voiceagent.cli import main
from voiceagent.model import checkpoint
from voiceagent.model.cosyvoice2 import random_checkpoint
from voiceagent.model.cosyvoice2.hift import HiFT
from voiceagent.train import feats
from voiceagent.train import vocoder_train as vt
from voiceagent.train.sizes import VOICE

RATE = 24000
SMALL = {"hift_channels": 32}  # fast enough for dozens of steps in a test


def tone(f0: np.ndarray, harmonics: int = 12) -> np.ndarray:
    """A harmonic tone following a per-sample F0 contour (Hz)."""
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    return sum(np.sin(k * phase) / k for k in range(1, harmonics + 1)) * 0.15


def utterance(seed: int, seconds: float) -> np.ndarray:
    """Silence, a gliding tone, a noise burst, another tone, silence."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE) // 480 * 480
    x = np.zeros(n)
    a, b, c = int(0.1 * n), int(0.55 * n), int(0.7 * n)
    t = np.arange(b - a) / RATE
    x[a:b] = tone(rng.uniform(90, 140) + 20 * np.sin(2 * np.pi * 2 * t))
    x[b:c] = rng.normal(0, 0.05, c - b)
    x[c : int(0.9 * n)] = tone(np.full(int(0.9 * n) - c, rng.uniform(100, 200)))
    return x.astype(np.float32)


def write_work(work: Path, n: int = 6) -> None:
    """teacher/manifest.tsv and feats/<id>.npz + stage.json, as the stages write them."""
    (work / "teacher").mkdir(parents=True)
    (work / "feats").mkdir()
    rows = ["id\tseconds\ttext\tsplit"]
    for i in range(n):
        wav = utterance(i, 1.2 + 0.2 * i)
        feats.save(work / "feats" / f"u{i}.npz", wav, prompt_mel(wav))
        split = "heldout" if i == n - 1 else "train"
        rows.append(f"u{i}\t{len(wav) / RATE:.3f}\thello there\t{split}")
    (work / "teacher" / "manifest.tsv").write_text("\n".join(rows) + "\n")
    digest = feats.manifest_digest(work)
    (work / "feats" / "stage.json").write_text(json.dumps({"utterances": n, "manifest": digest}))


@pytest.fixture(autouse=True)
def one_thread():
    """As training runs: one thread (on a shared 2-core machine, more is much slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    write_work(tmp_path / "w")
    return tmp_path / "w"


# -- what the losses measure ----------------------------------------------------------


def test_log_mel_is_the_flows_prompt_mel_in_torch_and_differentiable() -> None:
    wav = utterance(0, 1.0)
    want = prompt_mel(wav)
    exact = vt.log_mel(torch.from_numpy(wav).double()[None])[0].numpy()
    assert exact.shape == want.shape
    assert np.abs(exact - want).max() < 1e-5  # the same filters, padding and floor
    x = torch.from_numpy(wav)[None].requires_grad_()
    got = vt.log_mel(x)  # float32, as trained: rounding only, in the quietest bins
    assert np.abs(got[0].detach().numpy() - want).max() < 0.01
    got.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_stft_loss_is_zero_for_the_same_audio_and_grows_with_the_difference() -> None:
    real = torch.from_numpy(utterance(1, 1.0))[None]
    zero = vt.stft_loss(real, real)
    assert float(zero[0]) < 1e-6 and float(zero[1]) < 1e-6
    rng = torch.Generator().manual_seed(0)
    small = vt.stft_loss(real + 0.001 * torch.randn(real.shape, generator=rng), real)
    large = vt.stft_loss(real + 0.05 * torch.randn(real.shape, generator=rng), real)
    assert 0 < small[0] < large[0] and 0 < small[1] < large[1]


# -- the pitch tracker ----------------------------------------------------------------


@pytest.mark.parametrize("f0", [70.0, 110.0, 180.0, 260.0, 400.0])
def test_pitch_of_a_harmonic_tone_is_its_f0_at_every_mel_frame(f0: float) -> None:
    wav = tone(np.full(480 * 50, f0))
    got = vt.pitch(wav)
    assert got.shape == (50,)
    assert np.abs(got[1:-1] / f0 - 1).max() < 0.01


def test_pitch_follows_a_glide_and_is_zero_in_silence_and_noise() -> None:
    n = 480 * 150
    f0 = 120 + 40 * np.sin(2 * np.pi * np.arange(n) / RATE)
    wav = tone(f0)
    wav[: 480 * 50] = 0.0  # silence
    wav[480 * 100 :] = np.random.default_rng(0).normal(0, 0.1, 480 * 50)  # noise
    got = vt.pitch(wav)
    centres = f0[240::480]
    assert (got[:49] == 0).all()
    assert (got[101:] == 0).mean() > 0.95
    assert np.abs(got[52:98] / centres[52:98] - 1).max() < 0.02


def test_f0_table_is_computed_once_and_cached(work: Path) -> None:
    table = vt.f0_table(work)
    assert sorted(table) == [f"u{i}" for i in range(6)]
    _, mel = feats.load(work, "u0")
    assert len(table["u0"]) == len(mel) and (table["u0"] > 0).any()
    assert (vt.vocoder_dir(work) / "f0.npz").is_file()
    assert vt.f0_table(work, ["u0"])["u0"].tolist() == table["u0"].tolist()


# -- training -------------------------------------------------------------------------


def test_segment_synthesis_is_the_offline_vocoder_with_the_source_driven_by_a_given_f0(
    work: Path,
) -> None:
    """`HiFT.segment` (the training forward) computes what `forward` (inference) does,
    up to the sine phase's origin, so driving it with the same F0 as the predictor and
    comparing where only the mel path matters (unvoiced: no sines) must agree."""
    model = vt.new_model(SMALL).eval()
    _, mel = feats.load(work, "u1")
    m = torch.from_numpy(mel).T[None]
    with torch.no_grad():
        unvoiced = torch.zeros(1, m.shape[2])
        model.f0_predictor.classifier.weight.zero_()  # the predictor says "unvoiced" too
        model.f0_predictor.classifier.bias.zero_()
        trained_path = model.segment(m, unvoiced, [0])
    offline = model(m)
    assert trained_path.shape == offline.shape
    assert (trained_path.clamp(-0.99, 0.99) - offline).abs().max() < 1e-4


def test_training_overfits_a_fixed_batch(work: Path) -> None:
    torch.manual_seed(0)
    model = vt.new_model(SMALL)
    data = vt.Segments(work, [f"u{i}" for i in range(5)], segment=24)
    batch = data.batch(0, 4)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    seen = []
    for _ in range(40):
        parts = vt.losses(model, batch)
        opt.zero_grad()
        parts["loss"].backward()
        opt.step()
        seen.append({k: float(v.detach()) for k, v in parts.items()})
    assert seen[-1]["loss"] < 0.6 * seen[0]["loss"]
    assert seen[-1]["mel"] < 0.6 * seen[0]["mel"]
    assert seen[-1]["f0"] < 0.5 * seen[0]["f0"]


def test_train_stops_at_its_budget_and_a_resumed_run_is_the_run_it_continued(
    tmp_path: Path,
) -> None:
    """3 steps + 2 resumed steps leave exactly the weights of 5 steps in one go: the
    checkpoint holds model, optimizer and step, and batches depend on the step only
    (and so does the source's F0: the teacher's for 4 steps here, then the predictor's)."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_work(a)
    write_work(b)
    kw = dict(sizes=SMALL, batch=2, segment=16, log_every=1, teacher_f0_steps=4)
    first = vt.train(a, 600, max_steps=3, **kw)
    assert first["step"] == 3 and first["steps"] == 3
    assert vt.load_checkpoint(a)["step"] == 3  # type: ignore[index]
    resumed = vt.train(a, 600, max_steps=5, **kw)
    assert resumed["step"] == 5 and resumed["steps"] == 2
    straight = vt.train(b, 600, max_steps=5, **kw)
    assert straight["step"] == 5
    wa, wb = vt.trained_model(a).state_dict(), vt.trained_model(b).state_dict()
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    log = (a / "vocoder" / "log.tsv").read_text().splitlines()
    assert log[0].split("\t") == list(vt.LOG_COLUMNS)
    assert [int(r.split("\t")[0]) for r in log[1:]] == [1, 2, 3, 4, 5]
    stopped = vt.train(a, 0.0, **kw)  # no time left: no step, the checkpoint is kept
    assert stopped["steps"] == 0 and vt.load_checkpoint(a)["step"] == 5  # type: ignore[index]


def test_a_batch_whose_loss_is_not_finite_is_skipped_and_the_weights_stay_finite(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One NaN update makes every weight NaN (seen in a long run): such a batch is
    skipped, counted, and a checkpoint is never written from non-finite weights."""
    real = vt.losses
    calls = []

    def second_is_nan(model: object, batch: object, source: str = "predicted") -> dict:
        parts = real(model, batch, source)  # type: ignore[arg-type]
        calls.append(source)
        if len(calls) == 2:
            parts["loss"] = parts["loss"] * float("nan")
        return parts

    monkeypatch.setattr(vt, "losses", second_is_nan)
    out = vt.train(work, 600, max_steps=3, sizes=SMALL, batch=2, segment=16, log_every=1)
    assert out["step"] == 3 and out["skipped"] == 1
    weights = vt.trained_model(work).state_dict()
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


def test_exported_vocoder_loads_with_the_projects_loader_and_streams_exactly(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vt.train(work, 600, sizes=VOICE, batch=2, segment=16, max_steps=2)
    state = vt.export_state(work)
    monkeypatch.setitem(random_checkpoint.SIZES, "voice", VOICE)
    model_dir = random_checkpoint.write_random_cosyvoice2(tmp_path / "model", "voice")
    released = torch.load(model_dir / "hift.pt", weights_only=True)
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in released.items()}
    torch.save(state, model_dir / "hift.pt")

    vocoder = checkpoint.load(model_dir).vocoder
    assert isinstance(vocoder, HiFT)
    trained = vt.trained_model(work).state_dict()
    loaded = vocoder.state_dict()
    assert all(torch.allclose(trained[k], loaded[k], atol=1e-6) for k in trained)

    _, mel = feats.load(work, "u5")
    m = torch.from_numpy(mel).T[None]
    offline = vocoder(m)
    assert offline.shape == (1, mel.shape[0] * 480) and offline.abs().max() > 0
    state_s, pieces = vocoder.initial_state(), []
    for i in range(0, m.shape[2], 7):
        chunk = m[:, :, i : i + 7]
        out, state_s = vocoder.forward_chunk(chunk, state_s, final=i + 7 >= m.shape[2])
        pieces.append(out)
    streamed = torch.cat(pieces, dim=1)
    assert streamed.shape == offline.shape
    assert (streamed - offline).abs().max() < 3e-5


def test_the_vocoder_stage_trains_for_its_budget_and_reports(work: Path, capsys) -> None:
    code = main(["train", "vocoder", "--out", str(work), "--budget-min", "0.05", "--check", "1"])
    assert code == 0
    out = capsys.readouterr().out
    assert "vocoder: step" in out and "held-out u5" in out
    assert (work / "vocoder" / "checkpoint.pt").is_file()


def test_train_vocoder_until_step_trains_what_is_left_of_a_step_target(work: Path) -> None:
    for target, reached in ((2, 2), (3, 3), (3, 3)):  # no time limit: the step ends it
        argv = ["train", "vocoder", "--out", str(work), "--until-step", str(target)]
        assert main([*argv, "--check", "0"]) == 0
        assert vt.load_checkpoint(work)["step"] == reached


def test_the_vocoder_trains_on_the_device_asked_for_as_it_does_on_the_cpu(
    tmp_path: Path, train_device: torch.device
) -> None:
    """The same steps on another device end at the same weights (batches are drawn on
    the CPU and moved), and the checkpoint loads on the CPU."""
    kw = dict(sizes=SMALL, batch=2, segment=16, max_steps=3, teacher_f0_steps=2)
    runs, weights = [], []
    for name, device in (("cpu", torch.device("cpu")), ("other", train_device)):
        write_work(tmp_path / name)
        runs.append(vt.train(tmp_path / name, 600, device=device, **kw))  # type: ignore[arg-type]
        weights.append(vt.trained_model(tmp_path / name).state_dict())  # on the CPU
    assert [r["device"] for r in runs] == ["cpu", str(train_device)]
    for key, weight in weights[0].items():
        assert weights[1][key].device.type == "cpu"
        torch.testing.assert_close(weights[1][key], weight, rtol=1e-4, atol=1e-5, msg=key)


def test_an_anneal_ends_training_on_a_falling_rate_and_keeps_the_vocoder_before_it(
    work: Path, learning_rates: Callable[[Any], list[float]]
) -> None:
    kw = dict(sizes=SMALL, batch=2, segment=16, log_every=1)
    with pytest.raises(ValueError, match="nothing to anneal"):
        vt.train(work, 600, anneal=4, **kw)  # type: ignore[arg-type]
    vt.train(work, 600, max_steps=3, **kw)  # type: ignore[arg-type]
    before = vt.load_checkpoint(work)
    rates = learning_rates(vt)
    assert vt.train(work, 600, anneal=5, max_steps=5, **kw)["step"] == 5  # type: ignore[arg-type]
    assert vt.train(work, 600, **kw)["step"] == 8  # type: ignore[arg-type]  # finished, stopped
    assert vt.train(work, 600, max_steps=10, **kw)["step"] == 10  # type: ignore[arg-type]
    kept = torch.load(vt.before_anneal_path(work), weights_only=True)
    assert kept["step"] == 3
    assert all(torch.equal(v, kept["model"][k]) for k, v in before["model"].items())  # type: ignore[index]
    assert rates[0] == vt.LR  # steps 3..7 anneal, then 8 and 9 at the full rate
    assert all(a > b for a, b in itertools.pairwise(rates[:5]))
    assert rates[4] == pytest.approx(vt.LR * (1 - 0.95 * 4 / 5))
    assert rates[5:] == [vt.LR, vt.LR]
    assert vt.load_checkpoint(work)["anneal_steps"] == 0  # type: ignore[index]
