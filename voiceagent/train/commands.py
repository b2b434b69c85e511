"""`voiceagent train STAGE`: the training pipeline's stages (docs/training.md).

Every stage reads and writes one work directory (--out), skips itself when its output
there is complete, runs the stages before it when theirs is missing, and prints its time.
Each stage is one `Stage` in STAGES (its flags and its runner); `all` runs them in order.

Over 500 lines: every stage's flags and runner side by side, in the order they run, so
that a flag shared by several stages (--device, --anneal, the budgets) is written once.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import (
    beside,
    check,
    corpus,
    export,
    feats,
    flow_train,
    inherit,
    lm_train,
    snapshot,
    teacher,
    tokens,
    vocoder_train,
)

if TYPE_CHECKING:
    import torch

DEFAULT_WORK = Path.home() / ".cache" / "voiceagent" / "train"


@dataclass(frozen=True)
class Stage:
    name: str
    help: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Path, argparse.Namespace], int]  # exit code


def _corpus_params(args: argparse.Namespace) -> corpus.Params:
    defaults = corpus.Params()
    return corpus.Params(
        hours=getattr(args, "hours", defaults.hours),
        seed=getattr(args, "seed", defaults.seed),
        heldout=getattr(args, "heldout", defaults.heldout),
        asterisk=not getattr(args, "no_asterisk", False),
        wordnet=getattr(args, "wordnet", defaults.wordnet),
    )


def _corpus_flags(p: argparse.ArgumentParser) -> None:
    d = corpus.Params()
    p.add_argument("--hours", type=float, default=d.hours, help="train speech to aim for, in hours")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the template sentences")
    p.add_argument("--heldout", type=int, default=d.heldout, help="held-out sentences (WER bench)")
    p.add_argument(
        "--no-asterisk",
        action="store_true",
        help="leave out the Asterisk prompt transcripts (CC-BY-SA 3.0): our own text only",
    )
    p.add_argument(
        "--wordnet",
        type=int,
        default=d.wordnet,
        help="WordNet example sentences to add, not counted in --hours (Debian wordnet-base)",
    )


def _corpus(work: Path, args: argparse.Namespace) -> int:
    params = _corpus_params(args)
    if corpus.is_complete(work, params):
        print(f"corpus: {corpus.corpus_dir(work)} is complete with these parameters (skipped)")
        return 0
    summary = corpus.write(work, params)
    print(
        f"corpus: {summary['train']} train and {summary['heldout']} held-out sentences, "
        f"about {summary['train_hours_estimate']} hours of train speech, in "
        f"{corpus.corpus_dir(work)}; sources {summary['sources']}"
    )
    return 0


def _teacher_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, help="speak at most this many new sentences")
    p.add_argument(
        "--piper-venv",
        type=Path,
        default=teacher.DEFAULT_VENV,
        help="the venv deploy/setup-piper.sh makes (default: the checkout's .venv-piper)",
    )
    p.add_argument("--length-scale", type=float, default=1.0, help="Piper's pace (>1: slower)")
    p.add_argument("--batch", type=int, default=200, help="sentences per piper process")
    p.add_argument(
        "--heldout-draws",
        type=int,
        default=1,
        metavar="N",
        help="speak the held-out sentences N times in all (Piper's noise is not seeded: "
        "each time is another draw, which the intelligibility bench pools)",
    )


def _teacher(work: Path, args: argparse.Namespace) -> int:
    if not corpus.is_complete(work):
        print("teacher: no corpus yet, making one with the default parameters")
        if (code := _timed(STAGES[0], work, args)) != 0:
            return code
    draws = getattr(args, "heldout_draws", 1)
    complete = teacher.is_complete(work, args.length_scale)
    if complete and draws <= 1:
        print(f"teacher: every sentence in {teacher.teacher_dir(work)} is spoken (skipped)")
        return 0
    try:
        piper = teacher.find_piper(args.piper_venv, args.length_scale)
        teacher.speak_draws(work, piper, draws, args.batch)
        if complete:
            return 0
        banked = frozenset(tokens.load_tokens(work)) if tokens.has_tokens(work) else frozenset()
        progress = teacher.run(work, piper, args.limit, args.batch, banked=banked)
    except (teacher.TeacherMissing, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if progress.sentences:
        print(
            f"teacher: spoke {progress.sentences} sentences, {progress.audio_s:.1f} s of "
            f"speech in {progress.wall_s:.1f} s (RTF {progress.rtf:.3f}; "
            f"{progress.cpu_rtf:.3f} CPU seconds per second of speech)"
        )
    return 0


def _no_flags(p: argparse.ArgumentParser) -> None:
    pass


def _needs(name: str, done: Callable[[Path], bool], work: Path, args: argparse.Namespace) -> int:
    """Run the stage `name` first when its output is missing."""
    if done(work):
        return 0
    stage = next(s for s in STAGES if s.name == name)
    print(f"{name} stage output missing: running it first")
    return _timed(stage, work, args)


def _feats(work: Path, args: argparse.Namespace) -> int:
    if not (teacher.teacher_dir(work) / "manifest.tsv").is_file():
        print(
            "error: the teacher has spoken nothing yet (voiceagent train teacher)", file=sys.stderr
        )
        return 2
    if not teacher.is_complete(work, getattr(args, "length_scale", 1.0)):
        # a corpus spoken in part (`teacher --limit`) trains on what it has
        print("feats: the teacher has not spoken the whole corpus: the WAVs it has")
    if feats.is_complete(work):
        print(f"feats: {feats.feats_dir(work)} is complete (skipped)")
        return 0
    for line in feats.run(work):
        print(line, flush=True)
    return 0


def _tokens_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--codes",
        type=int,
        default=None,
        help=f"k-means codes (token types) of a new codebook (default {tokens.CODES})",
    )


def _tokens(work: Path, args: argparse.Namespace) -> int:
    if (code := _needs("feats", feats.is_complete, work, args)) != 0:
        return code
    codes = getattr(args, "codes", None)
    book = tokens.tokens_dir(work) / "codebook.npz"
    if codes is not None and book.is_file() and (has := tokens.codebook_size(book)) != codes:
        # the parts were trained on the codebook's codes: a new one is a new start for them
        print(
            f"error: tokens: {book} has {has} codes, not --codes {codes}; it stays, since "
            "the LM and the flow were trained on its codes (move it aside to fit another)",
            file=sys.stderr,
        )
        return 2
    if tokens.is_complete(work):
        print(f"tokens: {tokens.tokens_dir(work)} is complete (skipped)")
        return 0
    for line in tokens.run(work, codes or tokens.CODES):
        print(line, flush=True)
    return 0


def _training_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget-min",
        type=float,
        help="minutes of training (resumes where it left off; default: 4, or no limit "
        "with --until-step or --anneal)",
    )
    p.add_argument(
        "--until-step",
        type=int,
        metavar="N",
        help="train up to step N of the part's whole training and stop: run again "
        "(here or on another machine) and it trains only what is left",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument(
        "--device",
        default="auto",
        help="where the LM, the flow and the vocoder train: auto (the first CUDA device "
        "when torch sees one, else the CPU), cpu, cuda or cuda:N",
    )


def _budget_s(args: argparse.Namespace) -> float:
    """Seconds of wall time this run may train: --budget-min, else none with a step
    target or an anneal (either ends the run), else four minutes."""
    if args.budget_min is not None:
        return 60 * float(args.budget_min)
    ends = (getattr(args, name, None) for name in ("until_step", "anneal"))
    return math.inf if any(x is not None for x in ends) else 240.0


def _device(args: argparse.Namespace) -> torch.device | None:
    """The torch device --device names, or None once said why it cannot be used."""
    from .update import train_device

    try:
        return train_device(getattr(args, "device", "auto"))
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _lm_flags(p: argparse.ArgumentParser) -> None:
    _training_flags(p)
    p.add_argument(
        "--text",
        choices=("phonemes", "spelling"),
        default="phonemes",
        help="what a new LM reads: its words as CMUdict phones (pocketsphinx's copy; "
        "the shipped voice's), or the text's spelling; an LM with a tokenizer keeps "
        "what it reads",
    )
    p.add_argument(
        "--warm-start",
        type=Path,
        help="a new LM starts from this LM checkpoint's weights (all but the text "
        "embedding when the tokenizers differ)",
    )
    _warm_codes_flag(p)
    _anneal_flag(
        p,
        "the LM before them stays in lm/ckpt-before-anneal.pt; about 300 steps cut the "
        "held-out loss of the eighth run's LM by 0.16",
    )


def _warm_codes_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--warm-codes",
        type=Path,
        metavar="CODEBOOK",
        help="the codebook.npz of the --warm-start checkpoint's speech codes, when this "
        "work directory's tokens are of another: each new code starts from the rows of "
        "its nearest old code",
    )


def _warm(work: Path, args: argparse.Namespace) -> tuple[Path | None, np.ndarray | None] | None:
    """--warm-start's checkpoint and, with --warm-codes, the parents of this work
    directory's codes; None, once said why, when they cannot be used."""
    start, codes = getattr(args, "warm_start", None), getattr(args, "warm_codes", None)
    if codes is not None and start is None:
        print("error: --warm-codes goes with --warm-start", file=sys.stderr)
        return None
    for flag, path in (("--warm-start", start), ("--warm-codes", codes)):
        if path is not None and not path.is_file():
            print(f"error: {flag} {path}: no such file", file=sys.stderr)
            return None
    return start, inherit.codebook_parents(work, codes)


