"""Training the flow of a voice of our own (voiceagent/train/flow_train.py, docs/training.md).

The flow learns speech tokens -> mel by conditional flow matching through the same
modules and masks inference runs. These tests use a synthetic work directory in the
on-disk format of the feats and tokens stages: a few utterances whose mel is a fixed
pattern per token, at the small test sizes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from voiceagent.cli import main
from voiceagent.model import checkpoint
from voiceagent.model.cosyvoice2.flow_decoder import mish
from voiceagent.model.cosyvoice2.random_checkpoint import SIZES, write_random_cosyvoice2
from voiceagent.train import feats, flow_train
from voiceagent.train.flow_train import Data, Params, make_batch
from voiceagent.train.sizes import FLOW_START_T, FLOW_STEPS

SMALL = flow_train.flow_sizes(SIZES["small"])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_dataset(work: Path, train: int = 6, heldout: int = 2, seed: int = 0) -> Path:
    """teacher/manifest.tsv, feats/<id>.npz (+ stage.json), tokens/tokens.npz (+ stage.json):
    each token is a pair of mel frames drawn from one of 16 fixed patterns."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(-5.0, 2.0, (16, 160)).astype(np.float32)
    for d in ("teacher", "feats", "tokens"):
        (work / d).mkdir(parents=True, exist_ok=True)
    rows, toks = ["id\tseconds\ttext\tsplit"], {}
    for i in range(train + heldout):
        uid, split = f"synth-{i:03d}", "train" if i < train else "heldout"
        n = int(rng.integers(20, 45))
        tok = rng.integers(0, 16, n)
        mel = patterns[tok].reshape(2 * n, 80)
        np.savez(work / "feats" / f"{uid}.npz", wav=np.zeros(960 * n, np.int16), mel=mel)
        toks[uid] = tok.astype(np.int16)
        rows.append(f"{uid}\t{n * 0.04:.3f}\tsentence {i}\t{split}")
    (work / "teacher" / "manifest.tsv").write_text("\n".join(rows) + "\n")
    np.savez(work / "tokens" / "tokens.npz", **toks)  # type: ignore[arg-type]
    for d in ("feats", "tokens"):  # complete for this manifest
        (work / d / "stage.json").write_text(json.dumps({"manifest": feats.manifest_digest(work)}))
    return work


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("train"))


