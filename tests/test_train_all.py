"""`voiceagent train all`: the whole pipeline from an empty work directory in one
command, the same command again resuming it. Real Piper speaks the corpus (from
.venv-piper, bash deploy/setup-piper.sh; skipped without it, which VOICEAGENT_NO_SKIPS=1
turns into a failure); the corpus is a minute of speech and each part trains for a few
seconds, so only the plumbing is tested (`check`, which hears the parts, is skipped
here: tests/test_train_check.py hears it)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from voiceagent.cli import main
from voiceagent.model.checkpoint import load
from voiceagent.train import beside, teacher

STAGES = ("corpus", "teacher", "feats", "tokens", "lm", "flow", "vocoder", "export", "check", "all")


def timed(out: str) -> list[str]:
    """The stages a run's output says it ran, in order (each prints `name: N s` last)."""
    return re.findall(r"^(\w+): [\d.]+ s$", out, re.MULTILINE)


def test_one_command_makes_a_voice_from_nothing_and_again_trains_it_further(
    tmp_path: Path, piper: teacher.Piper, capfd: pytest.CaptureFixture[str]
) -> None:
    work, voice = tmp_path / "work", tmp_path / "voice"
    command = ["train", "all", "--out", str(work), "--to", str(voice)]
    command += ["--hours", "0.015", "--heldout", "2", "--no-asterisk", "--codes", "24"]
    command += ["--budget-min", "0.15", "--sentences", "0"]

    assert main(command) == 0
    out = capfd.readouterr().out
    assert timed(out) == list(STAGES), out
    assert "check: no sentences to hear (skipped)" in out
    first = json.loads((voice / "TRAINED").read_text())["steps"]
    assert min(first.values()) > 0, first
    model = load(voice)
    assert model.voices and not model.random_weights

    # Again: the data is kept and the parts train on, each for its own budget where
    # it has one (here the LM none at all) and for --budget-min where not.
    assert main([*command, "--lm-min", "0"]) == 0
    out = capfd.readouterr().out
    for stage in ("corpus", "teacher", "feats", "tokens"):
        assert re.search(rf"^{stage}: .*\(skipped\)$", out, re.MULTILINE), out
    again = json.loads((voice / "TRAINED").read_text())["steps"]
    assert again["lm"] == first["lm"], (first, again)
    assert again["flow"] > first["flow"] and again["vocoder"] > first["vocoder"], (first, again)

    # Step targets instead of minutes: each part trains up to its own step, or up to
    # --until-step, with no time limit; a part already there trains no more. Side by
    # side, the flow and the vocoder train in a second process (their lines are its)
    # while the LM trains, and the export waits for both.
    stepped = [a for a in command if a not in ("--budget-min", "0.15")]
    stepped += ["--until-step", str(again["flow"]), "--lm-until-step", str(again["lm"] + 2)]
    stepped += ["--vocoder-until-step", str(again["vocoder"] + 1), "--side-by-side"]
    assert main(stepped) == 0
    ran = timed(capfd.readouterr().out)
    assert sorted(ran) == sorted(STAGES), ran
    assert ran.index("export") > max(ran.index(p) for p in ("lm", "flow", "vocoder")), ran
    last = json.loads((voice / "TRAINED").read_text())["steps"]
    assert last == {"lm": again["lm"] + 2, "flow": again["flow"], "vocoder": again["vocoder"] + 1}

    # With --lm-anneal, the LM at its step target then trains that many steps more at
    # a falling rate, once: the same command again finds everything done.
    annealed = [*stepped, "--lm-anneal", "3"]
    assert main(annealed) == 0
    out = capfd.readouterr().out
    assert timed(out).count("anneal") == 1, out
    assert f"lm: annealing over steps {last['lm']}-{last['lm'] + 3}" in out, out
    assert json.loads((voice / "TRAINED").read_text())["steps"]["lm"] == last["lm"] + 3
    assert main(annealed) == 0
    out = capfd.readouterr().out
    assert "anneal: the LM was annealed over steps" in out and "lm: annealing" not in out, out
    assert f"lm: at step {last['lm'] + 3}, --until-step {last['lm']} reached (skipped)" in out
    assert json.loads((voice / "TRAINED").read_text())["steps"]["lm"] == last["lm"] + 3


def test_an_lm_anneal_needs_the_step_it_starts_at(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "all", "--out", str(tmp_path / "w"), "--lm-anneal", "3"]) == 2
    assert "--lm-anneal N (N > 0) goes with --lm-until-step" in capfd.readouterr().err
    assert not (tmp_path / "w").exists()


def test_the_second_process_stops_at_its_first_failure_and_then_frees_its_threads(
    tmp_path: Path,
) -> None:
    after = tmp_path / "after"
    run = beside.SideRun(
        [["--help"], ["train", "no-such-stage"], ["train", "corpus", "--out", str(after)]],
        threads=(1, 2),
    )
    assert run.wait() == 2  # argparse's code for the unknown stage
    assert not after.exists(), "a command after the failed one ran"
    assert run.done() and run.threads() == 2


@pytest.mark.parametrize("part", beside.PARTS)
def test_the_second_process_is_given_each_part_s_own_budget_and_step(part: str) -> None:
    """The command line `train all --side-by-side` starts parses as that part's stage
    with the budget, step target, threads, device and priority `train all` had for it."""
    from voiceagent.cli import build_parser

    given = argparse.Namespace(
        device="cpu", budget_min=12.5, until_step=7000, check=3, background=True
    )
    args = build_parser().parse_args(beside.part_argv(part, Path("/w"), given, 1))
    assert (args.train_stage, args.out, args.threads, args.device) == (part, Path("/w"), 1, "cpu")
    assert (args.budget_min, args.until_step, args.background) == (12.5, 7000, True)
    assert getattr(args, "check", 3) == 3
