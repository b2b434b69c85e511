"""Reference audio for a new voice: encoded bytes in, a clean prompt clip out, or a coded
refusal that says what is wrong with the audio, with numbers.

`prepare_reference(data)` decodes any container PyAV reads (WAV, FLAC, Ogg/Opus, MP3,
M4A, ...) at any rate and channel count, mixes it to mono, resamples it to 24 kHz (the
flow's rate; the frontend derives its 16 kHz copy from it), trims the silence at both ends
(webrtcvad, keeping `MARGIN_S` around the speech), normalizes the loudness (the voiced
part's RMS to `TARGET_DBFS`, peaks kept under `PEAK_LIMIT`) and checks it:

| code | when |
| --- | --- |
| `audio_too_large` | more than `MAX_UPLOAD_BYTES` of encoded audio |
| `audio_unreadable` | not decodable, no audio stream, no samples, or sampled below 8 kHz |
| `audio_silent` | the loudest 300 ms under `SILENT_DBFS`, or under `MIN_VOICED_S` of voice |
| `audio_clipped` | over `CLIP_FRACTION` of the active samples within 1/256 of full scale |
| `audio_not_speech` | the voiced frames' level spread under `MIN_SPREAD_DB`: a steady sound |
| `audio_too_short` | under `MIN_SPEECH_S` left after trimming |
| `audio_too_long` | over `MAX_SPEECH_S` left after trimming (the speech tokenizer's limit) |

Narrowband audio (telephone speech at 8 kHz) is accepted with a warning: upsampling does
not restore the band above half its rate, which the model's prompt mel covers up to 8 kHz.
No file or network I/O here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import av
import numpy as np
import webrtcvad

from ..audio.decode import AudioTooLong, decode_audio, resample
from ..audio.features import MEL_FMAX
from ..audio.resample import Float32Array
from ..protocol.errors import ErrorCode

RATE = 24000  # the prompt clip's rate (the flow's mel); the frontend makes its 16 kHz copy
MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # 10 MiB: minutes of FLAC, far more than 30 s needs
MAX_DECODE_S = 60.0  # decoding stops here: a long upload costs no more than this
MIN_SOURCE_RATE = 8000  # telephone audio is the narrowest accepted
MIN_SPEECH_S = 1.0  # after trimming: below this the prompt holds a handful of tokens
RECOMMENDED_S = (3.0, 10.0)
MAX_SPEECH_S = 30.0  # the speech tokenizer's positional range (prompt_frontend.py)
MARGIN_S = 0.1  # kept before the first and after the last voiced frame
FRAME_S = 0.03  # webrtcvad frames of 30 ms
VAD_RATE = 16000
VAD_AGGRESSIVENESS = 2
SILENT_DBFS = -50.0  # the loudest 300 ms under this: nothing usable was recorded
LOUD_WINDOW = 10  # frames: "the loudest part" is the loudest 300 ms
NOISE_BELOW_PEAK_DB = 35.0  # frames this far under the loudest are background, not voice
MIN_VOICED_S = 0.5
# Speech rises and falls by syllable: the voiced frames' levels spread by 6-10 dB (the
# standard deviation of their dB; 6.3 dB was the least of 300 teacher sentences, 4.5 of
# Asterisk's prompts). A tone, a hum or steady noise that webrtcvad takes for voice
# spreads by well under 1 dB.
MIN_SPREAD_DB = 2.0
TARGET_DBFS = -20.0  # RMS of the voiced frames after normalization
PEAK_LIMIT = 0.97  # about -0.26 dBFS: the gain is lowered if a peak would exceed it
# Clipping: a sample within 1/256 of full scale (|x| >= 0.9961, the top step of 8-bit
# audio, 32640 of 32767 in 16-bit) counts as clipped. A recording normalized to 0 dBFS
# touches that only on isolated peaks (well under 0.1 % of samples); hard clipping holds
# it for runs of samples on every loud syllable, and at 0.5 % of the active samples (5 ms
# a second) the distortion is plainly audible and ends up in the speaker vector.
CLIP_LEVEL = 1.0 - 1.0 / 256.0
CLIP_FRACTION = 0.005


class ReferenceAudioError(ValueError):
    """Reference audio that cannot make a voice: a stable code and a message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Reference:
    pcm: Float32Array  # mono float32 at RATE, trimmed and normalized
    source_rate: int  # the upload's own sample rate
    source_s: float  # the upload's duration before trimming
    speech_s: float  # seconds of voiced frames inside the trimmed clip
    gain_db: float  # applied by the loudness normalization
    warnings: tuple[str, ...]

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / RATE


def _db(x: float) -> float:
    return 20.0 * math.log10(x) if x > 0 else -math.inf


