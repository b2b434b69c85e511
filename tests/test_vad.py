"""VoiceActivity on real speech (espeak-ng) padded with silence: onset, offset, clicks,
chunking and aggressiveness. webrtcvad calls white noise speech, so speech here is voiced
(espeak) and silence is digital silence, except where noise is the point."""

from __future__ import annotations

import numpy as np
import pytest

from voiceagent.audio.vad import VoiceActivity
from voiceagent.bench.clips import espeak_pcm, have_espeak
from voiceagent.protocol.messages import Input
from voiceagent.session.runner import Listener

SENTENCE = "Your order shipped this morning and will arrive on Tuesday"
PAD_S = 1.0


@pytest.fixture(scope="module")
def speech() -> tuple[np.ndarray, int]:
    """espeak-ng speech (float32 mono, its native 22050 Hz), no padding."""
    if not have_espeak():
        pytest.skip("espeak-ng is not installed: no real speech to detect")
    return espeak_pcm(SENTENCE)


def padded(pcm: np.ndarray, rate: int) -> np.ndarray:
    pad = np.zeros(int(PAD_S * rate), np.float32)
    return np.concatenate([pad, pcm, pad])


def true_bounds_ms(signal: np.ndarray, rate: int) -> tuple[int, int]:
    """Speech start and end from the signal energy (10 ms RMS above -40 dBFS)."""
    hop = rate // 100
    frames = signal[: signal.size // hop * hop].reshape(-1, hop)
    active = np.nonzero(np.sqrt(np.mean(frames**2, axis=1)) > 0.01)[0]
    return int(active[0]) * 10, (int(active[-1]) + 1) * 10


def run_vad(vad: VoiceActivity, signal: np.ndarray, chunk: int) -> list[tuple[str, int, int]]:
    """(kind, t_ms, audio ms fed when the event came out), chunk by chunk, then flush."""
    out = []
    for i in range(0, signal.size, chunk):
        fed_ms = round(min(i + chunk, signal.size) / vad.sample_rate * 1000)
        out += [(kind, t, fed_ms) for kind, t in vad.feed(signal[i : i + chunk])]
    end_ms = round(signal.size / vad.sample_rate * 1000)
    out += [(kind, t, end_ms) for kind, t in vad.flush()]
    return out


def test_onset_and_offset_of_real_speech(speech):
    pcm, rate = speech
    signal = padded(pcm, rate)
    start, end = true_bounds_ms(signal, rate)
    assert start == pytest.approx(PAD_S * 1000, abs=30)
    vad = VoiceActivity(rate, aggressiveness=2, frame_ms=20, min_speech_ms=100, hangover_ms=300)
    events = run_vad(vad, signal, rate // 50)  # 20 ms chunks, as from a network track
    assert [e[0] for e in events] == ["speech_started", "speech_stopped"], events
    (_, on_t, on_fed), (_, off_t, off_fed) = events
    # Onset time within 40 ms of the true start; confirmed within min_speech + 100 ms
    # (window frames, the resampler's lag and chunking).
    assert start - 40 <= on_t <= start + 40
    assert on_fed <= start + 100 + 100
    # Offset at the true end (give or take a frame or two of trailing low-energy sound),
    # produced only after the hangover.
    assert end - 100 <= off_t <= end + 200
    assert off_fed >= off_t + 300
    assert off_fed <= off_t + 300 + 100
    # The voiced audio it counts (barge-in past the guard needs it) is the speech's,
    # less its pauses: none of the padding.
    assert 0.6 * (end - start) <= vad.voiced_ms <= end - start + 100


def test_hangover_and_min_speech_are_configurable(speech):
    pcm, rate = speech
    signal = padded(pcm, rate)
    fed = {}
    for hangover in (200, 600):
        vad = VoiceActivity(rate, min_speech_ms=100, hangover_ms=hangover)
        events = run_vad(vad, signal, 441)
        assert [e[0] for e in events] == ["speech_started", "speech_stopped"], events
        fed[hangover] = events[1][2]
    assert fed[600] - fed[200] == pytest.approx(400, abs=40)
    onsets = {}
    for min_speech in (60, 300):
        vad = VoiceActivity(rate, min_speech_ms=min_speech, hangover_ms=300)
        onsets[min_speech] = run_vad(vad, signal, 441)[0][2]
    assert onsets[300] - onsets[60] >= 200


def test_no_events_on_silence():
    for rate in (8000, 16000, 48000):
        vad = VoiceActivity(rate, aggressiveness=0, min_speech_ms=60)
        assert run_vad(vad, np.zeros(3 * rate, np.float32), rate // 100) == []
        assert vad.time_ms >= 2900


def test_a_click_shorter_than_min_speech_is_ignored(speech):
    pcm, rate = speech
    start_ms, _ = true_bounds_ms(pcm, rate)
    # 40 ms of voiced speech from inside the utterance, between seconds of silence.
    # webrtcvad itself stretches a voiced burst by ~60-100 ms, hence min_speech 200.
    mid = int((start_ms / 1000 + 0.5) * rate)
    click = pcm[mid : mid + int(0.04 * rate)]
    vad = VoiceActivity(rate, aggressiveness=3, frame_ms=10, min_speech_ms=200)
    assert run_vad(vad, padded(click, rate), 441) == []
    # ...while the same settings do fire on 400 ms of the same speech (the test can fail)
    longer = pcm[mid : mid + int(0.4 * rate)]
    vad = VoiceActivity(rate, aggressiveness=3, frame_ms=10, min_speech_ms=200)
    assert [e[0] for e in run_vad(vad, padded(longer, rate), 441)] == [
        "speech_started",
        "speech_stopped",
    ]


def test_aggressiveness_changes_what_counts_as_speech(speech):
    pcm, rate = speech
    signal = padded(pcm, rate)
    noisy = signal + 0.05 * np.random.default_rng(0).standard_normal(signal.size).astype(np.float32)
    start, _ = true_bounds_ms(signal, rate)
    lenient = run_vad(VoiceActivity(rate, aggressiveness=0), noisy, 441)
    strict = run_vad(VoiceActivity(rate, aggressiveness=3), noisy, 441)
    # Mode 0 takes the noise before the speech for speech; mode 3 finds the real onset.
    assert lenient[0][0] == "speech_started" and lenient[0][1] < start - 500
    assert [e[0] for e in strict] == ["speech_started", "speech_stopped"]
    assert abs(strict[0][1] - start) <= 60


def test_chunking_and_sample_format_do_not_change_events(speech):
    pcm, rate = speech
    signal = padded(pcm, rate)
    whole = [e[:2] for e in run_vad(VoiceActivity(rate), signal, signal.size)]
    odd = [e[:2] for e in run_vad(VoiceActivity(rate), signal, 97)]
    ints = (signal * 32767).astype(np.int16)
    as_int16 = [e[:2] for e in run_vad(VoiceActivity(rate), ints, 441)]
    assert whole == odd == as_int16
    assert len(whole) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"aggressiveness": 4},
        {"frame_ms": 15},
        {"min_speech_ms": 5},
        {"hangover_ms": 0},
        {"min_speech_ms": 200, "onset_window_ms": 100},
    ],
)
def test_bad_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        VoiceActivity(16000, **kwargs)


def test_the_listener_s_timeline_goes_on_when_its_input_settings_change(speech):
    """What was seen: changing any `input` setting restarted the speech events' times at
    0 and dropped a speech segment in progress without its speech_stopped."""
    pcm, rate = speech
    signal = padded(pcm, rate)
    start, _ = true_bounds_ms(signal, rate)
    listener = Listener()
    before, after = Input(vad_aggressiveness=2), Input(vad_aggressiveness=3)
    cut = int((start / 1000 + 0.5) * rate)  # half a second into the speech
    chunk = rate // 50
    events = []
    for i in range(0, signal.size, chunk):
        settings = before if i < cut else after
        events += listener.feed(signal[i : i + chunk], rate, settings)
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["speech_started", "speech_stopped"], events
    # the segment open at the change is closed where the audio was cut...
    assert events[1][1] == pytest.approx(cut / rate * 1000, abs=40), events
    # ...and the new detector's events and clock continue on the same timeline
    assert all(t >= events[1][1] for _, t in events[2:]), events
    assert "speech_started" in kinds[2:], events
    assert listener.time_ms == pytest.approx(signal.size / rate * 1000, abs=40)