def _lm(work: Path, args: argparse.Namespace) -> int:
    # Any tokens will do: the LM reads no audio, so after `seed` it can train on the
    # export's kept tokens while the teacher speaks again for the flow and the vocoder.
    if (device := _device(args)) is None:
        return 2
    if (code := _needs("tokens", tokens.has_tokens, work, args)) != 0:
        return code
    if (warm := _warm(work, args)) is None:
        return 2
    at = lm_train.progress(work)
    until, anneal = args.until_step, getattr(args, "anneal", None)
    if anneal is None and until is not None and at is not None and at[0] >= until:
        # Not even a last evaluation: its save would drop the record of a finished
        # anneal, which `train all --lm-anneal` reads to know it is done.
        print(f"lm: at step {at[0]}, --until-step {until} reached (skipped)")
        return 0
    phonemes = getattr(args, "text", "phonemes") == "phonemes"
    lm_train.train(
        work,
        _budget_s(args),
        threads=getattr(args, "threads_now", None) or args.threads,
        max_steps=until,
        lexicon=lm_train.pocketsphinx_lexicon() if phonemes else None,
        lexicon_notice=lm_train.pocketsphinx_notice() if phonemes else "",
        warm_start=warm[0],
        parent=warm[1],
        anneal=anneal,
        device=device,
    )
    return 0