def _frame_rms(pcm: np.ndarray, frame: int) -> np.ndarray:
    n = len(pcm) // frame
    frames = pcm[: n * frame].astype(np.float64).reshape(n, frame)
    return np.asarray(np.sqrt(np.mean(frames * frames, axis=1)))


def _decode(data: bytes) -> tuple[Float32Array, int]:
    if len(data) > MAX_UPLOAD_BYTES:
        raise ReferenceAudioError(
            ErrorCode.AUDIO_TOO_LARGE,
            f"the audio is {len(data) / 2**20:.1f} MiB; at most {MAX_UPLOAD_BYTES / 2**20:g} MiB "
            "is accepted (3-10 s of speech is what a voice needs)",
        )
    if not data:
        raise ReferenceAudioError(ErrorCode.AUDIO_UNREADABLE, "the audio is empty (0 bytes)")
    try:
        pcm, rate = decode_audio(data, max_seconds=MAX_DECODE_S)
    except AudioTooLong:
        raise ReferenceAudioError(
            ErrorCode.AUDIO_TOO_LONG,
            f"the audio lasts more than {MAX_DECODE_S:g} s; a voice takes at most "
            f"{MAX_SPEECH_S:g} s of speech ({RECOMMENDED_S[0]:g}-{RECOMMENDED_S[1]:g} s is "
            "recommended)",
        ) from None
    except Exception as exc:  # PyAV raises many kinds; all mean "not audio we can read"
        cause = exc.__cause__
        detail = cause.strerror if isinstance(cause, av.FFmpegError) else str(exc)
        raise ReferenceAudioError(
            ErrorCode.AUDIO_UNREADABLE,
            f"the upload is not audio that can be decoded (WAV, FLAC, Ogg/Opus, MP3, M4A, "
            f"...): {detail}",
        ) from None
    if rate < MIN_SOURCE_RATE:
        raise ReferenceAudioError(
            ErrorCode.AUDIO_UNREADABLE,
            f"the audio is sampled at {rate} Hz; at least {MIN_SOURCE_RATE} Hz is needed",
        )
    return pcm, rate


def _clipped_fraction(pcm: np.ndarray, rate: int) -> float:
    """Samples within 1/256 of full scale, as a fraction of the samples of active frames
    (silence would dilute it), measured at the source rate (resampling smears plateaus)."""
    frame = max(1, int(rate * FRAME_S))
    rms = _frame_rms(pcm, frame)
    active = rms > 10 ** (SILENT_DBFS / 20)
    if not active.any():
        return 0.0
    frames = np.abs(pcm[: len(rms) * frame]).reshape(len(rms), frame)[active]
    return float(np.mean(frames >= CLIP_LEVEL))


def _loudest_db(rms: np.ndarray) -> float:
    """The level of the loudest LOUD_WINDOW frames in a row (a click does not count)."""
    if rms.size == 0:
        return -math.inf
    energy = np.square(rms)
    width = min(LOUD_WINDOW, rms.size)
    means = np.convolve(energy, np.full(width, 1.0 / width), mode="valid")
    return _db(math.sqrt(float(means.max())))


def _voiced_frames(pcm24k: Float32Array, loud_db: float) -> np.ndarray:
    """webrtcvad's decision for each 30 ms frame, on a copy brought to the target level
    first (its energy gate is absolute), less frames far below the loudest ones."""
    x = resample(pcm24k, RATE, VAD_RATE)
    frame = int(VAD_RATE * FRAME_S)
    gain = 10 ** ((TARGET_DBFS - loud_db) / 20)
    ints = (np.clip(x * gain, -1.0, 1.0) * 32767.0).astype("<i2")
    n = len(ints) // frame
    vad = webrtcvad.Vad(VAD_AGGRESSIVENESS)
    speech = np.array(
        [vad.is_speech(ints[k * frame : (k + 1) * frame].tobytes(), VAD_RATE) for k in range(n)],
        dtype=bool,
    )
    rms = _frame_rms(x, frame)[:n]
    return speech & (rms > 10 ** ((loud_db - NOISE_BELOW_PEAK_DB) / 20))


