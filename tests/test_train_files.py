"""A training run can be killed at any moment (a machine's three hours run out, a ^C) and
the same command started again: no file it leaves may look done while half written. A
kill is a process dying mid-write; here an exception at that point stands in for it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from voiceagent.cli import main
from voiceagent.train import corpus, feats, files, lm_train, tokens, update, vocoder_train


class Killed(Exception):
    """The process died here."""


def test_a_file_written_is_the_old_one_or_the_new_one_never_part_of_one(tmp_path) -> None:
    path = tmp_path / "tokens.npz"
    np.savez(path, a=np.arange(3))
    with pytest.raises(Killed), files.written(path) as tmp:
        tmp.write_bytes(b"PK\x03\x04 half of a zip")
        raise Killed
    with np.load(path) as f:
        assert f["a"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["tokens.npz"]  # no leftover
    with files.written(path) as tmp:
        np.savez(tmp, a=np.arange(5))  # (np.savez keeps a name that ends in .npz)
    with np.load(path) as f:
        assert f["a"].tolist() == [0, 1, 2, 3, 4]


def test_a_stage_marker_that_cannot_be_read_means_not_done(tmp_path) -> None:
    # what was seen: an empty stage.json failed every later run at json.loads, and the
    # corpus's counted as complete
    for folder in (corpus.corpus_dir(tmp_path), feats.feats_dir(tmp_path)):
        folder.mkdir(parents=True)
        (folder / "stage.json").write_text("")
    assert not corpus.is_complete(tmp_path)
    assert not feats.is_complete(tmp_path)
    files.write_json(corpus.corpus_dir(tmp_path) / "stage.json", {"params": {}})
    assert corpus.is_complete(tmp_path)


def test_tokens_killed_while_written_leave_none_and_the_next_run_makes_them(
    tmp_path, monkeypatch
) -> None:
    # what was seen: a 0-byte tokens.npz, which every later run failed to read
    path = tokens.tokens_dir(tmp_path) / "tokens.npz"
    path.parent.mkdir(parents=True)

    def dies(file, **arrays):
        Path(file).write_bytes(b"PK")  # part of the zip
        raise Killed

    monkeypatch.setattr(np, "savez_compressed", dies)
    with pytest.raises(Killed):
        tokens.save_tokens(path, {"u1": np.arange(4)})
    assert not tokens.has_tokens(tmp_path)
    monkeypatch.undo()
    tokens.save_tokens(path, {"u1": np.arange(4)})
    assert tokens.load_tokens(tmp_path)["u1"].tolist() == [0, 1, 2, 3]


def test_the_same_anneal_cut_short_goes_on_and_keeps_the_weights_before_it(tmp_path) -> None:
    """What was seen: `--anneal 4` killed at step 5 of an anneal begun at 3 began a new
    one at 5 when run again, and copied the half-annealed weights over the ones before
    the anneal."""
    checkpoint, kept = tmp_path / "checkpoint.pt", tmp_path / "checkpoint-before-anneal.pt"
    torch.save({"step": 3}, checkpoint)
    assert update.anneal_span((0, 0), 3, 4, checkpoint, kept) == (3, 4)
    assert torch.load(kept)["step"] == 3
    torch.save({"step": 5}, checkpoint)  # two steps into it, then killed
    assert update.anneal_span((3, 4), 5, 4, checkpoint, kept) == (3, 4)  # the same again
    assert torch.load(kept)["step"] == 3
    assert update.anneal_span((3, 4), 5, None, checkpoint, kept) == (3, 4)  # plain resume
    torch.save({"step": 7}, checkpoint)  # done: a new anneal asked for is a new one
    assert update.anneal_span((3, 4), 7, 2, checkpoint, kept) == (7, 2)
    assert torch.load(kept)["step"] == 7


def test_the_vocoder_stage_trains_on_the_threads_it_is_given(tmp_path, monkeypatch) -> None:
    # what was seen: `train vocoder --threads 2` trained on one (train's own default)
    seen = {}

    def train(work, budget_s, **kwargs):
        seen.update(kwargs)
        return {"last": {}, "step": 1, "steps": 1, "wall_s": 0, "device": "cpu",
                "audio_s_per_s": 0}  # fmt: skip

    monkeypatch.setattr(vocoder_train, "train", train)
    list(vocoder_train.run(tmp_path, 1.0, check=0))
    assert "threads" in seen and seen["threads"] is None  # the caller's torch threads


@pytest.mark.parametrize(
    ("flags", "budget_s"),
    [
        ([], 240.0),
        (["--anneal", "3000"], math.inf),
        (["--anneal", "3000", "--budget-min", "2"], 120.0),
    ],
)
def test_an_anneal_asked_for_trains_to_its_end_unless_a_budget_is_given(
    tmp_path, monkeypatch, flags, budget_s
) -> None:
    # what was seen: `train lm --anneal 3000` stopped after four minutes, 630 steps in
    seen = {}
    monkeypatch.setattr(lm_train, "train", lambda work, budget, **kw: seen.update(budget=budget))
    tokens.tokens_dir(tmp_path).mkdir(parents=True)
    tokens.save_tokens(tokens.tokens_dir(tmp_path) / "tokens.npz", {"u1": np.arange(4)})
    assert main(["train", "lm", "--out", str(tmp_path), *flags]) == 0
    assert seen["budget"] == budget_s


def test_markers_are_json_objects(tmp_path) -> None:
    files.write_json(tmp_path / "stage.json", ["a list"])
    assert json.loads((tmp_path / "stage.json").read_text()) == ["a list"]
    assert files.read_marker(tmp_path / "stage.json") is None
