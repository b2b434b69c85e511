"""Codecs: 20 ms float32 frames at the output rate -> packets (Opus, PCM16, G.711 μ-law
and A-law).
Rates and limits come from format.py; framing (resample + cut) is framing.py's."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import opuslib
from numpy.typing import NDArray

from .format import (
    CODEC_RATES,
    CODECS,
    DEFAULT_OPUS_BITRATE,
    DEFAULT_RATES,
    MULAW_RATE,
    OPUS_BITRATES,
    OPUS_RATE,
)
from .resample import Float32Array

GAIN_RAMP_S = 0.005  # a gain change (ducking) is spread over this much of the next frame
# libopus' lookahead for 48 kHz (2.5 ms + 4 ms); used if the ctl is unavailable.
DEFAULT_OPUS_LOOKAHEAD = 312


def float_to_int16(x: np.ndarray) -> NDArray[np.int16]:
    """Clip to [-1, 1] and round to int16 (symmetric scale, so -1 -> -32767)."""
    return np.rint(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


class Encoder(ABC):
    """One stream of 20 ms float32 frames at `sample_rate` -> packets. Stateful (Opus
    predicts from earlier frames): one encoder per turn, calls in stream order. Owned by
    whoever sends the frames, so a gain change (ducking) applies from the next frame."""

    codec: str
    sample_rate: int
    _gain: float | None = None  # the last frame's gain (None: no frame yet)

    @property
    def tail_samples(self) -> int:
        """Silence to append after the last audio so a decoder gets all of it out."""
        return 0

    def encode(self, frame: Float32Array, gain: float = 1.0) -> bytes:
        """`frame` times `gain`; a gain that changed since the last frame is reached over
        GAIN_RAMP_S (a step at a frame edge clicks: 15 times a tone's largest step)."""
        last, self._gain = self._gain, gain
        if last is None or last == gain:
            return self._encode(frame if gain == 1.0 else (frame * gain).astype(np.float32))
        ramp = min(frame.size, max(1, round(GAIN_RAMP_S * self.sample_rate)))
        scale = np.full(frame.size, gain, np.float32)
        scale[:ramp] = np.linspace(last, gain, ramp + 1, dtype=np.float32)[1:]
        return self._encode((frame * scale).astype(np.float32))

    @abstractmethod
    def _encode(self, frame: Float32Array) -> bytes: ...


class OpusEncoder(Encoder):
    """48 kHz mono Opus, one 20 ms frame (960 samples) per packet. Its lookahead is the
    tail: the last packet is therefore partly padding (an Ogg end granule can trim it).
    Tuned for speech (the VoIP application, as aiortc's WebRTC encoder is): over 100
    held-out sentences x 6 seeds of the shipped voice at 32 kbit/s, pocketsphinx's WER
    was 0.366 against 0.381 with the general-audio tuning (docs/training-runs.md)."""

    codec = "opus"
    sample_rate = OPUS_RATE

    def __init__(self, bitrate: int = DEFAULT_OPUS_BITRATE) -> None:
        lo, hi = OPUS_BITRATES
        if not lo <= bitrate <= hi:
            raise ValueError(f"opus bitrate must be in {lo}..{hi} bps, got {bitrate}")
        self.bitrate = bitrate
        self._enc = opuslib.Encoder(OPUS_RATE, 1, opuslib.APPLICATION_VOIP)
        self._enc.bitrate = bitrate

    @property
    def tail_samples(self) -> int:
        try:
            return int(self._enc.lookahead)
        except (AttributeError, opuslib.OpusError):
            return DEFAULT_OPUS_LOOKAHEAD

    def _encode(self, frame: Float32Array) -> bytes:
        packet: bytes = self._enc.encode(float_to_int16(frame).tobytes(), frame.size)
        return packet


class Pcm16Encoder(Encoder):
    """Raw little-endian int16 frames."""

    codec = "pcm16"

    def __init__(self, sample_rate: int = DEFAULT_RATES["pcm16"]) -> None:
        self.sample_rate = sample_rate

    def _encode(self, frame: Float32Array) -> bytes:
        return float_to_int16(frame).astype("<i2").tobytes()


# G.711 μ-law segment end points on the 14-bit biased magnitude scale.
_SEG_UEND = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159


def mulaw_encode(pcm: NDArray[np.int16]) -> NDArray[np.uint8]:
    """G.711 μ-law encode of 16-bit linear samples (classic segment search)."""
    v = pcm.astype(np.int32) >> 2  # G.711 μ-law works on 14-bit magnitudes
    mask = np.where(v < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(v), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg = np.searchsorted(_SEG_UEND, mag)  # first segment whose end >= mag
    # Clipped magnitude can land just past segment 7: that is the max code 0x7F.
    over = seg >= 8
    seg = np.minimum(seg, 7)
    uval = (seg << 4) | ((mag >> (seg + 1)) & 0xF)
    uval = np.where(over, 0x7F, uval)
    return (uval ^ mask).astype(np.uint8)


def mulaw_decode(codes: bytes | NDArray[np.uint8]) -> NDArray[np.int16]:
    """G.711 μ-law decode to 16-bit linear samples."""
    u = ~np.frombuffer(bytes(codes), dtype=np.uint8).astype(np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


# G.711 A-law segment end points on the 13-bit magnitude scale.
_SEG_AEND = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)


def alaw_encode(pcm: NDArray[np.int16]) -> NDArray[np.uint8]:
    """G.711 A-law encode of 16-bit linear samples (Europe's telephony codec)."""
    v = pcm.astype(np.int32) >> 3  # A-law works on 13-bit values
    mask = np.where(v >= 0, 0xD5, 0x55)  # sign bit, and the even bits inverted
    mag = np.where(v >= 0, v, -v - 1)
    seg = np.searchsorted(_SEG_AEND, mag)
    over = seg >= 8
    seg = np.minimum(seg, 7)
    shift = np.where(seg < 2, 1, seg)
    aval = (seg << 4) | ((mag >> shift) & 0xF)
    aval = np.where(over, 0x7F, aval)
    return (aval ^ mask).astype(np.uint8)


def alaw_decode(codes: bytes | NDArray[np.uint8]) -> NDArray[np.int16]:
    """G.711 A-law decode to 16-bit linear samples."""
    a = np.frombuffer(bytes(codes), dtype=np.uint8).astype(np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = ((a & 0x0F) << 4) + np.where(seg == 0, 8, 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


class MulawEncoder(Encoder):
    """8 kHz G.711 μ-law, 160 bytes per 20 ms: the telephony seam."""

    codec = "mulaw"
    sample_rate = MULAW_RATE

    def _encode(self, frame: Float32Array) -> bytes:
        return mulaw_encode(float_to_int16(frame)).tobytes()


class AlawEncoder(Encoder):
    """8 kHz G.711 A-law, 160 bytes per 20 ms."""

    codec = "alaw"
    sample_rate = MULAW_RATE

    def _encode(self, frame: Float32Array) -> bytes:
        return alaw_encode(float_to_int16(frame)).tobytes()


def make_encoder(codec: str, sample_rate: int | None = None, bitrate: int | None = None) -> Encoder:
    """The encoder for one turn. `bitrate` only applies to Opus."""
    if codec not in CODEC_RATES:
        raise ValueError(f"unknown codec {codec!r}; expected one of {', '.join(CODECS)}")
    rate = DEFAULT_RATES[codec] if sample_rate is None else sample_rate
    if rate not in CODEC_RATES[codec]:
        rates = ", ".join(map(str, CODEC_RATES[codec]))
        raise ValueError(f"{codec} sample_rate must be one of {rates}, got {sample_rate}")
    if codec == "opus":
        return OpusEncoder(DEFAULT_OPUS_BITRATE if bitrate is None else bitrate)
    if codec == "pcm16":
        return Pcm16Encoder(rate)
    return MulawEncoder() if codec == "mulaw" else AlawEncoder()