def prepare_reference(data: bytes) -> Reference:
    """Encoded audio -> a trimmed, normalized 24 kHz mono clip, or ReferenceAudioError."""
    source, source_rate = _decode(data)
    source_s = len(source) / source_rate
    pcm = resample(source, source_rate, RATE)
    frame = int(RATE * FRAME_S)
    rms = _frame_rms(pcm, frame)
    loud_db = _loudest_db(rms)
    if loud_db < SILENT_DBFS:
        level = "digital silence" if loud_db == -math.inf else f"{loud_db:.1f} dBFS"
        raise ReferenceAudioError(
            ErrorCode.AUDIO_SILENT,
            f"the audio is silent: its loudest 300 ms are at {level}, below "
            f"{SILENT_DBFS:g} dBFS ({source_s:.2f} s at {source_rate} Hz)",
        )
    clipped = _clipped_fraction(source, source_rate)
    if clipped > CLIP_FRACTION:
        raise ReferenceAudioError(
            ErrorCode.AUDIO_CLIPPED,
            f"the audio is clipped: {100 * clipped:.2f} % of its active samples are at full "
            f"scale (at most {100 * CLIP_FRACTION:g} % is accepted); record again with a "
            "lower input gain",
        )
    voiced = _voiced_frames(pcm, loud_db)[: len(rms)]  # the 16 kHz copy may have one more
    if not voiced.any():
        raise ReferenceAudioError(
            ErrorCode.AUDIO_SILENT,
            f"no voice activity in {source_s:.2f} s of audio (loudest frames at "
            f"{loud_db:.1f} dBFS)",
        )
    hits = np.flatnonzero(voiced)
    margin = int(MARGIN_S * RATE)
    start = max(0, int(hits[0] * FRAME_S * RATE) - margin)
    end = min(len(pcm), int((hits[-1] + 1) * FRAME_S * RATE) + margin)
    clip = pcm[start:end]
    span = len(clip) / RATE
    if span < MIN_SPEECH_S:
        raise ReferenceAudioError(
            ErrorCode.AUDIO_TOO_SHORT,
            f"the audio holds {span:.2f} s once the silence around the speech is trimmed "
            f"(of {source_s:.2f} s); at least {MIN_SPEECH_S:g} s is needed and "
            f"{RECOMMENDED_S[0]:g}-{RECOMMENDED_S[1]:g} s of clear speech is recommended",
        )
    if span > MAX_SPEECH_S:
        raise ReferenceAudioError(
            ErrorCode.AUDIO_TOO_LONG,
            f"the audio holds {span:.1f} s once the silence around the speech is trimmed; "
            f"at most {MAX_SPEECH_S:g} s is accepted (the speech tokenizer's limit), and "
            f"{RECOMMENDED_S[0]:g}-{RECOMMENDED_S[1]:g} s is recommended",
        )
    speech_s = float(voiced.sum()) * FRAME_S
    if speech_s < MIN_VOICED_S:
        raise ReferenceAudioError(
            ErrorCode.AUDIO_SILENT,
            f"only {speech_s:.2f} s of voice activity in {span:.2f} s of audio; at least "
            f"{MIN_VOICED_S:g} s of speech is needed",
        )
    spread = float(np.std(20.0 * np.log10(rms[hits].astype(np.float64) + 1e-12)))
    if spread < MIN_SPREAD_DB:
        raise ReferenceAudioError(
            ErrorCode.AUDIO_NOT_SPEECH,
            f"the audio is a steady sound, not speech: the level of its {speech_s:.2f} s of "
            f"voice-like frames varies by {spread:.2f} dB, and speech's by {MIN_SPREAD_DB:g} dB "
            "or more (a tone, a hum or steady noise); record a person speaking",
        )
    # Loudness: the voiced frames' RMS to the target, unless a peak would pass the limit.
    voiced_rms = float(np.sqrt(np.mean(np.square(rms[hits].astype(np.float64)))))
    gain = 10 ** (TARGET_DBFS / 20) / voiced_rms
    peak = float(np.abs(clip).max())
    gain = min(gain, PEAK_LIMIT / peak)
    out = (clip * gain).astype(np.float32)
    return Reference(
        pcm=out,
        source_rate=source_rate,
        source_s=source_s,
        speech_s=speech_s,
        gain_db=_db(gain),
        warnings=_warnings(source_rate, span),
    )


def _warnings(source_rate: int, span: float) -> tuple[str, ...]:
    found = []
    if source_rate < 2 * MEL_FMAX:
        top = source_rate / 2000
        found.append(
            f"the reference is sampled at {source_rate} Hz, so it holds nothing above "
            f"{top:g} kHz: the voice lacks the {top:g}-{MEL_FMAX / 1000:g} kHz band of the "
            "model's prompt and will sound muffled, like a phone line; a recording at "
            f"{int(2 * MEL_FMAX)} Hz or more gives the full band"
        )
    if span < RECOMMENDED_S[0]:
        found.append(
            f"the reference holds {span:.1f} s of audio; {RECOMMENDED_S[0]:g}-"
            f"{RECOMMENDED_S[1]:g} s of speech makes a more faithful voice"
        )
    return tuple(found)
