"""Voice activity detection without I/O: PCM in, `speech_started` / `speech_stopped` out.

webrtcvad classifies 10/20/30 ms frames of 16 kHz int16 audio; a single frame decision is
noisy (a click or a cough is "voiced"), so onset needs `min_speech_ms` of voiced frames
within a short window (webrtcvad already stretches a voiced burst by ~60-100 ms, so
`min_speech_ms` should exceed the longest click to ignore by that much) and offset needs
`hangover_ms` of consecutive unvoiced frames.
Times are on the audio timeline (milliseconds of audio fed since construction), so they
do not depend on when or in which chunks the audio arrived.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

import numpy as np
import webrtcvad

from .resample import StreamResampler

VAD_RATE = 16000
FRAME_MS_CHOICES = (10, 20, 30)

VadEventKind = Literal["speech_started", "speech_stopped"]
VadEvent = tuple[VadEventKind, int]


class VoiceActivity:
    """Feed mono PCM (float32 in [-1, 1] or int16) at any rate; get speech on/off events.

    `speech_started` carries the start of the first voiced frame of the onset window
    (where speech began, not when it was confirmed: that is up to the window later);
    `speech_stopped` carries the end of the last voiced frame (the event itself is
    produced `hangover_ms` later).
    """

    def __init__(
        self,
        sample_rate: int,
        aggressiveness: int = 2,
        frame_ms: int = 20,
        min_speech_ms: int = 120,
        hangover_ms: int = 300,
        onset_window_ms: int | None = None,
    ) -> None:
        if aggressiveness not in (0, 1, 2, 3):
            raise ValueError(f"aggressiveness must be 0..3, got {aggressiveness}")
        if frame_ms not in FRAME_MS_CHOICES:
            raise ValueError(f"frame_ms must be one of {FRAME_MS_CHOICES}, got {frame_ms}")
        if min_speech_ms < frame_ms or hangover_ms < frame_ms:
            raise ValueError("min_speech_ms and hangover_ms must be at least one frame")
        window_ms = 2 * min_speech_ms if onset_window_ms is None else onset_window_ms
        if window_ms < min_speech_ms:
            raise ValueError("onset_window_ms must be at least min_speech_ms")
        self.sample_rate = sample_rate
        self.aggressiveness = aggressiveness
        self.frame_ms = frame_ms
        self.min_speech_ms = min_speech_ms
        self.hangover_ms = hangover_ms
        self.onset_window_ms = window_ms
        self._vad = webrtcvad.Vad(aggressiveness)
        # Quick quality: no look-ahead (HQ holds back ~20 ms, which is barge-in latency),
        # and the detector does not care about the slight aliasing.
        self._resampler = StreamResampler(sample_rate, VAD_RATE, quality="QQ")
        self._frame_len = VAD_RATE * frame_ms // 1000
        self._pending = np.zeros(0, dtype=np.float32)
        self._frames = 0  # frames classified so far: frame k covers [k, k+1) * frame_ms
        self._need_voiced = math.ceil(min_speech_ms / frame_ms)
        self._need_unvoiced = math.ceil(hangover_ms / frame_ms)
        # (frame index, voiced) for the onset window while silent
        self._window: deque[tuple[int, bool]] = deque(maxlen=math.ceil(window_ms / frame_ms))
        self._unvoiced_run = 0
        self.speaking = False
        self.voiced_ms = 0  # voiced frames so far, in ms of audio

    @property
    def time_ms(self) -> int:
        """Audio classified so far (the resampler holds back a few ms more)."""
        return self._frames * self.frame_ms

    def feed(self, pcm: np.ndarray) -> list[VadEvent]:
        arr = np.asarray(pcm)
        if arr.dtype == np.int16:
            arr = arr.astype(np.float32) / 32768.0
        x = self._resampler.process(arr)
        if self._pending.size:
            x = np.concatenate([self._pending, x])
        n = x.size // self._frame_len
        events: list[VadEvent] = []
        if n:
            # Clip before the int16 cast so a loud float input cannot wrap around.
            ints = (np.clip(x[: n * self._frame_len], -1.0, 1.0) * 32767.0).astype("<i2")
            for k in range(n):
                chunk = ints[k * self._frame_len : (k + 1) * self._frame_len].tobytes()
                event = self._step(self._vad.is_speech(chunk, VAD_RATE))
                if event is not None:
                    events.append(event)
        self._pending = x[n * self._frame_len :].copy()
        return events

    def flush(self) -> list[VadEvent]:
        """End of stream: a speech segment still open is closed at the end of the audio."""
        if not self.speaking:
            return []
        self.speaking = False
        return [("speech_stopped", (self._frames - self._unvoiced_run) * self.frame_ms)]

    def _step(self, voiced: bool) -> VadEvent | None:
        index = self._frames
        self._frames += 1
        self.voiced_ms += self.frame_ms * voiced
        if not self.speaking:
            self._window.append((index, voiced))
            voiced_frames = [i for i, v in self._window if v]
            if len(voiced_frames) < self._need_voiced:
                return None
            self.speaking = True
            self._unvoiced_run = 0
            self._window.clear()
            return ("speech_started", voiced_frames[0] * self.frame_ms)
        if voiced:
            self._unvoiced_run = 0
            return None
        self._unvoiced_run += 1
        if self._unvoiced_run < self._need_unvoiced:
            return None
        self.speaking = False
        return ("speech_stopped", (self._frames - self._unvoiced_run) * self.frame_ms)
