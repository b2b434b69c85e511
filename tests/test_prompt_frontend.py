"""CosyVoice2 prompt frontend on real speech (espeak-ng) through FAKE ONNX models with the
released files' interface (tests/onnx_fakes.py), and audio decoding."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import av
import numpy as np
import pytest
import soxr
import torch
from onnx_fakes import write_fake_campplus, write_fake_speech_tokenizer

from voiceagent.audio.decode import decode_audio, load_audio
from voiceagent.audio.features import prompt_mel, whisper_log_mel
from voiceagent.bench.clips import espeak_wav, have_espeak
from voiceagent.model.contract import Voice
from voiceagent.model.cosyvoice2.prompt_frontend import PromptFrontend

TEXT = "The quick brown fox jumps over the lazy dog, and then it rests for a while."


def _write_wav(path: Path, pcm: np.ndarray, rate: int) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def _write_flac_stereo(path: Path, left: np.ndarray, right: np.ndarray, rate: int) -> Path:
    with av.open(str(path), "w") as out:
        stream = out.add_stream("flac", rate=rate, layout="stereo")
        pcm = (np.stack([left, right]).T.clip(-1, 1) * 32767).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return path


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cosyvoice2_onnx")
    write_fake_campplus(d / "campplus.onnx")
    write_fake_speech_tokenizer(d / "speech_tokenizer_v2.onnx")
    return d


@pytest.fixture(scope="module")
def frontend(onnx_dir: Path) -> PromptFrontend:
    return PromptFrontend(onnx_dir / "campplus.onnx", onnx_dir / "speech_tokenizer_v2.onnx")


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not have_espeak():
        pytest.skip("espeak-ng is not installed (Debian package espeak-ng): no speech to test on")
    return espeak_wav(tmp_path_factory.mktemp("speech") / "clip.wav", TEXT)


@pytest.fixture(scope="module")
def stereo48k(speech: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same speech as 48 kHz stereo FLAC, the right channel at half level."""
    pcm, rate = decode_audio(speech)
    x = soxr.resample(pcm, rate, 48000, quality="HQ")
    return _write_flac_stereo(tmp_path_factory.mktemp("stereo") / "clip.flac", x, 0.5 * x, 48000)


def _check_prompt(prompt: dict, seconds: float, text_ids: list[int]) -> None:
    tokens, mel, emb = prompt["prompt_tokens"], prompt["prompt_mel"], prompt["embedding"]
    assert set(prompt) == {"prompt_text_ids", "prompt_tokens", "prompt_mel", "embedding"}
    assert prompt["prompt_text_ids"] == tuple(text_ids)
    assert isinstance(tokens, tuple) and all(0 <= t < 6561 for t in tokens)
    assert abs(len(tokens) - 25 * seconds) <= 2  # 25 tokens a second
    assert isinstance(mel, torch.Tensor) and mel.dtype == torch.float32
    assert mel.shape == (2 * len(tokens), 80)  # exactly 2 mel frames per token
    assert emb.shape == (192,) and emb.dtype == torch.float32 and torch.isfinite(emb).all()