def _lm_anneal(work: Path, args: argparse.Namespace) -> int:
    """`train all --lm-anneal N`: once the LM is at its --lm-until-step, N more steps at a
    falling rate. An anneal of N steps already finished is not started again; one cut
    short goes on (`update.anneal_span`)."""
    at = lm_train.progress(work)
    if at is None or at[0] < args.until_step:
        print(f"anneal: the LM is short of step {args.until_step} (skipped)")
        return 0
    step, (start, steps) = at
    if steps == args.lm_anneal and step >= start + steps:
        print(f"anneal: the LM was annealed over steps {start}-{step} (skipped)")
        return 0
    # No step target: the anneal's own end stops it (a target would stop it at once).
    annealing = {"anneal": args.lm_anneal, "until_step": None}
    return _lm(work, argparse.Namespace(**{**vars(args), **annealing}))


def _flow_flags(p: argparse.ArgumentParser) -> None:
    _training_flags(p)
    _anneal_flag(p, "the flow before them stays in flow/checkpoint-before-anneal.pt")
    p.add_argument(
        "--warm-start",
        type=Path,
        help="a new flow starts from this flow checkpoint's weights (and sizes)",
    )
    _warm_codes_flag(p)


def _flow(work: Path, args: argparse.Namespace) -> int:
    if (device := _device(args)) is None:
        return 2
    if (code := _needs("tokens", tokens.is_complete, work, args)) != 0:
        return code
    if (warm := _warm(work, args)) is None:
        return 2
    import torch

    torch.set_num_threads(args.threads)
    summary = flow_train.train(
        work,
        _budget_s(args),
        max_steps=args.until_step,
        warm_start=warm[0],
        parent=warm[1],
        device=device,
        anneal=getattr(args, "anneal", None),
    )
    print(f"flow: {summary}")
    return 0


def _vocoder_flags(p: argparse.ArgumentParser) -> None:
    _training_flags(p)
    p.add_argument("--check", type=int, default=2, help="held-out utterances to vocode after")


def _vocoder_stage_flags(p: argparse.ArgumentParser) -> None:
    _vocoder_flags(p)
    _anneal_flag(p, "the vocoder before them stays in vocoder/checkpoint-before-anneal.pt")


def _anneal_flag(p: argparse.ArgumentParser, note: str) -> None:
    p.add_argument(
        "--anneal",
        type=int,
        metavar="STEPS",
        help=f"end the training with STEPS steps whose learning rate falls linearly to "
        f"a twentieth ({note})",
    )


