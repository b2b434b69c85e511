"""`voiceagent bench --scenario intelligibility`: the held-out sentences of a training work
directory, spoken by a real server and transcribed by the real pocketsphinx, next to the
teacher's speech of the same sentences.

The work directory here is a small one made for the test: three held-out sentences whose
"teacher" WAVs are real human speech (Asterisk prompts, 8 kHz, resampled to the teacher's
22.05 kHz), which pocketsphinx understands well. The server runs the random-weight tiny
model, whose audio is noise. So the bench must find the teacher intelligible and the
server not: it tells speech from noise. pocketsphinx and the Asterisk prompts are real
parts; without them the tests skip, which VOICEAGENT_NO_SKIPS=1 turns into a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soxr

from voiceagent.audio.wav import write_wav
from voiceagent.bench import intelligibility, phone_speech
from voiceagent.train import corpus, teacher
from voiceagent.train.corpus import Sentence

CLI = [sys.executable, "-m", "voiceagent.cli", "--log-level", "warning", "bench"]
# Prompts pocketsphinx transcribes without an error at 8 kHz (2 to 3 s each); the last
# has no teacher WAV in the missing-WAV test.
PROMPTS = ("pls-hold-while-try", "cannot-complete-as-dialed", "privacy-incorrect")


@pytest.fixture(scope="module")
def prompts() -> list[phone_speech.Prompt]:
    pytest.importorskip("pocketsphinx", reason="pocketsphinx (a test extra) is not installed")
    if not phone_speech.available():
        pytest.skip("asterisk-core-sounds-en-wav is not installed: no real speech")
    found = [phone_speech.prompt(name) for name in PROMPTS]
    if any(p.text is None for p in found):
        pytest.skip("asterisk-core-sounds-en is not installed: no prompt transcripts")
    return found


def make_work(root: Path, prompts: list[phone_speech.Prompt], with_wavs: int) -> list[Sentence]:
    """A work directory with the prompts as held-out sentences (spoken and written form:
    the transcript) and teacher WAVs (22.05 kHz) for the first `with_wavs` of them."""
    sentences = [Sentence(f"ast-{i}", p.text or "", p.text or "") for i, p in enumerate(prompts)]
    (root / "corpus").mkdir(parents=True)
    corpus.write_tsv(root / "corpus" / "heldout.tsv", sentences)
    wav_dir = root / "teacher" / "wav"
    wav_dir.mkdir(parents=True)
    for s, p in list(zip(sentences, prompts, strict=True))[:with_wavs]:
        pcm = p.pcm.astype(np.float32) / 32768
        speech = soxr.resample(pcm, phone_speech.RATE, teacher.RATE)
        write_wav(wav_dir / f"{s.id}.wav", speech, teacher.RATE)
    return sentences


def test_the_teacher_is_understood_and_the_noise_of_a_random_model_is_not(
    tmp_path, prompts, tiny_dir
) -> None:
    make_work(tmp_path, prompts, with_wavs=3)
    args = ["--scenario", "intelligibility", "--model", str(tiny_dir), "--work", str(tmp_path)]
    proc = subprocess.run(
        [*CLI, *args, "--sentences", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    report = json.loads(proc.stdout)  # stdout is exactly one JSON object

    # the keys other tools read
    assert report["model"] == "tiny"
    ours, tea = report["ours"], report["teacher"]
    assert ours["sentences"] == 2 and tea["sentences"] == 2  # two of three, spread, in order
    assert [row["id"] for row in report["per_sentence"]] == ["ast-0", "ast-1"]
    # speech from noise: the teacher's human speech is understood, the tiny model's noise is not
    assert tea["wer"] <= 0.25, report["per_sentence"]
    assert ours["wer"] >= 0.8, report["per_sentence"]
    assert tea["missing"] == []
    # the server was measured per turn, as the ws bench measures it
    assert 0 < ours["ttfa_ms_p50"] <= ours["ttfa_ms_p95"]
    assert 0 < ours["rtf"] < 10
    assert all(row["audio_s"] > 0.1 for row in report["per_sentence"])


def test_a_missing_teacher_wav_is_reported_and_left_out_of_the_teachers_wer(
    tmp_path, prompts, tiny_model
) -> None:
    sentences = make_work(tmp_path, prompts, with_wavs=2)
    report = intelligibility.measure(tiny_model, tmp_path, sentences=3, workers=2)
    assert report["ours"]["sentences"] == 3
    assert report["teacher"]["sentences"] == 2
    assert report["teacher"]["missing"] == [sentences[2].id]
    assert report["per_sentence"][2]["teacher"] is None
    assert report["teacher"]["wer"] <= 0.25
    assert "missing for 1 of 3" in intelligibility.table(report)


def test_with_several_seeds_each_sentence_is_sampled_again_and_the_wer_pools_them(
    tmp_path, prompts, tiny_model
) -> None:
    make_work(tmp_path, prompts, with_wavs=2)
    report = intelligibility.measure(tiny_model, tmp_path, sentences=2, workers=2, seeds=2)
    rows = report["per_sentence"]
    assert [(r["id"], r["seed"]) for r in rows] == [
        ("ast-0", 0),
        ("ast-1", 0),
        ("ast-0", 1),
        ("ast-1", 1),
    ]
    assert report["ours"]["seeds"] == 2 and len(report["ours"]["wer_by_seed"]) == 2
    assert report["ours"]["sentences"] == 2 and report["teacher"]["sentences"] == 2
    # another seed, other samples (the random model's noise differs)
    first, again = intelligibility.synthesize(tiny_model, [Sentence("x", "a", "a")], 2.0, seeds=2)
    assert (first.seed, again.seed) == (0, 1)
    assert first.pcm.shape != again.pcm.shape or not np.array_equal(first.pcm, again.pcm)
    assert "sampling seeds 0-1" in intelligibility.table(report)


def test_every_draw_of_the_teacher_is_heard_and_its_wer_pools_them(
    tmp_path, prompts, tiny_model
) -> None:
    """Piper's noise is unseeded, so each speaking of the held-out sentences is another
    draw: the bench hears every draw the teacher stage spoke, as it hears every seed of
    ours. Here draw 1 is noise, so its WER is far from draw 0's and the pool between."""
    sentences = make_work(tmp_path, prompts, with_wavs=2)
    noise_dir = teacher.draw_dir(tmp_path, 1)
    noise_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for s in sentences[:2]:
        write_wav(
            noise_dir / f"{s.id}.wav", 0.3 * rng.standard_normal(teacher.RATE * 2), teacher.RATE
        )
    report = intelligibility.measure(tiny_model, tmp_path, sentences=2, workers=2)
    tea = report["teacher"]
    assert tea["draws"] == 2 and tea["sentences"] == 2
    speech, noise = tea["wer_by_draw"]
    assert speech <= 0.25 and noise >= 0.8, report
    # the same sentences in both draws: the pooled WER is the mean of the two
    assert tea["wer"] == pytest.approx((speech + noise) / 2, abs=1e-3)
    assert report["per_sentence"][0]["teacher_wer"] <= 0.25  # draw 0's transcript
    assert "2 draws" in intelligibility.table(report)


def test_without_a_held_out_corpus_it_says_which_stages_to_run(tmp_path) -> None:
    proc = subprocess.run(
        [*CLI, "--scenario", "intelligibility", "--work", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "voiceagent train corpus" in proc.stderr
    assert "voiceagent train teacher" in proc.stderr


def test_the_held_out_sample_spreads_over_every_source_in_corpus_order() -> None:
    """The corpus writes its sources one after another (WordNet's 111 held-out sentences
    first): the bench's first 30 would all be WordNet, an evenly spaced 30 are not."""
    held = [f"wordnet-{i}" for i in range(111)] + [f"money-{i}" for i in range(89)]
    picked = corpus.spread(held, 30)
    assert len(picked) == 30 and picked[0] == "wordnet-0"
    assert picked == sorted(picked, key=held.index)  # in order, no repeats
    assert 13 <= sum(p.startswith("money") for p in picked) <= 14  # in proportion
    assert corpus.spread(held[:3], 5) == held[:3]  # asking for more gives all
