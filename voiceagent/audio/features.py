"""The three spectral features a CosyVoice2 voice prompt is made of, in numpy (float64
inside, float32 out, deterministic on any CPU):

- `kaldi_fbank`: 80-bin Kaldi log filterbank at 16 kHz, the input of the CAM++ speaker
  model (torchaudio's `compliance.kaldi.fbank` with CosyVoice's arguments);
- `whisper_log_mel`: Whisper's 128-bin log-mel at 16 kHz, the input of the speech tokenizer;
- `prompt_mel`: the flow's 80-bin log-mel at 24 kHz (CosyVoice2's `feat_extractor`).

Each takes mono float samples in [-1, 1], as CosyVoice feeds them (not int16-scaled).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]

# Kaldi fbank (16 kHz): 25 ms windows every 10 ms, FFT padded to a power of two.
FBANK_RATE = 16000
FBANK_WIN = 400
FBANK_HOP = 160
FBANK_FFT = 512
FBANK_BINS = 80
FBANK_LOW_HZ = 20.0
PREEMPH = 0.97
# torchaudio floors the mel energies at float32's machine epsilon before the log.
FBANK_EPS = float(np.finfo(np.float32).eps)

# Whisper log-mel (16 kHz).
WHISPER_FFT = 400
WHISPER_HOP = 160

# CosyVoice2 flow mel (24 kHz), from cosyvoice2.yaml's feat_extractor.
MEL_RATE = 24000
MEL_FFT = 1920
MEL_HOP = 480
MEL_BINS = 80
MEL_FMAX = 8000.0


def _mono(wave: np.ndarray, what: str, min_samples: int) -> F64:
    x = np.asarray(wave, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{what}: expected mono 1-D samples, got shape {x.shape}")
    if x.size < min_samples:
        raise ValueError(f"{what}: needs at least {min_samples} samples, got {x.size}")
    if not np.isfinite(x).all():
        raise ValueError(f"{what}: samples must be finite")
    return x


def _frames(x: F64, win: int, hop: int) -> F64:
    """[n_frames, win] views of x, frames starting every `hop` samples (no padding)."""
    n = 1 + (x.size - win) // hop
    return np.lib.stride_tricks.sliding_window_view(x, win)[: (n - 1) * hop + 1 : hop]


def _hann(n: int, periodic: bool) -> F64:
    denom = n if periodic else n - 1
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / denom)


# --- Slaney mel scale (librosa's default, htk=False, norm="slaney") -----------------------

_SLANEY_STEP = 200.0 / 3.0  # Hz per mel below 1 kHz (linear part)
_SLANEY_BREAK_HZ = 1000.0
_SLANEY_BREAK_MEL = _SLANEY_BREAK_HZ / _SLANEY_STEP  # 15
_SLANEY_LOGSTEP = math.log(6.4) / 27.0  # log part: 27 mels per factor 6.4


def hz_to_slaney_mel(f: ArrayLike) -> F64:
    f = np.asarray(f, dtype=np.float64)
    lin = f / _SLANEY_STEP
    log = _SLANEY_BREAK_MEL + np.log(np.maximum(f, _SLANEY_BREAK_HZ) / _SLANEY_BREAK_HZ) / (
        _SLANEY_LOGSTEP
    )
    return np.where(f >= _SLANEY_BREAK_HZ, log, lin)


def slaney_mel_to_hz(m: ArrayLike) -> F64:
    m = np.asarray(m, dtype=np.float64)
    lin = m * _SLANEY_STEP
    log = _SLANEY_BREAK_HZ * np.exp(
        _SLANEY_LOGSTEP * (np.maximum(m, _SLANEY_BREAK_MEL) - _SLANEY_BREAK_MEL)
    )
    return np.where(m >= _SLANEY_BREAK_MEL, log, lin)


@lru_cache(maxsize=8)
def slaney_mel_filters(rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> F64:
    """[n_mels, n_fft // 2 + 1] triangular filters equally spaced on the Slaney mel scale,
    each scaled to unit area in Hz (librosa.filters.mel semantics). Read-only, cached."""
    fft_hz = np.linspace(0.0, rate / 2.0, n_fft // 2 + 1)
    edges = slaney_mel_to_hz(
        np.linspace(hz_to_slaney_mel(fmin), hz_to_slaney_mel(fmax), n_mels + 2)
    )
    width = np.diff(edges)
    # Distance of every FFT bin from every edge, then rising/falling slopes per filter.
    ramps = edges[:, None] - fft_hz[None, :]
    rise = -ramps[:-2] / width[:-1, None]
    fall = ramps[2:] / width[1:, None]
    weights = np.maximum(0.0, np.minimum(rise, fall))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    weights.setflags(write=False)
    return weights


# --- Kaldi fbank --------------------------------------------------------------------------


def _kaldi_mel(f: ArrayLike) -> F64:
    return 1127.0 * np.log1p(np.asarray(f, dtype=np.float64) / 700.0)


@lru_cache(maxsize=1)
def kaldi_mel_banks() -> F64:
    """[80, 257] Kaldi triangular filters (triangles in the mel domain, 20 Hz to Nyquist,
    no area normalisation; the Nyquist bin gets no weight). Read-only, cached."""
    lo, hi = _kaldi_mel(FBANK_LOW_HZ), _kaldi_mel(FBANK_RATE / 2)
    delta = (hi - lo) / (FBANK_BINS + 1)
    left = lo + delta * np.arange(FBANK_BINS)[:, None]
    center, right = left + delta, left + 2 * delta
    mel = _kaldi_mel(np.arange(FBANK_FFT // 2) * (FBANK_RATE / FBANK_FFT))[None, :]
    tri = np.maximum(
        0.0, np.minimum((mel - left) / (center - left), (right - mel) / (right - center))
    )
    banks = np.zeros((FBANK_BINS, FBANK_FFT // 2 + 1))
    banks[:, : FBANK_FFT // 2] = tri
    banks.setflags(write=False)
    return banks


def kaldi_fbank(wave16k: np.ndarray) -> F32:
    """[frames, 80] log mel filterbank energies, frames = 1 + (n - 400) // 160
    (snip_edges: only whole windows). Kaldi defaults with dither 0: per-frame DC removal,
    pre-emphasis 0.97, Povey window, power spectrum, natural log floored at float32 eps."""
    x = _mono(wave16k, "kaldi_fbank", FBANK_WIN)
    frames = _frames(x, FBANK_WIN, FBANK_HOP)
    frames = frames - frames.mean(axis=1, keepdims=True)
    # Pre-emphasis with the first sample repeated as its own predecessor (as Kaldi does).
    prev = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
    frames = frames - PREEMPH * prev
    frames = frames * _hann(FBANK_WIN, periodic=False) ** 0.85
    power = np.abs(np.fft.rfft(frames, n=FBANK_FFT, axis=1)) ** 2
    energies = power @ kaldi_mel_banks().T
    return np.log(np.maximum(energies, FBANK_EPS)).astype(np.float32)


# --- Whisper log-mel ----------------------------------------------------------------------


def whisper_log_mel(wave16k: np.ndarray, n_mels: int = 128) -> F32:
    """[n_mels, n // 160] Whisper log-mel: centered STFT (reflect padding, periodic Hann,
    n_fft 400, hop 160) without its last frame, power through Slaney filters up to 8 kHz,
    log10 floored at 1e-10, clamped to 8 below the maximum, then (x + 4) / 4."""
    x = _mono(wave16k, "whisper_log_mel", WHISPER_FFT // 2 + 1)
    x = np.pad(x, WHISPER_FFT // 2, mode="reflect")
    frames = _frames(x, WHISPER_FFT, WHISPER_HOP)[:-1]
    power = np.abs(np.fft.rfft(frames * _hann(WHISPER_FFT, periodic=True), axis=1)) ** 2
    mel = slaney_mel_filters(FBANK_RATE, WHISPER_FFT, n_mels, 0.0, FBANK_RATE / 2) @ power.T
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)


# --- CosyVoice2 prompt mel ----------------------------------------------------------------

MEL_FLOOR = 1e-5
SILENT_LOG_MEL = math.log(MEL_FLOOR)  # every bin of the flow's mel of digital silence


def prompt_mel(wave24k: np.ndarray) -> F32:
    """[n // 480, 80] log-mel of the flow: reflect padding of (1920 - 480) / 2 per side, then
    uncentered frames (periodic Hann 1920, hop 480), magnitude sqrt(power + 1e-9), Slaney
    filters 0-8 kHz, natural log floored at 1e-5."""
    pad = (MEL_FFT - MEL_HOP) // 2
    x = _mono(wave24k, "prompt_mel", pad + 1)
    x = np.pad(x, pad, mode="reflect")
    frames = _frames(x, MEL_FFT, MEL_HOP)
    spec = np.fft.rfft(frames * _hann(MEL_FFT, periodic=True), axis=1)
    mag = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    mel = mag @ slaney_mel_filters(MEL_RATE, MEL_FFT, MEL_BINS, 0.0, MEL_FMAX).T
    return np.log(np.maximum(mel, MEL_FLOOR)).astype(np.float32)
