"""Carrying a trained LM and flow to a new codebook (voiceagent/train/inherit.py): each
new speech code starts as its nearest old code, so the carried LM speaks as the old one
did, its probability shared among siblings, and the carried flow hears each new code as
its parent."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from test_train_flow import SMALL as FLOW_SMALL
from test_train_flow import write_dataset
from test_train_lm import small_trainer, write_work

from voiceagent.cli import main
from voiceagent.model.contract import SPEECH_CODES
from voiceagent.model.lm import KVPool, SpeechLM
from voiceagent.train import flow_train, inherit, lm_train
from voiceagent.train.tokens import Codebook


def codebooks(old_codes: int, children: int, seed: int = 0) -> tuple[Codebook, Codebook, Any]:
    """An old codebook and a new one with `children` centroids close to each old one (in
    shuffled order, normalized otherwise); returns them and each new code's origin."""
    rng = np.random.default_rng(seed)
    old_mean, old_std = rng.normal(-5, 1, 160), rng.uniform(1, 2, 160)
    old = rng.normal(0, 1, (old_codes, 160))
    origin = rng.permutation(np.repeat(np.arange(old_codes), children))
    mel = (old[origin] + rng.normal(0, 0.05, (len(origin), 160))) * old_std + old_mean
    new_mean, new_std = mel.mean(0), mel.std(0)
    new = Codebook(new_mean, new_std, (mel - new_mean) / new_std)
    return Codebook(old_mean, old_std, old), new, origin


def test_each_new_code_s_parent_is_the_old_code_it_lies_nearest_in_mel() -> None:
    old, new, origin = codebooks(old_codes=40, children=3)
    np.testing.assert_array_equal(inherit.parents(new, old), origin)


def test_the_same_codebook_has_nothing_to_carry(tmp_path: Path) -> None:
    old, new, origin = codebooks(old_codes=40, children=3)
    (tmp_path / "tokens").mkdir()
    new.save(tmp_path / "tokens" / "codebook.npz")
    old.save(tmp_path / "old.npz")
    shutil.copyfile(tmp_path / "tokens" / "codebook.npz", tmp_path / "copy.npz")
    assert inherit.codebook_parents(tmp_path, None) is None
    assert inherit.codebook_parents(tmp_path, tmp_path / "copy.npz") is None
    parent = inherit.codebook_parents(tmp_path, tmp_path / "old.npz")
    np.testing.assert_array_equal(parent, origin)  # type: ignore[arg-type]


def speech_probs(lm: SpeechLM, text: list[int], speech: list[int]) -> torch.Tensor:
    pool = KVPool(lm.cfg, 1, 512, torch.device("cpu"))
    zero = torch.tensor([0])
    with torch.no_grad():
        logits = lm.forward_embeds(lm.prompt_embeds(text, speech), pool, zero, zero)[0]
    return logits.double().softmax(-1)


def test_a_carried_lm_gives_each_old_code_s_probability_to_its_children(tmp_path: Path) -> None:
    work = write_work(tmp_path)
    old_tr, train, _ = small_trainer(work)
    old = old_tr.lm.eval()
    with torch.no_grad():  # a head with opinions: unequal codes
        old.llm_decoder.bias.normal_(0, 2)
    torch.save({"model": old.state_dict()}, tmp_path / "old.pt")
    # 6,561 new codes from the first 500 old ones (an old LM's unused codes get no child)
    rng = np.random.default_rng(1)
    parent = np.concatenate([np.arange(500), rng.integers(0, 500, SPEECH_CODES - 500)])
    parent = rng.permutation(parent)
    torch.manual_seed(5)
    new = small_trainer(work)[0].lm.eval()
    assert lm_train.warm_started(new, tmp_path / "old.pt", parent) == len(old.state_dict())

    ex = train[0]
    speech = [int(c) for c in rng.integers(0, SPEECH_CODES, 12)]
    p_new = speech_probs(new, list(ex.text), speech)
    p_old = speech_probs(old, list(ex.text), [int(parent[c]) for c in speech])
    grouped = torch.zeros(SPEECH_CODES, dtype=torch.float64)
    grouped.index_add_(0, torch.from_numpy(parent).long(), p_new[:SPEECH_CODES])
    kept = torch.cat([p_old[:500], p_old[SPEECH_CODES:]])  # the codes with children, stops
    expected = kept / kept.sum()
    torch.testing.assert_close(torch.cat([grouped[:500], p_new[SPEECH_CODES:]]), expected)
    siblings = np.flatnonzero(parent == parent[speech[0]])
    assert len(siblings) > 1 and torch.allclose(p_new[siblings], p_new[siblings[0]])