def _vocoder(work: Path, args: argparse.Namespace) -> int:
    if (device := _device(args)) is None:
        return 2
    if (code := _needs("feats", feats.is_complete, work, args)) != 0:
        return code
    import torch

    torch.set_num_threads(args.threads)
    check, anneal = getattr(args, "check", 2), getattr(args, "anneal", None)
    for line in vocoder_train.run(work, _budget_s(args), check, device, anneal, args.until_step):
        print(line, flush=True)
    return 0


def _export_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--to",
        type=Path,
        default=export.SHIPPED,
        help="the model directory to write (default: the one shipped with voiceagent, "
        "which `serve` speaks with when given no --model)",
    )


def _export(work: Path, args: argparse.Namespace) -> int:
    try:
        out = export.write(work, getattr(args, "to", export.SHIPPED))
    except FileNotFoundError as exc:
        print(f"error: {exc} (voiceagent train ...)", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"export: {out} ({size / 1e6:.1f} MB), voice {export.NAME!r}")
    return 0


def _check_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sentences", type=int, default=20, help="held-out sentences to hear (0: none)")


def _check(work: Path, args: argparse.Namespace) -> int:
    if (code := _needs("tokens", tokens.is_complete, work, args)) != 0:
        return code
    if (n := getattr(args, "sentences", 20)) <= 0:
        print("check: no sentences to hear (skipped)")
        return 0
    report = check.run(work, n)
    n = report.pop("sentences")
    print(f"check: WER of each part alone over {n} held-out sentences (docs/training.md)")
    for part, wer in report.items():
        print(f"check: {part:<12} {wer:.3f}")
    return 0


def _seed_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=export.SHIPPED,
        help="the export to train on from (default: the voice shipped with voiceagent)",
    )


def _seed(work: Path, args: argparse.Namespace) -> int:
    try:
        for line in snapshot.seed(work, args.source):
            print(line)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


PARTS = ("lm", "flow", "vocoder")


def _all_flags(p: argparse.ArgumentParser) -> None:
    for add in (
        _corpus_flags,
        _teacher_flags,
        _tokens_flags,
        _vocoder_flags,
        _export_flags,
        _check_flags,
    ):
        add(p)
    for part in PARTS:
        p.add_argument(
            f"--{part}-min",
            type=float,
            help=f"minutes of {part} training (default: --budget-min)",
        )
        p.add_argument(
            f"--{part}-until-step",
            type=int,
            metavar="N",
            help=f"train the {part} up to its step N (default: --until-step)",
        )
    p.add_argument(
        "--lm-anneal",
        type=int,
        metavar="N",
        help="once the LM is at --lm-until-step, train it N more steps at a falling "
        "learning rate (train lm --anneal; 1500 cut the twentieth run's held-out loss by "
        "0.31); an LM annealed over N steps is not annealed again",
    )
    p.add_argument(
        "--side-by-side",
        action="store_true",
        help="train the flow and then the vocoder in a second process while the LM trains, "
        "each with half of --threads (on two CPU cores: hours less in all)",
    )


