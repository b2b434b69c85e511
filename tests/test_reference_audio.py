"""Reference audio checks (voices/reference.py) on synthetic signals whose truth is known:
where the "speech" is, how loud it is, how much of it is clipped. A voiced signal here is
a 140 Hz harmonic tone (a vowel's spectrum) gated into 4 Hz syllables."""

from __future__ import annotations

import io
import wave

import av
import numpy as np
import pytest

from voiceagent.audio.decode import decode_audio
from voiceagent.voices.reference import (
    CLIP_FRACTION,
    MARGIN_S,
    MAX_UPLOAD_BYTES,
    PEAK_LIMIT,
    RATE,
    TARGET_DBFS,
    ReferenceAudioError,
    prepare_reference,
)


def wav(pcm: np.ndarray, rate: int, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def vowels(seconds: float, rate: int, level_dbfs: float = -30.0) -> np.ndarray:
    """Syllable-like voiced sound with an RMS of `level_dbfs`."""
    t = np.arange(int(seconds * rate)) / rate
    tone = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 20) if 140 * k < rate / 2)
    x = tone * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))  # syllables, never fully silent
    return np.asarray(x / np.sqrt(np.mean(x**2)) * 10 ** (level_dbfs / 20))


def rms_dbfs(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(x, dtype=np.float64)) + 1e-20))


def refused(data: bytes) -> ReferenceAudioError:
    with pytest.raises(ReferenceAudioError) as info:
        prepare_reference(data)
    return info.value


def test_trimming_keeps_the_speech_and_about_100_ms_around_it():
    rate = 16000
    speech = vowels(2.0, rate)
    padded = np.concatenate([np.zeros(rate), speech, np.zeros(int(1.5 * rate))])
    ref = prepare_reference(wav(padded, rate))
    assert ref.source_s == pytest.approx(4.5)
    # all of the 2 s kept, plus a margin on each side (30 ms frames: up to one frame more)
    assert 2.0 + 2 * MARGIN_S - 0.03 <= ref.duration_s <= 2.0 + 2 * MARGIN_S + 0.07
    # the voiced part sits where it was: the first 100 ms are (nearly) silent, then speech
    head = ref.pcm[: int(0.08 * RATE)]
    body = ref.pcm[int(0.15 * RATE) : int(0.25 * RATE)]
    assert rms_dbfs(head) < rms_dbfs(body) - 40
    assert ref.speech_s == pytest.approx(2.0, abs=0.15)


@pytest.mark.parametrize("level", [-45.0, -30.0, -12.0])
def test_normalization_brings_the_speech_to_minus_20_dbfs(level):
    ref = prepare_reference(wav(vowels(3.0, 24000, level), 24000))
    assert rms_dbfs(ref.pcm) == pytest.approx(TARGET_DBFS, abs=0.5)
    assert ref.gain_db == pytest.approx(TARGET_DBFS - level, abs=0.5)
    assert np.abs(ref.pcm).max() <= PEAK_LIMIT


def test_a_peaky_signal_is_limited_below_full_scale():
    rate = 24000
    x = vowels(3.0, rate, -40.0)
    x[::4000] = 0.9  # clicks: a crest factor no gain to -20 dBFS could keep under 1.0
    ref = prepare_reference(wav(x, rate))
    assert np.abs(ref.pcm).max() == pytest.approx(PEAK_LIMIT, abs=0.01)
    assert rms_dbfs(ref.pcm) < TARGET_DBFS - 3  # the limit wins over the target


def test_phone_audio_is_upsampled_and_warned_about():
    ref = prepare_reference(wav(vowels(3.0, 8000), 8000))
    assert ref.source_rate == 8000 and ref.pcm.dtype == np.float32
    assert ref.duration_s == pytest.approx(3.0, abs=0.1)
    assert len(ref.warnings) == 1 and "above 4 kHz" in ref.warnings[0]
    assert not prepare_reference(wav(vowels(3.0, 16000), 16000)).warnings


def test_any_rate_and_channel_count_becomes_24k_mono():
    rate = 44100
    x = vowels(3.0, rate)
    stereo = np.stack([x, 0.5 * x], axis=1).reshape(-1)  # interleaved
    ref = prepare_reference(wav(stereo, rate, channels=2))
    assert ref.source_rate == rate and ref.pcm.ndim == 1
    assert len(ref.pcm) == pytest.approx(3.0 * RATE, abs=0.1 * RATE)