def test_a_carried_flow_hears_each_new_code_as_its_parent(tmp_path: Path) -> None:
    work = write_dataset(tmp_path / "w")
    flow_train.train(work, 60, sizes=FLOW_SMALL, steps=2, say=lambda _: None)
    old_ckpt = flow_train.flow_dir(work) / flow_train.CHECKPOINT
    shutil.copyfile(old_ckpt, tmp_path / "old.pt")
    old_ckpt.unlink()
    parent = np.random.default_rng(2).integers(0, 16, SPEECH_CODES)
    flow_train.train(
        work, 60, steps=0, say=lambda _: None, warm_start=tmp_path / "old.pt", parent=parent
    )
    new = flow_train.trained_flow(work)
    old = flow_train.new_flow(FLOW_SMALL)
    old.load_state_dict(torch.load(tmp_path / "old.pt", weights_only=True)["model"])
    children = torch.randint(0, SPEECH_CODES, (1, 30), generator=torch.Generator().manual_seed(3))
    spk = flow_train.speaker_vector(work)[None]
    no_prompt = (torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, 80))
    mels = []
    for flow, toks in ((new, children), (old, torch.from_numpy(parent)[children])):
        torch.manual_seed(4)
        with torch.no_grad():
            mels.append(flow.eval().synthesize(toks, *no_prompt, spk))
    torch.testing.assert_close(mels[0], mels[1])


def test_train_flow_starts_from_another_codebook_s_flow_when_told_its_codebook(
    tmp_path: Path, capsys
) -> None:
    work = write_dataset(tmp_path / "w")
    old, new, _ = codebooks(old_codes=16, children=3)
    new.save(work / "tokens" / "codebook.npz")
    old.save(tmp_path / "old.npz")
    flow_train.train(work, 60, sizes=FLOW_SMALL, steps=1, say=lambda _: None)
    ckpt = flow_train.flow_dir(work) / flow_train.CHECKPOINT
    ckpt.rename(tmp_path / "old.pt")
    args = ["train", "flow", "--out", str(work), "--budget-min", "0.01"]
    args += ["--warm-start", str(tmp_path / "old.pt"), "--warm-codes", str(tmp_path / "old.npz")]
    assert main(args) in (0, None)
    assert f"starting from {tmp_path / 'old.pt'}" in capsys.readouterr().out
    assert ckpt.is_file()


def test_a_missing_warm_start_file_is_an_error_before_any_training(tmp_path: Path, capsys) -> None:
    work = write_dataset(tmp_path / "w")
    (work / "tokens" / "codebook.npz").write_bytes(b"")
    base = ["train", "flow", "--out", str(work), "--budget-min", "0.01"]
    assert main([*base, "--warm-start", str(tmp_path / "none.pt")]) == 2
    assert f"--warm-start {tmp_path / 'none.pt'}: no such file" in capsys.readouterr().err
    assert main([*base, "--warm-codes", str(work / "tokens" / "codebook.npz")]) == 2
    assert "--warm-codes goes with --warm-start" in capsys.readouterr().err
    assert not (flow_train.flow_dir(work) / flow_train.CHECKPOINT).exists()
