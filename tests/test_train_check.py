"""`voiceagent train check`: each part heard alone. Its two stand-ins must be faithful
for the WERs to mean anything: Griffin-Lim makes a mel audible as speech a recognizer
still understands, and a token's centroid is the mel the codebook stored for it."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from voiceagent.audio.features import prompt_mel
from voiceagent.bench import phone_speech
from voiceagent.train import check, tokens
from voiceagent.train import wer as meter


def real_sentences(n: int) -> list[phone_speech.Prompt]:
    if not phone_speech.available():
        pytest.skip("asterisk-core-sounds-en-wav is not installed: no real speech")
    found = [
        p
        for p in phone_speech.prompts()
        if p.is_speech and p.text and len(p.text.split()) >= 6 and 2.0 <= p.seconds <= 6.0
    ][:n]
    if len(found) < n:
        pytest.skip("asterisk-core-sounds-en (transcripts) is not installed")
    return found


def test_griffin_lim_of_real_speech_mel_is_still_understood() -> None:
    pytest.importorskip("pocketsphinx", reason="pocketsphinx (a test extra) is not installed")
    heard, rebuilt = [], []
    for p in real_sentences(2):
        wav = soxr.resample(p.pcm.astype(np.float32) / 32768, phone_speech.RATE, 24000)
        wav = wav[: len(wav) // 480 * 480]
        mel = prompt_mel(wav)
        back = check.griffin_lim(mel)
        assert back.shape == (480 * mel.shape[0],) and np.isfinite(back).all()
        # the mel of what Griffin-Lim made is the mel it was given (a level apart:
        # the output is normalized), where the speech has energy
        again = prompt_mel(back)
        loud = mel > np.percentile(mel, 50)
        shift = float(np.median(again[loud] - mel[loud]))
        assert float(np.abs(again - shift - mel)[loud].mean()) < 0.5
        heard.append((p.text, meter.transcribe(wav, 24000)))
        rebuilt.append((p.text, meter.transcribe(back, 24000)))
    original, griffin = meter.corpus_wer(heard), meter.corpus_wer(rebuilt)
    assert griffin <= original + 0.25, (original, griffin, rebuilt)


def test_a_tokens_centroid_is_its_two_mel_frames() -> None:
    rng = np.random.default_rng(0)
    mean, std = rng.normal(size=160), rng.uniform(0.5, 2.0, size=160)
    book = tokens.Codebook(mean, std, rng.normal(size=(16, 160)))
    mel = check.centroid_mel(book, np.array([3, 3, 9]))
    assert mel.shape == (6, 80)
    pair = book.centroids.numpy()[9] * book.std + book.mean
    assert np.allclose(mel[4:6].reshape(-1), pair, atol=1e-5)
    assert np.allclose(mel[0:2], mel[2:4])
    # and encoding that mel gives the tokens back
    assert book.encode(mel).tolist() == [3, 3, 9]
    # a token past the codebook (the LM's vocabulary is larger) is the quietest centroid
    quiet = int((book.centroids.numpy() * book.std + book.mean).mean(axis=1).argmin())
    assert np.array_equal(
        check.centroid_mel(book, np.array([6000])), check.centroid_mel(book, np.array([quiet]))
    )