@pytest.mark.parametrize("channels", [8, 16])
def test_surround_audio_is_averaged_to_mono(channels):
    # What was seen: a 7.1 WAV (8 channels) sent to POST /v1/voices crashed the whole
    # server (PyAV's planar float arrays segfault from 8 channels up).
    rate = 48000
    x = vowels(2.0, rate)
    gains = np.linspace(0.2, 1.0, channels)
    interleaved = (x[:, None] * gains[None, :]).reshape(-1)
    pcm, source_rate = decode_audio(wav(interleaved, rate, channels=channels))
    assert source_rate == rate and pcm.shape == x.shape
    assert np.abs(pcm - x * gains.mean()).max() < 1e-3 * channels  # 16-bit steps, averaged
    assert prepare_reference(wav(interleaved, rate, channels=channels)).pcm.ndim == 1


def test_short_clips_under_a_second_are_refused_longer_ones_warned():
    error = refused(wav(vowels(0.6, 16000), 16000))
    assert error.code == "audio_too_short" and "3-10 s" in error.message
    ref = prepare_reference(wav(vowels(1.2, 16000), 16000))
    assert any("3-10 s" in w for w in ref.warnings)


def test_long_clips_are_refused_by_their_trimmed_length():
    rate = 8000
    quiet = np.zeros(10 * rate)
    ok = prepare_reference(wav(np.concatenate([quiet, vowels(29.0, rate), quiet]), rate))
    assert ok.duration_s < 30
    error = refused(wav(vowels(31.0, rate), rate))
    assert error.code == "audio_too_long" and "31" in error.message
    error = refused(wav(vowels(61.0, rate), rate))  # decoding stops at 60 s
    assert error.code == "audio_too_long" and "60 s" in error.message


def test_clipping_is_measured_against_the_active_samples():
    rate = 16000
    x = vowels(3.0, rate, -20.0)
    n = len(x)
    under = x.copy()
    under[: int(0.5 * CLIP_FRACTION * n)] = 1.0  # half the allowed fraction
    prepare_reference(wav(under, rate))
    over = x.copy()
    over[: int(2 * CLIP_FRACTION * n)] = 1.0
    error = refused(wav(over, rate))
    assert error.code == "audio_clipped" and "1.0" in error.message  # "1.00 % ..."
    # silence around clipped speech does not dilute it
    padded = np.concatenate([np.zeros(10 * rate), over, np.zeros(10 * rate)])
    assert refused(wav(padded, rate)).code == "audio_clipped"


def test_silence_and_faint_noise_are_refused():
    rate = 16000
    assert refused(wav(np.zeros(2 * rate), rate)).code == "audio_silent"
    noise = np.random.default_rng(0).standard_normal(2 * rate) * 10 ** (-70 / 20)
    error = refused(wav(noise, rate))
    assert error.code == "audio_silent" and "-70" in error.message
    clicks = np.zeros(3 * rate)
    clicks[rate] = clicks[2 * rate] = 0.5  # loud but no voice
    assert refused(wav(clicks, rate)).code == "audio_silent"


def test_a_steady_tone_hum_or_noise_is_refused_as_not_speech():
    """What was seen: a 440 Hz tone made a voice (webrtcvad takes it for voice)."""
    rate = 16000
    t = np.arange(3 * rate) / rate
    tone = 0.3 * np.sin(2 * np.pi * 440 * t)
    hum = sum(0.1 / k * np.sin(2 * np.pi * 60 * k * t) for k in range(1, 8))
    noise = np.random.default_rng(0).standard_normal(3 * rate) * 0.05
    for steady in (tone, hum, noise):
        error = refused(wav(steady, rate))
        assert error.code == "audio_not_speech" and "dB" in error.message, error.message
    # a voice over a steady hum is speech
    prepare_reference(wav(vowels(3.0, rate, -20.0) + 0.1 * hum, rate))


def test_unreadable_and_oversized_uploads():
    assert refused(b"").code == "audio_unreadable"
    assert refused(b"plain text, not audio\n" * 50).code == "audio_unreadable"
    assert refused(wav(np.zeros(0), 16000)).code == "audio_unreadable"
    assert refused(wav(vowels(2.0, 4000), 4000)).code == "audio_unreadable"  # below 8 kHz
    assert refused(bytes(MAX_UPLOAD_BYTES + 1)).code == "audio_too_large"


def test_a_video_file_without_audio_is_unreadable():
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("ffv1", rate=10)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    error = refused(buf.getvalue())
    assert error.code == "audio_unreadable" and "no audio stream" in error.message
