"""The `lm` training stage (voiceagent/train/lm_train.py): the speech-token LM learns
text -> speech tokens from the work directory's corpus and speech tokens, on exactly
the input the server feeds it, and exports an `llm.pt` the loader reads.

The data here is synthetic, in the on-disk format of the earlier stages: a corpus of
a few sentences and, for each, speech tokens that follow from its letters.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from voiceagent.cli import main
from voiceagent.model import checkpoint
from voiceagent.model.contract import EOS_TOKEN
from voiceagent.model.cosyvoice2.lm_config import read_lm_setup
from voiceagent.model.cosyvoice2.loader import QWEN_DIR
from voiceagent.model.cosyvoice2.random_checkpoint import SIZES, write_random_cosyvoice2
from voiceagent.model.cosyvoice2.text_tokenizer import QwenTextTokenizer
from voiceagent.model.cosyvoice2.yaml_config import read_yaml
from voiceagent.model.lm import KVPool
from voiceagent.text.normalize import normalize
from voiceagent.train import corpus, lm_train
from voiceagent.train.corpus import Sentence
from voiceagent.train.lm_train import IGNORE, Example, Hyper, Prior, Trainer
from voiceagent.train.sizes import voice_yaml
from voiceagent.train.update import ANNEAL_FLOOR

SMALL = SIZES["small"]
TRAIN = [
    "Please hold while I transfer your call.",
    "Your balance is $42.50 as of today.",
    "The meeting starts at 3:30 on Monday.",
    "Press one for sales, two for support.",
    "Thank you for calling, have a nice day.",
    "Your order number is seven four two.",
    "I can help you with that right away.",
    "Please say or enter your account number.",
]
HELDOUT = ["Hold on, I will check that for you.", "The office opens at 9:15."]


def speech_of(text: str) -> np.ndarray:
    """Synthetic speech tokens: three per character of the spoken form (enough above the
    decoder's minimum of two per text token), a function of the character."""
    out = []
    for ch in normalize(text, "auto").lower():
        c = ord(ch) % 40
        out += [c, c + 40, c + 80]
    return np.array(out, dtype=np.int16)


def write_corpus(work: Path, split: str, texts: list[str]) -> list[Sentence]:
    sentences = [Sentence(f"{split}-{i}", text, text) for i, text in enumerate(texts)]
    corpus.corpus_dir(work).mkdir(parents=True, exist_ok=True)
    corpus.write_tsv(corpus.corpus_dir(work) / f"{split}.tsv", sentences)
    return sentences


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return write_work(tmp_path)


def write_work(tmp_path: Path) -> Path:
    """The corpus and its sentences' tokens: all the LM reads (never the audio)."""
    w = tmp_path / "train"
    (w / "tokens").mkdir(parents=True)
    speech = {}
    for split, texts in (("train", TRAIN), ("heldout", HELDOUT)):
        for s in write_corpus(w, split, texts):
            speech[s.id] = speech_of(s.text)
    np.savez(w / "tokens" / "tokens.npz", **speech)  # type: ignore[arg-type]
    (w / "tokens" / "stage.json").write_text(json.dumps({"codes": 120}))
    return w


def small_trainer(work: Path, **hyper: float) -> tuple[Trainer, list[Example], list[Example]]:
    tok = lm_train.text_tokenizer(work, SMALL, merges=40)
    train, heldout = lm_train.load_examples(work, tok)
    cfg = lm_train.lm_config(SMALL, lm_train.tokenizer_dir(work))
    return Trainer.fresh(cfg, Hyper(**hyper)), train, heldout  # type: ignore[arg-type]


# -- what the LM reads ----------------------------------------------------------------------


def test_text_is_encoded_as_a_turn_encodes_it_with_merges_learned_from_train_text(work) -> None:
    tok = lm_train.text_tokenizer(work, SMALL, merges=40)
    folder = lm_train.tokenizer_dir(work)
    served = QwenTextTokenizer(folder)  # what the loader builds from the exported folder
    text = "Your balance is $42.50 at 3:30."
    ids = lm_train.encode(tok, text)
    assert ids == served.encode(normalize(text, "auto"))
    assert served.decode(ids) == normalize(text, "auto")
    assert len(ids) < len(normalize(text, "auto").encode())  # merges: fewer ids than bytes
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == served.vocab_size
    assert config["hidden_size"] == SMALL["lm_hidden"]
    # a second call reuses the folder (the checkpoint's text embedding is indexed by it)
    before = (folder / "merges.txt").read_text()
    lm_train.text_tokenizer(work, SMALL, merges=5)
    assert (folder / "merges.txt").read_text() == before


def test_the_examples_are_the_corpus_sentences_with_tokens_whether_or_not_spoken_here(
    work,
) -> None:
    """The LM reads text and tokens only: a sentence whose speech is not on this machine
    (its tokens kept by an export) is an example; one without tokens, or not in the
    corpus, is not; each keeps its corpus split."""
    speech = dict(np.load(work / "tokens" / "tokens.npz"))
    del speech["train-1"]
    speech["gone-0"] = speech_of("A sentence the corpus no longer has.")
    np.savez(work / "tokens" / "tokens.npz", **speech)  # type: ignore[arg-type]
    tok = lm_train.text_tokenizer(work, SMALL, merges=40)
    train, heldout = lm_train.load_examples(work, tok)
    kept = [t for i, t in enumerate(TRAIN) if i != 1]
    assert [ex.text for ex in train] == [tuple(lm_train.encode(tok, t)) for t in kept]
    assert [ex.speech for ex in train] == [tuple(speech_of(t).tolist()) for t in kept]
    assert [ex.text for ex in heldout] == [tuple(lm_train.encode(tok, t)) for t in HELDOUT]


def test_a_sequence_is_the_serving_prompt_and_its_targets_are_the_speech_then_the_end(
    work,
) -> None:
    tr, train, _ = small_trainer(work)
    ex = train[0]
    inputs, targets = lm_train.embed(tr.lm, [ex])
    with torch.no_grad():
        served = tr.lm.prompt_embeds(list(ex.text), list(ex.speech))
    assert torch.equal(inputs, served)
    expected = [IGNORE] * (1 + len(ex.text)) + list(ex.speech) + [EOS_TOKEN]
    assert targets[0].tolist() == expected


def test_a_joined_example_is_a_voice_prompt_followed_by_the_segment(work) -> None:
    _, train, _ = small_trainer(work)
    batches = lm_train.epoch_batches(train, join=1.0, max_positions=10_000, seed=0)
    items = [ex for b in batches for ex in b]
    assert len(items) == len(train)
    for ex in items:
        prompts = [p for p in train if ex.text[: len(p.text)] == p.text]
        ends = [e for e in train if ex.text[len(ex.text) - len(e.text) :] == e.text]
        assert any(ex == p.joined(e) for p in prompts for e in ends), (
            "text ids a + b with speech a + b"
        )
    plain = lm_train.epoch_batches(train, join=0.0, max_positions=10_000, seed=0)
    assert sorted(ex.positions for b in plain for ex in b) == sorted(e.positions for e in train)


def test_batches_by_length_stay_within_the_position_budget(work) -> None:
    _, train, _ = small_trainer(work)
    for batch in lm_train.epoch_batches(train, join=0.3, max_positions=300, seed=1):
        assert len(batch) == 1 or len(batch) * max(e.positions for e in batch) <= 300


def test_the_training_forward_equals_the_serving_forward(work) -> None:
    tr, train, _ = small_trainer(work)
    lm = tr.lm.eval()
    short, long = sorted(train[:2], key=lambda e: e.positions)
    with torch.no_grad():
        inputs, targets = lm_train.embed(lm, [long, short])  # the short row is padded
        h = lm_train.hidden_states(lm, inputs)
        for row, ex in enumerate((long, short)):
            last = ex.positions - 1
            trained = lm.llm_decoder(h[row, last])
            pool = KVPool(lm.cfg, 1, 512, torch.device("cpu"))
            prompt = lm.prompt_embeds(list(ex.text), list(ex.speech))
            zero = torch.tensor([0])
            served = lm.forward_embeds(prompt, pool, zero, zero)[0]
            torch.testing.assert_close(trained, served, atol=1e-4, rtol=1e-4)
            assert targets[row, last] == EOS_TOKEN


# -- training -------------------------------------------------------------------------------


def test_the_loss_falls_when_one_batch_is_learned(work) -> None:
    torch.set_num_threads(1)
    tr, train, _ = small_trainer(work, lr=3e-3, warmup=5, dropout=0.0)
    batch = train[:4]
    losses = [tr.train_step(batch) for _ in range(40)]
    assert losses[0] > 4.0  # about ln(6564) = 8.8 at the start
    assert losses[-1] < 0.5 * losses[0]
    assert tr.step == 40


def test_the_alignment_prior_costs_nothing_on_the_diagonal_and_most_far_off_it() -> None:
    ex = Example(text=(5, 6, 7, 8), speech=tuple(range(7)))  # 4 text keys, 8 speech queries
    cost = Prior.of([ex], ex.positions, (1,), width=0.2).cost[0]
    query, key = 5, 1  # positions of the task id (query 0) and of the first text id
    assert cost[query + 0, key + 0] == 0 and cost[query + 4, key + 2] == 0  # 4/8 = 2/4
    assert cost[query + 0, key + 3] > 0.99  # 0 against 3/4 of the way through
    assert cost[query + 6, key + 3] < cost[query + 6, key + 0]
    # only speech queries over text keys: sos, the text rows and the speech keys are free
    assert cost[:query].sum() == 0 and cost[:, :key].sum() == 0 and cost[:, key + 4 :].sum() == 0


def test_the_alignment_prior_pulls_attention_onto_the_diagonal(work) -> None:
    torch.set_num_threads(1)
    runs = {}
    for weight in (1e-9, 1.0):  # measured but not trained, then trained
        tr, train, _ = small_trainer(work, lr=3e-3, warmup=5, dropout=0.0, prior=weight)
        for _ in range(30):
            tr.train_step(train[:4])
        runs[weight] = tr.last_prior
    assert runs[1.0] < 0.7 * runs[1e-9], runs


def test_training_stops_at_its_budget_and_resumes_from_its_checkpoint(work) -> None:
    hyper = Hyper(batch_positions=400, warmup=5, log_every=2, checkpoint_s=0.5)
    first = lm_train.train(work, 4.0, sizes=SMALL, hyper=hyper, merges=40, say=lambda s: None)
    assert first["steps_this_run"] > 0
    assert first["wall_s"] < 4.0 + 2.0
    ckpt = lm_train.checkpoint_path(work)
    saved = Trainer.load(ckpt)
    assert saved.step == first["step"]
    assert saved.opt.state_dict()["state"], "the optimizer's moments are kept"
    second = lm_train.train(work, 3.0, sizes=SMALL, hyper=hyper, merges=40, say=lambda s: None)
    assert second["step"] == first["step"] + second["steps_this_run"]
    assert second["start_ce"] is None  # no start-of-training evaluation when resuming
    log = (lm_train.lm_dir(work) / "log.tsv").read_text().splitlines()
    assert log[0].split("\t") == list(lm_train.LOG_COLUMNS)
    col = lm_train.LOG_COLUMNS.index("heldout_ce")
    held = [float(r.split("\t")[col]) for r in log[1:] if r.split("\t")[col]]
    assert held[0] > held[-1]  # held-out cross-entropy went down


def test_a_resumed_checkpoint_continues_at_the_same_step_with_the_same_weights(work) -> None:
    tr, train, _ = small_trainer(work, warmup=5)
    batches = tr.batches(train)
    for _ in range(3):
        tr.train_step(next(batches))
    path = lm_train.checkpoint_path(work)
    tr.save(path)
    back = Trainer.load(path)
    assert (back.step, back.epoch, back.index) == (tr.step, tr.epoch, tr.index)
    for (name, a), b in zip(tr.lm.state_dict().items(), back.lm.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    # both take the same next step, dropout masks included (whatever ran in between)
    assert tr.hyper.dropout > 0
    nxt_a, nxt_b = next(batches), next(back.batches(train))
    assert nxt_a == nxt_b
    la = tr.train_step(nxt_a)
    torch.rand(1000)
    lb = back.train_step(nxt_b)
    assert la == pytest.approx(lb, rel=1e-5)


def test_threads_given_as_a_function_are_asked_again_between_steps(work) -> None:
    """`train all --side-by-side`: the LM trains on half the threads while the flow and
    the vocoder train beside it, and on all of them from the step after they are done."""
    asked: list[int] = []
    said: list[str] = []

    def threads() -> int:
        asked.append(torch.get_num_threads())
        return 1 if len(asked) < 3 else 2

    hyper = Hyper(batch_positions=400, warmup=2, checkpoint_s=60.0)
    before = torch.get_num_threads()
    try:
        lm_train.train(work, 60.0, SMALL, hyper, threads, 40, said.append, max_steps=4)
        assert asked[:4] == [before, 1, 1, 2], asked  # set at the start, then per step
        assert "lm: 2 threads from step 1" in said, said  # after one step on 1
    finally:
        torch.set_num_threads(before)


# -- the anneal ------------------------------------------------------------------------------


def test_an_anneal_ends_training_on_a_falling_rate_and_keeps_the_lm_before_it(work) -> None:
    """A constant rate leaves the loss above what the weights can reach: a few hundred
    steps of a falling rate at the end cut the shipped voice's held-out loss by 0.16."""

    def train(**kw: int) -> int:
        return int(
            lm_train.train(work, 60.0, sizes=SMALL, merges=40, say=lambda s: None, **kw)["step"]
        )

    hyper = Hyper(batch_positions=400, warmup=2, checkpoint_s=60.0)
    train(hyper=hyper, max_steps=4)  # type: ignore[arg-type]
    before = torch.load(lm_train.checkpoint_path(work), weights_only=True)
    assert train(anneal=6, max_steps=7) == 7  # stopped inside the anneal...
    assert train() == 10  # ...a plain run finishes it, and stops at its end
    kept = torch.load(lm_train.before_anneal_path(work), weights_only=True)
    assert kept["step"] == 4
    assert all(torch.equal(v, kept["model"][k]) for k, v in before["model"].items())

    h = Trainer.load(lm_train.checkpoint_path(work)).hyper
    assert (h.anneal_from, h.anneal_steps) == (4, 6)
    rates = [lm_train.learning_rate(h, step) for step in range(4, 12)]
    assert rates[0] == h.lr
    assert all(a > b for a, b in itertools.pairwise(rates[:7]))
    assert rates[6] == rates[7] == pytest.approx(h.lr * ANNEAL_FLOOR)

    assert train(max_steps=12) == 12  # training on after it: at the full rate again
    assert Trainer.load(lm_train.checkpoint_path(work)).hyper.anneal_steps == 0


# -- export ---------------------------------------------------------------------------------


def test_the_exported_lm_loads_with_the_project_loader_and_speaks(work, tmp_path) -> None:
    hyper = Hyper(batch_positions=400, warmup=5, lr=3e-3, dropout=0.0)
    lm_train.train(work, 5.0, sizes=SMALL, hyper=hyper, merges=40, say=lambda s: None)
    model_dir = write_random_cosyvoice2(tmp_path / "model", "small")
    shutil.rmtree(model_dir / QWEN_DIR)
    shutil.copytree(lm_train.tokenizer_dir(work), model_dir / QWEN_DIR)
    state = lm_train.export_state(work)
    assert state[lm_train.HEAD] is state[lm_train.EMBED] or torch.equal(
        state[lm_train.HEAD], state[lm_train.EMBED]
    )
    torch.save(state, model_dir / "llm.pt")

    model = checkpoint.load(model_dir)
    for name, value in model.lm.state_dict().items():
        assert torch.equal(value, state[name]), name
    voice = next(iter(model.voices.values()))
    text = HELDOUT[0]
    tokens = lm_train.speak_tokens(model, text, voice)
    n = len(lm_train.encode(model.tokenizer, text))
    lo, hi = model.token_ratio
    assert int(n * lo) <= len(tokens) <= int(n * hi)
    assert all(0 <= t < 6561 for t in tokens)
    pcm = model.synthesize_offline(tokens, voice)
    assert pcm.size > 0 and np.isfinite(pcm).all()
    # the same check without a flow: the LM and its tokenizer alone
    alone = lm_train.lm_model(work, SMALL)
    assert lm_train.speak_tokens(alone, text, lm_train.no_prompt_voice())
    # drawn as the exported voice draws (its yaml's top-k and repetition threshold)
    (tmp_path / "voice.yaml").write_text(voice_yaml(SMALL))
    exported = read_lm_setup(read_yaml(tmp_path / "voice.yaml"), lm_train.tokenizer_dir(work))
    assert alone.sampling == exported.sampling


def test_the_lm_stage_is_a_train_command_with_a_budget_in_minutes(work, capsys) -> None:
    assert main(["train", "lm", "--out", str(work), "--budget-min", "0.05"]) == 0
    assert lm_train.checkpoint_path(work).is_file()
    assert "lm: " in capsys.readouterr().out
    saved = Trainer.load(lm_train.checkpoint_path(work))
    assert saved.lm.cfg.hidden == lm_train.VOICE["lm_hidden"]  # the voice's sizes by default


def test_train_lm_until_step_trains_what_is_left_of_a_step_target(work) -> None:
    for target, reached in ((2, 2), (3, 3), (3, 3)):  # no time limit: the step ends it
        assert main(["train", "lm", "--out", str(work), "--until-step", str(target)]) == 0
        assert Trainer.load(lm_train.checkpoint_path(work)).step == reached


def test_the_export_takes_the_weights_with_the_lowest_held_out_loss(work) -> None:
    """2 hours of speech overfit the LM within a few epochs: the held-out best is kept
    beside the last checkpoint, and the export takes it."""
    hyper = Hyper(batch_positions=400, warmup=5, lr=3e-3, dropout=0.0, checkpoint_s=1.0)
    lm_train.train(work, 6.0, sizes=SMALL, hyper=hyper, merges=40, say=lambda s: None)
    rows = [r.split("\t") for r in (work / "lm" / "log.tsv").read_text().splitlines()]
    col = rows[0].index("heldout_ce")
    held = [float(r[col]) for r in rows[1:] if len(r) > col and r[col]]
    best = torch.load(lm_train.best_path(work), weights_only=True)
    ckpt = torch.load(lm_train.checkpoint_path(work), weights_only=True)
    assert len(held) >= 2 and ckpt["extra"]["best_heldout_ce"] == pytest.approx(min(held), abs=1e-4)
    # the export reads best.pt, not the last checkpoint (here they may coincide: mark it)
    marked = {k: v + 1.0 if v.is_floating_point() else v for k, v in best["model"].items()}
    torch.save({"model": marked, "step": best["step"]}, lm_train.best_path(work))
    exported = lm_train.export_state(work)
    assert all(torch.equal(exported[k], v) for k, v in marked.items() if k != lm_train.HEAD)


def test_a_best_held_out_score_counts_only_on_the_set_it_was_measured_on(work) -> None:
    """A grown corpus brings new held-out sentences: the old record (on fewer, easier
    sentences) must not keep the export on old weights for ever."""
    hyper = Hyper(batch_positions=400, warmup=5, lr=3e-3, dropout=0.0, checkpoint_s=0.0)

    def train(steps: int) -> int:
        lm_train.train(
            work, 60.0, sizes=SMALL, hyper=hyper, merges=40, max_steps=steps, say=lambda s: None
        )
        return int(torch.load(lm_train.best_path(work), weights_only=True)["step"])

    first = train(3)
    # a record no evaluation beats, kept in best.pt; the checkpoint's is older, as when
    # training stopped between writing the two
    best = torch.load(lm_train.best_path(work), weights_only=True)
    torch.save(best | {"best_heldout_ce": -1.0}, lm_train.best_path(work))
    ckpt = torch.load(lm_train.checkpoint_path(work), weights_only=True)
    ckpt["extra"]["best_heldout_ce"] = 99.0
    torch.save(ckpt, lm_train.checkpoint_path(work))
    assert train(6) == first  # the same held-out set: the record stands

    grown = write_corpus(work, "heldout", [*HELDOUT, "Your code is four four one."])
    speech = dict(np.load(work / "tokens" / "tokens.npz"))
    speech[grown[-1].id] = speech_of(grown[-1].text)
    np.savez(work / "tokens" / "tokens.npz", **speech)  # type: ignore[arg-type]
    assert train(9) > 6  # a new set: its first evaluation is its best so far


def test_the_lm_trains_on_the_device_asked_for_as_it_does_on_the_cpu(
    work, tmp_path, train_device
) -> None:
    """Batches are drawn on the CPU and moved: the same steps on another device end at
    the same weights (float32 here; bfloat16 kernels differ between devices), and its
    checkpoint resumes on the CPU."""
    other = tmp_path / "other"
    shutil.copytree(work, other)
    hyper = Hyper(batch_positions=400, warmup=2, bf16=False, dropout=0.0)
    runs = []
    for w, device in ((work, torch.device("cpu")), (other, train_device)):
        torch.manual_seed(0)
        runs.append(
            lm_train.train(
                w,
                600,
                sizes=SMALL,
                hyper=hyper,
                merges=40,
                max_steps=3,
                say=lambda s: None,
                device=device,
            )
        )
    assert [r["device"] for r in runs] == ["cpu", str(train_device)]
    back = Trainer.load(lm_train.checkpoint_path(other))  # onto the CPU
    assert back.step == 3 and back.device.type == "cpu"
    assert back.opt.state_dict()["state"], "the optimizer's moments came along"
    mine = Trainer.load(lm_train.checkpoint_path(work)).lm.state_dict()
    for name, weight in back.lm.state_dict().items():
        torch.testing.assert_close(weight, mine[name], rtol=1e-4, atol=1e-5, msg=name)
    assert runs[0]["heldout_ce"] == pytest.approx(runs[1]["heldout_ce"], abs=1e-3)