def test_prompt_from_speech_is_aligned(frontend: PromptFrontend, speech: Path) -> None:
    pcm, rate = decode_audio(speech)
    seconds = len(pcm) / rate
    assert 3 < seconds < 10, "espeak-ng should render a few seconds"
    prompt = frontend.make_prompt(speech, [11, 22, 33])
    _check_prompt(dict(prompt), seconds, [11, 22, 33])
    # The cut is the reference's: n = min(mel frames // 2, tokens), the rest dropped.
    wave16k, wave24k = load_audio(speech, 16000), load_audio(speech, 24000)
    tokens, mel = frontend.speech_tokens(wave16k), prompt_mel(wave24k)
    n = min(mel.shape[0] // 2, len(tokens))
    assert prompt["prompt_tokens"] == tuple(tokens[:n])
    assert np.array_equal(prompt["prompt_mel"].numpy(), mel[: 2 * n])
    # It is what a Voice is made of.
    voice = Voice(name="fox", **prompt)
    assert voice.prompt_mel is not None and voice.prompt_mel.shape[0] == 2 * n


def test_deterministic(frontend: PromptFrontend, onnx_dir: Path, speech: Path) -> None:
    a = frontend.make_prompt(speech, [1])
    other = PromptFrontend(onnx_dir / "campplus.onnx", onnx_dir / "speech_tokenizer_v2.onnx")
    b = other.make_prompt(speech.read_bytes(), [1])  # bytes in, same prompt out
    assert a["prompt_tokens"] == b["prompt_tokens"]
    assert torch.equal(a["prompt_mel"], b["prompt_mel"])
    assert torch.equal(a["embedding"], b["embedding"])


def test_stereo_48k_is_downmixed_and_resampled(
    frontend: PromptFrontend, speech: Path, stereo48k: Path
) -> None:
    mono = load_audio(speech, 16000)
    mixed = load_audio(stereo48k, 16000)
    # Channels averaged: (1 + 0.5) / 2 of the signal, after 22.05 -> 48 -> 16 kHz.
    n = min(len(mono), len(mixed))
    assert abs(len(mono) - len(mixed)) <= 1
    np.testing.assert_allclose(mixed[:n], 0.75 * mono[:n], atol=2e-3)
    prompt = frontend.make_prompt(stereo48k, [5])
    _check_prompt(dict(prompt), n / 16000, [5])
    # Louder or softer, the same speech: the whisper log-mel is level-normalised, so
    # nearly all tokens agree with the mono clip's.
    ref = frontend.make_prompt(speech, [5])["prompt_tokens"]
    k = min(len(ref), len(prompt["prompt_tokens"]))
    agree = np.mean(np.array(ref[:k]) == np.array(prompt["prompt_tokens"][:k]))
    assert agree > 0.5


def test_speech_tokens_follow_the_mel_length(frontend: PromptFrontend) -> None:
    x = np.random.default_rng(0).uniform(-0.3, 0.3, 16000 * 2 + 80)
    frames = whisper_log_mel(x).shape[1]
    assert len(frontend.speech_tokens(x)) == -(-frames // 4)


def test_speaker_embedding_depends_on_the_voice(
    frontend: PromptFrontend, speech: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other_voice.wav"
    espeak_wav(other, TEXT, ("-v", "en+f3", "-p", "80"))
    a = frontend.speaker_embedding(load_audio(speech, 16000))
    b = frontend.speaker_embedding(load_audio(other, 16000))
    again = frontend.speaker_embedding(load_audio(speech, 16000))
    assert torch.equal(a, again) and not torch.allclose(a, b, atol=1e-2)


def test_speaker_features_are_mean_normalised(frontend: PromptFrontend) -> None:
    """CosyVoice subtracts the fbank's mean over time, so a gain change (a constant shift
    of every log energy) leaves the speaker vector unchanged."""
    t = np.arange(24000) / 16000
    x = np.random.default_rng(3).standard_normal(24000) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    np.testing.assert_allclose(
        frontend.speaker_embedding(0.05 * x), frontend.speaker_embedding(0.4 * x), atol=1e-4
    )


def test_over_30_seconds_is_refused(frontend: PromptFrontend, tmp_path: Path) -> None:
    x = 0.1 * np.random.default_rng(0).standard_normal(16000 * 31)
    with pytest.raises(ValueError, match="30 s"):
        frontend.speech_tokens(x)
    with pytest.raises(ValueError, match="30 s"):
        frontend.make_prompt(_write_wav(tmp_path / "long.wav", x, 16000), [1])


def test_missing_and_corrupt_onnx_files_are_named(onnx_dir: Path, tmp_path: Path) -> None:
    campplus, tokenizer = onnx_dir / "campplus.onnx", onnx_dir / "speech_tokenizer_v2.onnx"
    missing = tmp_path / "speech_tokenizer_v2.onnx"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        PromptFrontend(campplus, missing)
    corrupt = tmp_path / "campplus.onnx"
    corrupt.write_bytes(b"not an onnx model" * 10)
    with pytest.raises(ValueError, match=str(corrupt)):
        PromptFrontend(corrupt, tokenizer)
    with pytest.raises(ValueError, match=str(tokenizer)):  # the two files swapped
        PromptFrontend(tokenizer, campplus)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"RIFF....WAVEfmt this is not audio at all" * 20, "cannot read audio"),
        (b"", "cannot read audio"),
        (None, "no samples"),  # a valid WAV with zero frames
        ("short", "lasts 0.30 s"),
        ("8k", "8000 Hz"),
    ],
)
def test_bad_audio_is_refused(
    frontend: PromptFrontend, tmp_path: Path, content: bytes | str | None, match: str
) -> None:
    path = tmp_path / "bad.wav"
    if content is None:
        _write_wav(path, np.zeros(0), 16000)
    elif content == "short":
        _write_wav(path, 0.1 * np.ones(4800), 16000)
    elif content == "8k":
        _write_wav(path, 0.1 * np.random.default_rng(0).standard_normal(24000), 8000)
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        frontend.make_prompt(path, [1])


def test_missing_audio_is_a_value_error(frontend: PromptFrontend, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        frontend.make_prompt(tmp_path / "nope.wav", [1])


def test_load_audio_bytes_and_range() -> None:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(np.array([32767, -32768] * 11025, dtype="<i2").tobytes())
    out = load_audio(buf.getvalue(), 16000)
    assert out.dtype == np.float32 and out.ndim == 1 and abs(len(out) - 16000) <= 1
    assert out.min() >= -1.0 and out.max() <= 1.0
