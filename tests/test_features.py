"""The prompt features against golden values from the genuine libraries
(tests/data/features/README.md says how they were made), plus framing and sanity checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from voiceagent.audio import features as F

GOLDEN = Path(__file__).parent / "data" / "features" / "golden.npz"


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as g:
        return dict(g)


def _pcm(g: dict[str, np.ndarray], key: str) -> np.ndarray:
    # int16 stored; the references were computed on exactly these float32 values.
    return g[key].astype(np.float32) / 32768.0


def test_kaldi_fbank_matches_torchaudio_and_kaldi_native_fbank(golden: dict) -> None:
    ours = F.kaldi_fbank(_pcm(golden, "pcm16"))
    assert ours.shape == (23, 80) and ours.dtype == np.float32
    # Both references work in float32; the largest gaps (~5e-4) are in near-silent bins.
    np.testing.assert_allclose(ours, golden["kaldi_fbank"], rtol=0, atol=1e-3)
    np.testing.assert_allclose(ours, golden["kaldi_fbank_knf"], rtol=0, atol=1e-3)
    # The trailing silence hits the float32-epsilon floor, as in torchaudio.
    assert np.all(ours[-1] == np.float32(np.log(np.finfo(np.float32).eps)))


def test_whisper_log_mel_matches_whisper(golden: dict) -> None:
    ours = F.whisper_log_mel(_pcm(golden, "pcm16"), n_mels=128)
    assert ours.shape == (128, 25) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, golden["whisper_log_mel"], rtol=0, atol=1e-5)


def test_prompt_mel_matches_matcha_mel_spectrogram(golden: dict) -> None:
    ours = F.prompt_mel(_pcm(golden, "pcm24"))
    assert ours.shape == (12, 80) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, golden["prompt_mel"], rtol=0, atol=1e-5)
    # sqrt(1e-9) through the filters stays under the 1e-5 floor: silence is exactly ln(1e-5)
    assert np.all(F.prompt_mel(np.zeros(4800)) == np.float32(np.log(1e-5)))


def test_slaney_filters_match_librosa(golden: dict) -> None:
    whisper = F.slaney_mel_filters(16000, 400, 128, 0.0, 8000.0)
    np.testing.assert_allclose(whisper, golden["slaney_16k_400_128"], rtol=0, atol=1e-8)
    flow = F.slaney_mel_filters(24000, 1920, 80, 0.0, 8000.0)
    rows = golden["slaney_24k_1920_80_row_ids"]
    np.testing.assert_allclose(flow[rows], golden["slaney_24k_1920_80_rows"], rtol=0, atol=1e-8)
    assert not flow[:, 641:].any()  # nothing above fmax = 8 kHz (bin 640)


@pytest.mark.parametrize("n", [721, 4000, 16000, 16161])
def test_frame_counts(n: int) -> None:
    x = np.random.default_rng(n).uniform(-0.5, 0.5, n)
    assert F.kaldi_fbank(x).shape == (1 + (n - 400) // 160, 80)
    assert F.whisper_log_mel(x).shape == (128, n // 160)
    assert F.prompt_mel(x).shape == (n // 480, 80)


def test_tones_land_in_the_right_bins() -> None:
    """Independent of the goldens: a 1 kHz tone peaks in the filter centred nearest 1 kHz."""
    t16, t24 = np.arange(16000) / 16000, np.arange(24000) / 24000
    edges = F.slaney_mel_to_hz(np.linspace(0, F.hz_to_slaney_mel(8000.0), 82))
    expected = int(np.argmin(np.abs(edges[1:-1] - 1000.0)))
    assert F.prompt_mel(0.5 * np.sin(2 * np.pi * 1000 * t24)).mean(0).argmax() == expected
    kaldi_centres = np.exp(np.linspace(np.log1p(20 / 700), np.log1p(8000 / 700), 82))
    kaldi_hz = 700 * (kaldi_centres[1:-1] - 1)
    kaldi_expected = int(np.argmin(np.abs(kaldi_hz - 1000.0)))
    assert F.kaldi_fbank(0.5 * np.sin(2 * np.pi * 1000 * t16)).mean(0).argmax() == kaldi_expected


def test_whisper_dynamic_range_is_clamped_to_8() -> None:
    x = np.zeros(16000)
    x[:8000] = 0.5 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)
    mel = F.whisper_log_mel(x)
    # log10 range of 8, then divided by 4
    assert mel.max() - mel.min() == pytest.approx(2.0, abs=1e-6)


def test_scale_is_not_int16() -> None:
    """CosyVoice feeds [-1, 1] floats; int16-scaled input would shift every log energy."""
    x = np.random.default_rng(0).uniform(-0.5, 0.5, 4000)
    shift = F.kaldi_fbank(x * 32768.0) - F.kaldi_fbank(x)
    assert np.allclose(shift, 2 * np.log(32768.0), atol=1e-3)


@pytest.mark.parametrize(
    ("fn", "bad"),
    [
        (F.kaldi_fbank, np.zeros(399)),
        (F.whisper_log_mel, np.zeros(200)),
        (F.prompt_mel, np.zeros(720)),
        (F.kaldi_fbank, np.zeros((2, 1000))),
        (F.prompt_mel, np.full(2000, np.nan)),
    ],
)
def test_bad_input_is_refused(fn: Callable[[np.ndarray], np.ndarray], bad: np.ndarray) -> None:
    with pytest.raises(ValueError):
        fn(bad)


def test_deterministic_and_input_untouched() -> None:
    x = np.random.default_rng(1).uniform(-1, 1, 24000).astype(np.float32)
    before = x.copy()
    a, b = F.prompt_mel(x), F.prompt_mel(x)
    assert np.array_equal(a, b) and np.array_equal(x, before)
