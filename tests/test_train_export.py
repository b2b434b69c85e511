"""`voiceagent train export`: the three trained parts become one model directory in the
released CosyVoice2 layout, which the project's loader reads as a voice that is not
random, small enough to ship. The parts here are trained for a few seconds on a few
synthetic utterances (what they say does not matter: only the plumbing is tested)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from voiceagent.audio.features import prompt_mel
from voiceagent.model.checkpoint import load
from voiceagent.text.normalize import normalize
from voiceagent.train import (
    corpus,
    export,
    feats,
    flow_train,
    lm_train,
    snapshot,
    tokens,
    vocoder_train,
)

TEXTS = [
    ("train", "Thanks for calling, how can I help?"),
    ("train", "Your order shipped this morning."),
    ("train", "Please hold while I check."),
    ("heldout", "Have a nice day."),
]


def write_work(work: Path) -> Path:
    """The corpus, teacher/manifest.tsv, feats and tokens as the stages write them: three
    tokens per character, two mel frames per token, a tone whose pitch follows them."""
    for d in ("teacher", "feats", "tokens"):
        (work / d).mkdir(parents=True)
    rows, tokens = ["id\tseconds\ttext\tsplit"], {}
    for i, (split, text) in enumerate(TEXTS):
        tok = np.array([ord(c) % 40 + k for c in normalize(text, "auto") for k in (0, 40, 80)])
        f0 = np.repeat(100 + tok % 40, 2 * 480).astype(np.float64)
        wav = (0.2 * np.sin(2 * np.pi * np.cumsum(f0) / 24000)).astype(np.float32)
        feats.save(work / "feats" / f"u{i}.npz", wav, prompt_mel(wav))
        tokens[f"u{i}"] = tok.astype(np.int16)
        rows.append(f"u{i}\t{len(wav) / 24000:.3f}\t{text}\t{split}")
    (work / "teacher" / "manifest.tsv").write_text("\n".join(rows) + "\n")
    np.savez(work / "tokens" / "tokens.npz", **tokens)  # type: ignore[arg-type]
    for d in ("feats", "tokens"):  # complete for this manifest
        (work / d / "stage.json").write_text(json.dumps({"manifest": feats.manifest_digest(work)}))
    corpus.corpus_dir(work).mkdir()
    for split in ("train", "heldout"):
        said = [corpus.Sentence(f"u{i}", t, t) for i, (s, t) in enumerate(TEXTS) if s == split]
        corpus.write_tsv(corpus.corpus_dir(work) / f"{split}.tsv", said)
    params = {"hours": 0.01, "seed": 0, "heldout": 1, "asterisk": False}
    stage = {"params": params, "sources": {"call": len(TEXTS)}}
    (corpus.corpus_dir(work) / "stage.json").write_text(json.dumps(stage))
    return work


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    before = torch.get_num_threads()
    work = write_work(tmp_path_factory.mktemp("train") / "w")
    # steps, not seconds: the same LM on a busy machine (SGLang must decode it greedily
    # as the embedded engine does, and a barely trained LM has near ties)
    lm_train.train(work, 120, threads=1, merges=20, say=lambda *_: None, max_steps=30)
    flow_train.train(work, 8, steps=2, say=lambda *_: None)
    vocoder_train.train(work, 8, log_every=1)
    torch.set_num_threads(before)
    return work


def test_the_export_is_a_released_layout_directory_the_loader_reads_as_trained(
    trained: Path, tmp_path: Path
) -> None:
    out = export.write(trained, tmp_path / "voice")
    names = {p.name for p in out.iterdir()}
    assert {"cosyvoice2.yaml", "llm.pt", "flow.pt", "hift.pt", "spk2info.pt"} <= names
    assert "CosyVoice-BlankEN" in names and "RANDOM_WEIGHTS" not in names
    trained_json = json.loads((out / "TRAINED").read_text())
    assert trained_json["voice"] == export.NAME
    # the corpus's own sources (the test corpus: templates and no Asterisk or WordNet)
    assert trained_json["corpus"] == "voiceagent's own template sentences (Apache-2.0)"
    model = load(out)
    assert not model.random_weights and set(model.voices) == {export.NAME}
    # the weights are the trained ones (stored in float16)
    flow = flow_train.export_state(trained)
    key = next(k for k, v in flow.items() if v.is_floating_point() and v.dim() == 2)
    loaded = dict(model.flow.state_dict())[key]
    assert torch.equal(loaded, flow[key].half().float())
    pcm = model.synthesize_offline(list(range(20)), model.voices[export.NAME])
    assert len(pcm) > 0 and np.isfinite(pcm).all()
    # small enough to live with the project
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 50e6


def test_a_second_export_replaces_the_first_whole(trained: Path, tmp_path: Path) -> None:
    out = export.write(trained, tmp_path / "voice")
    (out / "stray").write_text("left from an older export")
    export.write(trained, tmp_path / "voice")
    assert not (out / "stray").exists() and not (tmp_path / "voice.tmp").exists()


def test_voiceagent_train_export_writes_where_it_is_told(trained: Path, tmp_path: Path, capsys):
    from voiceagent.cli import main

    assert main(["train", "export", "--out", str(trained), "--to", str(tmp_path / "v")]) == 0
    assert "export: " in capsys.readouterr().out and (tmp_path / "v" / "llm.pt").is_file()
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert main(["train", "export", "--out", str(empty), "--to", str(tmp_path / "x")]) == 2
    assert "no checkpoint of lm, flow, vocoder" in capsys.readouterr().err


def test_serve_without_a_model_speaks_with_the_shipped_voice_when_there_is_one(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """No --model: the exported voice where this copy ships one, said in the log; else
    (and with `--model tiny`) the tiny random model."""
    from voiceagent.model import checkpoint

    monkeypatch.setattr(checkpoint, "SHIPPED_VOICE", tmp_path / "voice-en")
    assert checkpoint.load_model(None, "cpu").random_weights  # nothing shipped: tiny
    export.write(trained, tmp_path / "voice-en")
    with caplog.at_level("INFO", logger="voiceagent"):
        model = checkpoint.load_model(None, "cpu")
    assert not model.random_weights and export.NAME in model.voices
    assert "voiceagent's own voice" in caplog.text
    assert checkpoint.load_model("tiny", "cpu").random_weights


def test_the_trained_lm_serves_through_sglang_as_the_embedded_engine_decodes(
    trained: Path, tmp_path: Path
) -> None:
    """Our own voice's LM exports for SGLang as CosyVoice2's does, and a real SGLang
    server decodes from it greedily what the embedded engine decodes."""
    from conftest import run
    from test_sglang import SGLANG_PYTHON, SGLangServer

    from voiceagent.engine.embedded import EmbeddedEngine
    from voiceagent.engine.sglang.client import SGLangLM
    from voiceagent.engine.sglang.export import export_sglang
    from voiceagent.model.sampling import SamplingParams

    if not SGLANG_PYTHON.exists():
        pytest.skip(f"SGLang is not installed at {SGLANG_PYTHON} (bash deploy/setup-sglang.sh)")
    model = load(export.write(trained, tmp_path / "voice"))
    voice = model.voices[export.NAME]
    text = model.tokenizer.encode(normalize("Have a nice day.", "auto"))

    async def tokens(lm: object) -> list[int]:
        gen = torch.Generator().manual_seed(0)
        stream = lm.generate(text, voice, SamplingParams(temperature=0.0), gen, 4, 30)  # type: ignore[attr-defined]
        return [t async for new in stream for t in new]

    out = tmp_path / "sglang"
    export_sglang(model, out)
    server = SGLangServer(out, tmp_path / "sglang.log")
    embedded = EmbeddedEngine(model)
    embedded.start()
    try:
        theirs = run(tokens(SGLangLM(model, server.url, out)))
        ours = run(tokens(embedded.lm))
    finally:
        embedded.stop()
        server.kill()
    assert 4 <= len(ours) <= 30 and theirs == ours


# -- seeding: training carried to another machine --------------------------------------


def _with_codebook(trained: Path, to: Path) -> Path:
    """A copy of the trained work directory with a codebook, as the tokens stage writes."""
    shutil.copytree(trained, to)
    rng = np.random.default_rng(0)
    book = tokens.Codebook(np.zeros(160), np.ones(160), rng.normal(size=(128, 160)))
    book.save(tokens.tokens_dir(to) / "codebook.npz")
    return to


def test_an_export_seeds_a_new_work_directory_where_each_part_resumes_at_its_step(
    trained: Path, tmp_path: Path
) -> None:
    """An export keeps, beside the voice (one copy of the weights, in float16), a
    training/ folder: each part's training state without weights or optimizer state, the
    codebook, the corpus and its tokens. A new work directory seeded with it (on another
    machine: the teacher's speech made again) trains each part on from its step, from
    the voice's weights."""
    work = _with_codebook(trained, tmp_path / "w")
    snap = export.write(work, tmp_path / "snap")
    steps = json.loads((snap / "TRAINED").read_text())["steps"]
    kept = snap / snapshot.TRAINING
    assert json.loads((kept / snapshot.MARK).read_text())["steps"] == steps
    for part, path in snapshot.checkpoints(work).items():
        state = torch.load(kept / f"{part}.pt", weights_only=True)
        assert steps[part] == state["step"] == torch.load(path, weights_only=True)["step"] > 0
        assert "model" not in state and "optimizer" not in state
    assert max(p.stat().st_size for p in kept.glob("*.pt")) < 1e5  # no weights there

    # a new machine: no codebook, no parts, no tokens, no corpus (the seed brings them)
    fresh = write_work(tmp_path / "fresh")
    shutil.rmtree(corpus.corpus_dir(fresh))
    (tokens.tokens_dir(fresh) / "tokens.npz").unlink()
    said = list(snapshot.seed(fresh, snap))
    assert said == [
        "seed: the corpus is --hours 0.01 --seed 0 --heldout 1 --no-asterisk: keep these "
        "flags (`train all`, `train corpus`)",
        *[f"seed: {part} from step {steps[part]}" for part in snapshot.PARTS],
    ]
    for name in ("codebook.npz", "tokens.npz"):  # the codes, and the LM's data
        assert (tokens.tokens_dir(fresh) / name).read_bytes() == (
            tokens.tokens_dir(work) / name
        ).read_bytes()
    assert corpus.load(fresh) == corpus.load(work)
    assert (lm_train.tokenizer_dir(fresh) / "config.json").is_file()
    assert torch.equal(flow_train.speaker_vector(fresh), flow_train.speaker_vector(work))
    for module in (lm_train, flow_train, vocoder_train):  # the same weights, as float16 keeps
        before, seeded = module.export_state(work), module.export_state(fresh)
        assert before.keys() == seeded.keys()
        for key, value in before.items():
            assert torch.allclose(seeded[key].float(), value.float(), rtol=2e-3, atol=1e-4), key
    assert flow_train.train(fresh, 30, steps=1, say=lambda *_: None)["step"] == steps["flow"] + 1
    voc = vocoder_train.train(fresh, 30, max_steps=steps["vocoder"] + 1, log_every=1)
    assert voc["step"] == steps["vocoder"] + 1
    # One step, however long a busy machine takes to load (a 3 s budget once made none).
    lm = lm_train.train(fresh, 300, threads=1, max_steps=steps["lm"] + 1, say=lambda *_: None)
    assert lm["step"] == steps["lm"] + 1


def test_a_work_directory_short_of_a_part_never_replaces_an_export(
    trained: Path, tmp_path: Path
) -> None:
    work = _with_codebook(trained, tmp_path / "w")
    export.write(work, tmp_path / "voice")
    vocoder_train.vocoder_dir(work).joinpath("checkpoint.pt").unlink()
    with pytest.raises(FileNotFoundError, match="no checkpoint of vocoder"):
        export.write(work, tmp_path / "voice")
    assert (tmp_path / "voice" / "hift.pt").is_file() and not (tmp_path / "voice.tmp").exists()


def test_seeding_never_replaces_what_a_work_directory_has(trained: Path, tmp_path: Path):
    work = _with_codebook(trained, tmp_path / "w")
    export.write(work, tmp_path / "snap")
    # its own codebook: the export's parts were trained on other codes
    assert list(snapshot.seed(work, tmp_path / "snap")) == [
        f"seed: {work} has its own codebook: the export's parts do not fit it"
    ]
    # the same codebook, and a part of its own
    other = write_work(tmp_path / "other")
    shutil.copytree(flow_train.flow_dir(work), flow_train.flow_dir(other))
    said = list(snapshot.seed(other, tmp_path / "snap"))
    assert "seed: flow keeps its own checkpoint" in said and len(said) == 4
    # its own corpus and tokens stay too
    assert (tokens.tokens_dir(other) / "tokens.npz").read_bytes() == (
        tokens.tokens_dir(write_work(tmp_path / "again")) / "tokens.npz"
    ).read_bytes()


def test_voiceagent_train_seed_starts_from_an_export(trained: Path, tmp_path: Path, capsys) -> None:
    from voiceagent.cli import main

    work, snap = _with_codebook(trained, tmp_path / "w"), tmp_path / "snap"
    assert main(["train", "export", "--out", str(work), "--to", str(snap)]) == 0
    fresh = write_work(tmp_path / "fresh")
    capsys.readouterr()
    assert main(["train", "seed", "--out", str(fresh), "--from", str(snap)]) == 0
    assert "seed: lm from step" in capsys.readouterr().out
    assert main(["train", "seed", "--out", str(fresh), "--from", str(tmp_path)]) == 2
    assert "not an export to train on" in capsys.readouterr().err


def test_the_provenance_names_each_source_the_corpus_was_made_of(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    stage = tmp_path / "corpus" / "stage.json"
    stage.write_text(json.dumps({"sources": {"money": 5, "ast": 2, "wordnet": 9}}))
    assert export.corpus_sources(tmp_path) == (
        "voiceagent's own template sentences (Apache-2.0), the Asterisk core sound prompts' "
        "transcripts (CC-BY-SA 3.0) and WordNet 3.0's example sentences (the WordNet 3.0 "
        "license)"
    )


def test_an_export_keeps_the_train_sentences_gzipped_and_the_seed_unpacks_them(
    trained: Path, tmp_path: Path
) -> None:
    """The biggest text of the shipped voice (5 MB, a tenth of the 50 MB it may take)."""
    work = _with_codebook(trained, tmp_path / "w")
    kept = corpus.corpus_dir(export.write(work, tmp_path / "snap") / snapshot.TRAINING)
    assert not (kept / "train.tsv").exists()
    plain = (corpus.corpus_dir(work) / "train.tsv").read_bytes()
    assert gzip.decompress((kept / "train.tsv.gz").read_bytes()) == plain
    # No time in the header (its bytes 4-8; flags byte 3: no name): the same sentences
    # pack to the same bytes, so a new export does not change them in git.
    header = (kept / "train.tsv.gz").read_bytes()[:8]
    assert header[3] == 0 and header[4:8] == bytes(4)
    fresh = write_work(tmp_path / "fresh")
    shutil.rmtree(corpus.corpus_dir(fresh))
    list(snapshot.seed(fresh, tmp_path / "snap"))
    assert sorted(p.name for p in corpus.corpus_dir(fresh).iterdir()) == sorted(
        p.name for p in corpus.corpus_dir(work).iterdir()
    )
    assert (corpus.corpus_dir(fresh) / "train.tsv").read_bytes() == plain


def test_a_seed_cut_short_goes_on_where_it_stopped(
    trained: Path, tmp_path: Path, monkeypatch
) -> None:
    """What was seen: a seed killed after its first copy (the codebook) left a work
    directory that the next seed took for one with a codebook of its own: it copied
    nothing more, and the parts trained from step 0."""
    work = _with_codebook(trained, tmp_path / "w")
    snap = export.write(work, tmp_path / "snap")
    fresh = write_work(tmp_path / "fresh")
    shutil.rmtree(corpus.corpus_dir(fresh))
    (tokens.tokens_dir(fresh) / "tokens.npz").unlink()
    real = snapshot._weights

    def killed_at_the_vocoder(source, part, state):
        if part == "vocoder":
            raise KeyboardInterrupt
        return real(source, part, state)

    monkeypatch.setattr(snapshot, "_weights", killed_at_the_vocoder)
    with pytest.raises(KeyboardInterrupt):
        list(snapshot.seed(fresh, snap))
    monkeypatch.undo()
    said = list(snapshot.seed(fresh, snap))
    assert "seed: vocoder from step" in said[-1], said
    assert (tokens.tokens_dir(fresh) / "codebook.npz").is_file()
    assert corpus.load(fresh) == corpus.load(work)


def test_an_export_that_fails_after_its_swap_leaves_the_new_voice_whole(
    trained: Path, tmp_path: Path, monkeypatch
) -> None:
    """What was seen: the old voice was deleted in place before the new one was moved
    there, so a kill during the deletion left a voice that loaded half (or not at all)."""
    work = _with_codebook(trained, tmp_path / "w")
    voice = export.write(work, tmp_path / "voice")
    real = shutil.rmtree

    def killed_removing_the_old(path, *args, **kwargs):
        if Path(path).name == "voice.old":
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(export.shutil, "rmtree", killed_removing_the_old)
    with pytest.raises(KeyboardInterrupt):
        export.write(work, voice)
    monkeypatch.undo()
    assert load(voice).voices  # the new one, whole
    export.write(work, voice)  # and the next export clears what was left
    assert not (tmp_path / "voice.old").exists()