def test_the_loss_falls_on_a_fixed_batch(work: Path) -> None:
    data = Data(work, "train")
    flow = flow_train.new_flow(SMALL)
    p = Params(cfg_drop=0.0)
    batch = make_batch(data, 0, p, flow_train.speaker_vector(work), flow.cfg, items=[0, 1, 2])
    opt = torch.optim.Adam(flow.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = flow.training_loss(**batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.3 * losses[0], losses


@pytest.mark.parametrize("streaming", [False, True])
@torch.no_grad()
def test_padding_in_a_batch_changes_no_utterance_s_loss(work: Path, streaming: bool) -> None:
    """Utterances of different lengths batch together: trailing padding is masked in
    every attention and the convolutions are causal, so each utterance's loss is the one
    it has alone (the batch loss is their frame-weighted mean)."""
    data = Data(work, "train")
    flow = flow_train.new_flow(SMALL).eval()
    speaker = flow_train.speaker_vector(work)
    p = Params(cfg_drop=0.0, prompt_rate=1.0)
    short, long = sorted(range(len(data)), key=lambda i: data.lengths[i])[::5][:2]
    both = make_batch(data, 3, p, speaker, flow.cfg, items=[short, long])
    both["streaming"] = streaming
    assert both["lengths"][0] < both["lengths"][1]
    frames = both["lengths"].double()
    alone = []
    for row in range(2):
        n = int(both["lengths"][row])
        one = {k: v[row : row + 1] if isinstance(v, torch.Tensor) else v for k, v in both.items()}
        one["tokens"] = one["tokens"][:, : n + flow.cfg.pre_lookahead]
        for k in ("mel", "cond", "noise"):
            one[k] = one[k][:, :, : 2 * n]
        alone.append(float(flow.training_loss(**one)))
    expected = float((torch.tensor(alone, dtype=torch.float64) * frames).sum() / frames.sum())
    assert float(flow.training_loss(**both)) == pytest.approx(expected, rel=1e-5)


@torch.no_grad()
def test_a_dropped_condition_hides_tokens_speaker_and_prompt(work: Path) -> None:
    """CFG training: a dropped row's velocity sees neither its tokens, nor the speaker, nor
    the prompt mel (inference guides against exactly such a row). The prior, a loss on the
    encoder alone, still reads every row's tokens, so it is off here."""
    data = Data(work, "train")
    flow = flow_train.new_flow(SMALL).eval()
    p = Params(prompt_rate=1.0, prior=0.0)
    batch = make_batch(data, 0, p, flow_train.speaker_vector(work), flow.cfg, items=[0])
    batch["keep"] = torch.tensor([False])
    other = dict(batch)
    other["tokens"] = torch.where(batch["tokens"] >= 0, (batch["tokens"] + 7) % 16, -1)
    other["cond"] = batch["cond"] + 1.0
    other["spk"] = -batch["spk"]
    assert float(flow.training_loss(**other)) == pytest.approx(
        float(flow.training_loss(**batch)), rel=1e-6
    )
    batch["keep"] = torch.tensor([True])
    other["keep"] = torch.tensor([True])
    assert float(flow.training_loss(**other)) != pytest.approx(float(flow.training_loss(**batch)))


def test_training_resumes_from_its_checkpoint_as_if_never_stopped(
    work: Path, tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        shutil.copytree(work, d)
    first = flow_train.train(a, 60, sizes=SMALL, steps=3, say=lambda _: None)
    assert first["step"] == 3 and (a / "flow" / "checkpoint.pt").is_file()
    again = flow_train.train(a, 60, steps=2, say=lambda _: None)
    assert again["step"] == 5 and again["steps"] == 2
    straight = flow_train.train(b, 60, sizes=SMALL, steps=5, say=lambda _: None)
    assert straight["step"] == 5
    resumed, whole = flow_train.export_state(a), flow_train.export_state(b)
    for key in whole:
        torch.testing.assert_close(resumed[key], whole[key], rtol=0, atol=1e-6)
    log = (a / "flow" / "log.tsv").read_text().splitlines()
    assert log[0].split("\t")[:4] == ["step", "seconds", "split", "loss"]
    assert [r.split("\t")[2] for r in log[1:]].count("heldout") == 3  # start, 2 ends
    with pytest.raises(ValueError, match="sizes"):
        flow_train.train(a, 60, sizes={**SMALL, "flow_dim": 32}, steps=1)


def test_training_stops_at_its_budget(work: Path, tmp_path: Path) -> None:
    shutil.copytree(work, tmp_path / "w")
    summary = flow_train.train(tmp_path / "w", 1.0, sizes=SMALL, say=lambda _: None)
    assert summary["steps"] >= 1
    assert summary["wall_seconds"] < 10
    assert summary["frames_per_s"] > 0


def test_the_exported_flow_loads_with_the_project_loader_and_synthesizes(
    work: Path, tmp_path: Path
) -> None:
    shutil.copytree(work, tmp_path / "w")
    flow_train.train(tmp_path / "w", 60, sizes=SMALL, steps=2, say=lambda _: None)
    model_dir = write_random_cosyvoice2(tmp_path / "model", "small")
    torch.save(flow_train.export_state(tmp_path / "w"), model_dir / "flow.pt")
    yaml = model_dir / "cosyvoice2.yaml"  # our voice's flow start, as the export writes it
    cfg = "inference_cfg_rate: 0.7\n"
    pad = " " * 16
    start = f"{cfg}{pad}start_t: {FLOW_START_T}\n{pad}n_timesteps: {FLOW_STEPS}\n"
    yaml.write_text(yaml.read_text().replace(cfg, start))
    model = checkpoint.load(model_dir)
    ours = flow_train.trained_flow(tmp_path / "w")
    data = Data(tmp_path / "w", "heldout")
    speaker = flow_train.speaker_vector(tmp_path / "w")
    prompt = (data.tokens[1][:10], data.mels[1][:, :20])
    loaded = flow_train.mel_l1(model.flow, data, [0], speaker, prompt)  # type: ignore[arg-type]
    assert loaded == flow_train.mel_l1(ours, data, [0], speaker, prompt)
    check = flow_train.evaluate(tmp_path / "w", n=2)
    assert set(check) == {
        f"{who}_{how}"
        for who in ("trained", "random")
        for how in ("no_prompt", "prompt", "streaming")
    } | {"mean_frame"}
    assert all(np.isfinite(v) and v > 0 for v in check.values())
    voice = model.voices["agent"]
    audio = model.synthesize_offline(data.tokens[0].tolist(), voice)
    assert audio.size > 0 and np.isfinite(audio).all()


def test_voiceagent_train_flow_trains_for_its_budget(work: Path, tmp_path: Path, capsys) -> None:
    shutil.copytree(work, tmp_path / "w")
    code = main(["train", "flow", "--out", str(tmp_path / "w"), "--budget-min", "0.02"])
    assert code in (0, None)
    assert (tmp_path / "w" / "flow" / "checkpoint.pt").is_file()
    assert "'step':" in capsys.readouterr().out


def test_train_flow_until_step_trains_what_is_left_of_a_step_target(
    work: Path, tmp_path: Path
) -> None:
    w = tmp_path / "w"
    shutil.copytree(work, w)
    for target, reached in ((2, 2), (3, 3), (3, 3), (1, 3)):  # no time limit: the step ends it
        assert main(["train", "flow", "--out", str(w), "--until-step", str(target)]) == 0
        assert flow_train.load_checkpoint(w)["step"] == reached


def test_the_estimator_s_mish_has_f_mish_values_and_gradient() -> None:
    x = torch.linspace(-30, 30, 2001, dtype=torch.float64, requires_grad=True)
    ours = mish(x)
    (grad,) = torch.autograd.grad(ours.sum(), x)
    y = x.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.mish(y)
    (ref_grad,) = torch.autograd.grad(ref.sum(), y)
    assert torch.equal(ours.detach(), ref.detach())
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-12)


def test_the_prior_pulls_the_encoder_s_output_onto_the_mel(work: Path) -> None:
    """`prior`: the loss also holds the squared error of mu (the encoder's output) against
    the target mel, so training makes mu itself a mel of the tokens; without it nothing
    asks mu to look like the mel."""
    data = Data(work, "train")
    speaker = flow_train.speaker_vector(work)

    def mu_error(flow: flow_train.CosyFlow, batch: dict) -> float:
        with torch.no_grad():
            with_prior = float(flow.training_loss(**{**batch, "prior": 1.0}))
            return with_prior - float(flow.training_loss(**{**batch, "prior": 0.0}))

    errors = {}
    for prior in (0.0, 1.0):
        flow = flow_train.new_flow(SMALL)
        batch = make_batch(data, 0, Params(cfg_drop=0.0, prior=prior), speaker, flow.cfg, [0, 1])
        assert batch["prior"] == prior
        opt = torch.optim.Adam(flow.parameters(), lr=3e-3)
        start = mu_error(flow, batch)
        for _ in range(40):
            loss = flow.training_loss(**batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        errors[prior] = mu_error(flow, batch) / start
    assert errors[1.0] < 0.3 and errors[1.0] < 0.5 * errors[0.0], errors


@torch.no_grad()
def test_a_bfloat16_step_computes_nearly_the_float32_loss(work: Path) -> None:
    """`Params.bf16`: the training step's forward under bfloat16 autocast where the CPU
    has the kernels (the weights stay float32); without it, float32 exactly."""
    from voiceagent.train.update import step_precision

    data = Data(work, "train")
    flow = flow_train.new_flow(SMALL).eval()
    batch = make_batch(data, 0, Params(), flow_train.speaker_vector(work), flow.cfg, [0, 1])
    exact = float(flow.training_loss(**batch))
    with step_precision(False):
        assert float(flow.training_loss(**batch)) == exact
    with step_precision(True):
        mixed = float(flow.training_loss(**batch))
    assert mixed == pytest.approx(exact, rel=0.03)
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert mixed != exact  # it did run in bfloat16
    assert {p.dtype for p in flow.parameters()} == {torch.float32}


def test_the_flow_trains_on_the_device_asked_for_as_it_does_on_the_cpu(
    work: Path, tmp_path: Path, train_device: torch.device
) -> None:
    """The same steps on another device end at the same weights (float32; batches are
    drawn on the CPU and moved), and the checkpoint loads on the CPU."""
    params = Params(bf16=False)
    states, runs = [], []
    for name, device in (("cpu", torch.device("cpu")), ("other", train_device)):
        shutil.copytree(work, tmp_path / name)
        runs.append(
            flow_train.train(
                tmp_path / name,
                600,
                sizes=SMALL,
                params=params,
                steps=3,
                say=lambda _: None,
                device=device,
            )
        )
        states.append(flow_train.export_state(tmp_path / name))  # loads on the CPU
    assert [r["device"] for r in runs] == ["cpu", str(train_device)]
    assert all(v.device.type == "cpu" for v in states[1].values())
    for key, weight in states[0].items():
        torch.testing.assert_close(states[1][key], weight, rtol=1e-4, atol=1e-5, msg=key)
    assert runs[0]["heldout_last"] == pytest.approx(runs[1]["heldout_last"], rel=1e-3)


def test_an_anneal_ends_training_on_a_falling_rate_and_keeps_the_flow_before_it(
    work: Path, tmp_path: Path, learning_rates: Callable[[Any], list[float]]
) -> None:
    w = tmp_path / "w"
    shutil.copytree(work, w)
    params = Params(warmup=1)
    quiet = dict(say=lambda _: None)
    with pytest.raises(ValueError, match="nothing to anneal"):
        flow_train.train(w, 60, sizes=SMALL, params=params, anneal=4, **quiet)  # type: ignore[arg-type]
    flow_train.train(w, 60, sizes=SMALL, params=params, steps=2, **quiet)  # type: ignore[arg-type]
    before = flow_train.load_checkpoint(w)
    rates = learning_rates(flow_train)
    assert flow_train.train(w, 60, anneal=4, steps=2, **quiet)["step"] == 4  # type: ignore[arg-type]
    assert flow_train.train(w, 60, **quiet)["step"] == 6  # type: ignore[arg-type]  # its end
    assert flow_train.train(w, 60, steps=1, **quiet)["step"] == 7  # type: ignore[arg-type]
    kept = torch.load(flow_train.before_anneal_path(w), weights_only=True)
    assert kept["step"] == 2
    assert all(torch.equal(v, kept["model"][k]) for k, v in before["model"].items())  # type: ignore[index]
    lr = params.lr
    assert rates == pytest.approx(
        [lr, lr * (1 - 0.95 / 4), lr * (1 - 0.95 / 2), lr * (1 - 0.95 * 3 / 4), lr]
    )
    assert flow_train.load_checkpoint(w)["params"]["anneal_steps"] == 0  # type: ignore[index]
