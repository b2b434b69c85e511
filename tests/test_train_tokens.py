"""Stages `feats` and `tokens`: the teacher's speech at the model's rate with the flow's
mel, and speech tokens of our own at 25 per second; a corpus that grows later gets its
new utterances' features and tokens without the codebook the parts were trained on
changing."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from voiceagent.audio.features import prompt_mel
from voiceagent.train import feats, tokens


def add_utterance(work: Path, uid: str, f0: float, seconds: float, split: str = "train") -> None:
    """A 22.05 kHz teacher WAV of a tone and its manifest row."""
    wav_dir = work / "teacher" / "wav"
    wav_dir.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(22050 * seconds)) / 22050
    pcm = (0.3 * np.sin(2 * np.pi * f0 * t) * 32767).astype("<i2")
    with wave.open(str(wav_dir / f"{uid}.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(pcm.tobytes())
    manifest = work / "teacher" / "manifest.tsv"
    rows = manifest.read_text() if manifest.exists() else "id\tseconds\ttext\tsplit\n"
    manifest.write_text(rows + f"{uid}\t{seconds:.3f}\ta tone\t{split}\n")


def test_feats_are_24_khz_audio_with_two_mel_frames_per_token(tmp_path: Path) -> None:
    add_utterance(tmp_path, "u0", 180.0, 1.03)
    list(feats.run(tmp_path))
    wav, mel = feats.load(tmp_path, "u0")
    assert mel.shape[0] % 2 == 0 and mel.shape[1] == 80
    assert len(wav) == 480 * mel.shape[0] and abs(len(wav) - 24000 * 1.03) < 960
    # the flow's mel of that audio, where there is energy (the audio is stored as 16-bit
    # PCM: in the bins a pure tone leaves near-silent, rounding noise moves the log)
    loud = mel > -5
    assert loud.sum() > 50 and np.abs(mel - prompt_mel(wav))[loud].max() < 0.01
    assert feats.is_complete(tmp_path)


def test_tokens_cover_every_utterance_and_a_new_one_keeps_the_codebook(tmp_path: Path) -> None:
    for i, f0 in enumerate((120.0, 200.0, 320.0)):
        add_utterance(tmp_path, f"u{i}", f0, 0.8)
    list(feats.run(tmp_path))
    list(tokens.run(tmp_path, codes=8, iterations=5))
    toks = tokens.load_tokens(tmp_path)
    assert set(toks) == {"u0", "u1", "u2"} and tokens.is_complete(tmp_path)
    for uid, t in toks.items():
        assert len(t) == feats.load(tmp_path, uid)[1].shape[0] // 2 and t.max() < 8
    assert len({int(toks[u][len(toks[u]) // 2]) for u in toks}) == 3  # pitch tells them apart
    book = (tmp_path / "tokens" / "codebook.npz").read_bytes()

    add_utterance(tmp_path, "u3", 200.0, 0.8)
    assert not feats.is_complete(tmp_path) and not tokens.is_complete(tmp_path)
    list(feats.run(tmp_path))
    list(tokens.run(tmp_path, codes=8, iterations=5))
    assert (tmp_path / "tokens" / "codebook.npz").read_bytes() == book
    again = tokens.load_tokens(tmp_path)
    assert all(np.array_equal(again[u], toks[u]) for u in toks)
    assert np.array_equal(again["u3"], again["u1"])  # the same tone, the same codes


def test_tokens_are_stored_packed_and_the_per_utterance_files_of_earlier_runs_still_read(
    tmp_path: Path,
) -> None:
    """The file ships with the voice: packed, 52,000 utterances of 25 Hz tokens are about
    their own size, not 13 MB of per-array headers more."""
    rng = np.random.default_rng(0)
    many = {f"u{i}": rng.integers(0, 2048, 5 + i % 40).astype(np.int16) for i in range(2000)}
    many["empty"] = np.zeros(0, np.int16)
    packed, legacy = tmp_path / "packed.npz", tmp_path / "legacy.npz"
    tokens.save_tokens(packed, many)
    np.savez(legacy, **many)  # type: ignore[arg-type]
    for path in (packed, legacy):
        back = tokens.read_tokens(path)
        assert list(back) == list(many)
        assert all(np.array_equal(back[k], v) for k, v in many.items())
        assert {v.dtype for v in back.values()} == {np.dtype(np.int16)}
    payload = sum(v.nbytes for v in many.values())
    assert packed.stat().st_size < 1.2 * payload < legacy.stat().st_size / 2
    tokens.save_tokens(packed, {})
    assert tokens.read_tokens(packed) == {}


def test_speech_made_again_is_encoded_again_and_kept_tokens_without_speech_stay(
    tmp_path: Path,
) -> None:
    """On a new machine (`train seed`), tokens.npz holds an export's kept tokens and the
    teacher speaks part of the corpus again: that speech is encoded anew (the flow pairs
    tokens with this mel), and tokens of sentences not spoken here stay, for the LM."""
    for i, f0 in enumerate((120.0, 320.0)):
        add_utterance(tmp_path, f"u{i}", f0, 0.8)
    list(feats.run(tmp_path))
    list(tokens.run(tmp_path, codes=8, iterations=5))
    fresh = tokens.load_tokens(tmp_path)
    # as a seeded work directory: a codebook and tokens from elsewhere, no stage.json
    stale = {"u0": fresh["u1"][:3], "banked": np.array([1, 2, 3], dtype=np.int16)}
    np.savez(tmp_path / "tokens" / "tokens.npz", **stale)  # type: ignore[arg-type]
    (tmp_path / "tokens" / "stage.json").unlink()
    assert not tokens.is_complete(tmp_path)
    said = list(tokens.run(tmp_path))
    assert "keeping the tokens of 1 sentences without speech here" in said[0]
    again = tokens.load_tokens(tmp_path)
    assert set(again) == {"u0", "u1", "banked"} and tokens.is_complete(tmp_path)
    assert np.array_equal(again["u0"], fresh["u0"]) and np.array_equal(again["u1"], fresh["u1"])
    assert again["banked"].tolist() == [1, 2, 3]


def test_feats_and_tokens_take_what_a_teacher_cut_short_has_spoken(tmp_path: Path, capsys) -> None:
    """`teacher --limit` leaves a manifest of the WAVs spoken so far and no stage mark:
    feats and tokens work on those (the LM and the flow train on them); with nothing
    spoken, feats says so."""
    from voiceagent.cli import main

    out = ["--out", str(tmp_path)]
    assert main(["train", "feats", *out]) == 2
    assert "spoken nothing" in capsys.readouterr().err
    add_utterance(tmp_path, "u0", 150.0, 0.8)
    assert main(["train", "tokens", *out, "--codes", "4"]) == 0
    said = capsys.readouterr().out
    assert "has not spoken the whole corpus" in said
    assert set(tokens.load_tokens(tmp_path)) == {"u0"} and tokens.is_complete(tmp_path)


def test_tokens_refuse_a_codes_flag_the_kept_codebook_does_not_have(tmp_path: Path, capsys) -> None:
    """The LM and the flow were trained on the codebook's codes, so it stays; a `--codes`
    that asks for another size says so instead of being passed over in silence."""
    from voiceagent.cli import main

    out = ["--out", str(tmp_path)]
    add_utterance(tmp_path, "u0", 150.0, 0.8)
    assert main(["train", "tokens", *out, "--codes", "4"]) == 0
    book = (tmp_path / "tokens" / "codebook.npz").read_bytes()
    add_utterance(tmp_path, "u1", 250.0, 0.8)
    capsys.readouterr()
    assert main(["train", "tokens", *out, "--codes", "8"]) == 2
    assert "has 4 codes, not --codes 8" in capsys.readouterr().err
    assert (tmp_path / "tokens" / "codebook.npz").read_bytes() == book
    assert set(tokens.load_tokens(tmp_path)) == {"u0"}
    # the same size, or none asked for, encodes the new speech with the kept codebook
    assert main(["train", "tokens", *out, "--codes", "4"]) == 0
    assert set(tokens.load_tokens(tmp_path)) == {"u0", "u1"}
    assert (tmp_path / "tokens" / "codebook.npz").read_bytes() == book