def _all(work: Path, args: argparse.Namespace) -> int:
    """Every stage in order (up to `check`); a complete one skips itself, a training
    stage trains its own budget (--lm-min ...) or --budget-min more minutes from its
    checkpoint."""
    if args.lm_anneal is not None and (args.lm_until_step is None or args.lm_anneal < 1):
        print("error: --lm-anneal N (N > 0) goes with --lm-until-step", file=sys.stderr)
        return 2
    if _device(args) is None:  # before hours of teacher speech, not after
        return 2
    side: beside.SideRun | None = None
    for stage in STAGES[: [s.name for s in STAGES].index("check") + 1]:
        stage_args = _part_args(stage.name, args)
        if args.side_by_side and stage.name in beside.PARTS:
            continue  # trained by the second process
        if args.side_by_side and stage.name == "lm":
            half = max(1, args.threads // 2)
            argvs = [beside.part_argv(p, work, _part_args(p, args), half) for p in beside.PARTS]
            side = beside.SideRun(argvs, threads=(half, args.threads))
            stage_args.threads_now = side.threads
        if stage.name == "export" and side is not None and (code := side.wait()) != 0:
            return code
        code = _timed(stage, work, stage_args)
        if code == 0 and stage.name == "lm" and args.lm_anneal:
            code = _timed(ANNEAL, work, stage_args)
        if code != 0:
            if side is not None:
                side.wait()  # a failed LM leaves the other parts to finish their steps
            return code
    return 0


def _part_args(name: str, args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the stage's own budget and step target (--lm-min ...) where it has them."""
    own = getattr(args, f"{name}_min", None)
    budget = args.budget_min if own is None else own
    own_until = getattr(args, f"{name}_until_step", None)
    until = args.until_step if own_until is None else own_until
    return argparse.Namespace(**{**vars(args), "budget_min": budget, "until_step": until})


STAGES = [
    Stage(
        "corpus",
        "write the text corpus: train.tsv, heldout.tsv, SOURCES.md",
        _corpus_flags,
        _corpus,
    ),
    Stage(
        "teacher",
        "speak the corpus with the Piper teacher voice: WAVs and manifest.tsv",
        _teacher_flags,
        _teacher,
    ),
    Stage(
        "feats",
        "resample the teacher's speech to 24 kHz and compute the flow's mel of it",
        _no_flags,
        _feats,
    ),
    Stage(
        "tokens",
        "speech tokens of our own: k-means over mel-frame pairs, 25 per second",
        _tokens_flags,
        _tokens,
    ),
    Stage(
        "lm",
        "train the speech-token LM (text -> our speech tokens) for --budget-min minutes",
        _lm_flags,
        _lm,
    ),
    Stage(
        "flow",
        "train the flow (tokens -> mel) by conditional flow matching; resumes",
        _flow_flags,
        _flow,
    ),
    Stage(
        "vocoder",
        "train the HiFT vocoder (mel -> 24 kHz) on the teacher's speech; resumes",
        _vocoder_stage_flags,
        _vocoder,
    ),
    Stage(
        "export",
        "write the trained voice as a model directory (the released CosyVoice2 layout)",
        _export_flags,
        _export,
    ),
    Stage(
        "check",
        "hear each trained part alone (Griffin-Lim, token centroids): WER per part",
        _check_flags,
        _check,
    ),
    Stage(
        "seed",
        "start a work directory from an export (the shipped voice): each part resumes at its step",
        _seed_flags,
        _seed,
    ),
    Stage(
        "all",
        "every stage in order, each skipped when done; each part trains its own budget "
        "(--lm-min, --flow-min, --vocoder-min) or --budget-min, up to its own step "
        "(--lm-until-step ...) or --until-step",
        _all_flags,
        _all,
    ),
]


# Not a stage of its own (`train lm --anneal` is that): `all` runs it after the LM.
ANNEAL = Stage("anneal", "anneal the LM (train all --lm-anneal)", _no_flags, _lm_anneal)


def lowest_priority() -> None:
    """Yield the CPU to everything else on the machine: nice 19 for this process, and,
    when it leads its own session (started with `setsid`), for the session's scheduling
    group too. Linux groups each session's processes (autogroup) and shares the CPU
    between groups first, so nice alone only ranks processes within one group: measured
    here, a benchmark that takes 30 s took 5 min beside three nice-19 training stages
    started with setsid, and 30 s again once their group was niced. The group of a
    process that shares a terminal's session is left alone (it would slow the shell).
    Linux nices one thread at a time: the threads already running (numpy's BLAS
    workers, started at its import) are niced each."""
    os.nice(19 - os.nice(0))
    with contextlib.suppress(OSError):  # not Linux: the threads share the process's
        for task in Path("/proc/self/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), 19)
    if os.getsid(0) == os.getpid():
        with contextlib.suppress(OSError):  # not Linux, or autogroup off
            Path("/proc/self/autogroup").write_text("19")


def _timed(stage: Stage, work: Path, args: argparse.Namespace) -> int:
    if args.background:
        lowest_priority()
    start = time.perf_counter()
    code = stage.run(work, args)
    print(f"{stage.name}: {time.perf_counter() - start:.1f} s")
    return code


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("train", help="make a voice of our own, stage by stage (docs/training.md)")
    stages = s.add_subparsers(dest="train_stage", required=True)
    for stage in STAGES:
        p = stages.add_parser(stage.name, help=stage.help)
        p.add_argument(
            "--out",
            type=Path,
            default=DEFAULT_WORK,
            help="the work directory every stage reads and writes (default: "
            "~/.cache/voiceagent/train)",
        )
        p.add_argument(
            "--background",
            action="store_true",
            help="run at the lowest CPU priority, so that other work keeps its speed (start "
            "it with setsid for the priority of its whole session)",
        )
        stage.add_flags(p)
        p.set_defaults(func=lambda args, stage=stage: _timed(stage, args.out, args))
