"""Per-turn frame encoders: 24 kHz float32 PCM in, whole 20 ms frames out."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import opuslib
from numpy.typing import NDArray

from voiceagent.audio.resample import Float32Array, StreamResampler, as_mono_f32

SOURCE_RATE = 24000

PCM16_RATES = (8000, 16000, 24000, 48000)
OPUS_RATE = 48000
MULAW_RATE = 8000
# libopus' lookahead for 48 kHz (2.5 ms + 4 ms); used if the ctl is unavailable.
DEFAULT_OPUS_LOOKAHEAD = 312


def float_to_int16(x: np.ndarray) -> NDArray[np.int16]:
    """Clip to [-1, 1] and round to int16 (symmetric scale, so -1 -> -32767)."""
    return np.rint(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


class FrameEncoder(ABC):
    """Turns a stream of SOURCE_RATE float32 chunks into fixed-size frames.

    `encode` only ever returns complete frames and carries the remainder, so
    packets are identical however the input was chunked. `flush` ends the
    stream: it drains the resampler and zero-pads the last partial frame.
    """

    codec: str
    sample_rate: int
    frame_ms: int = 20

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self._resampler = StreamResampler(SOURCE_RATE, sample_rate)
        self._pending: Float32Array = np.zeros(0, dtype=np.float32)
        self._dirty = False  # real audio entered since the last flush
        self.samples_out = 0  # real (unpadded) output-rate samples produced so far

    @property
    def frame_samples(self) -> int:
        return self.sample_rate * self.frame_ms // 1000

    @abstractmethod
    def encode_frame(self, frame: Float32Array) -> bytes:
        """Encode exactly `frame_samples` float32 samples (calls must follow stream order)."""

    def _flush_padding(self) -> int:
        """Extra zero samples to push at end of stream (codec delay)."""
        return 0

    def _take_frames(self, more: Float32Array) -> list[Float32Array]:
        buf = np.concatenate([self._pending, more]) if self._pending.size else more
        n = self.frame_samples
        whole = buf.size // n * n
        frames = [buf[i : i + n].copy() for i in range(0, whole, n)]
        self._pending = buf[whole:].copy()
        return frames

    # Framing (resample, cut into 20 ms) and encoding are separate steps so that a sender
    # can change a frame (gain) at the last moment before it encodes it.

    def frames(self, pcm: np.ndarray) -> list[Float32Array]:
        """Resample and cut into whole frames at the output rate; the rest is carried."""
        arr = as_mono_f32(pcm)
        if arr.size:
            self._dirty = True
        out = self._resampler.process(arr)
        self.samples_out += out.size
        return self._take_frames(out)

    def flush_frames(self) -> list[Float32Array]:
        """End the stream: drain the resampler and zero-pad the last partial frame."""
        tail = self._resampler.flush()
        self.samples_out += tail.size
        if not self._dirty and self._pending.size == 0 and tail.size == 0:
            return []
        self._dirty = False
        extra = self._flush_padding()
        extra += -(self._pending.size + tail.size + extra) % self.frame_samples
        return self._take_frames(np.concatenate([tail, np.zeros(extra, dtype=np.float32)]))

    def encode(self, pcm: np.ndarray) -> list[bytes]:
        return [self.encode_frame(f) for f in self.frames(pcm)]

    def flush(self) -> list[bytes]:
        return [self.encode_frame(f) for f in self.flush_frames()]


class OpusEncoder(FrameEncoder):
    """48 kHz mono Opus, one 20 ms frame (960 samples) per packet.

    `flush` also pushes `lookahead_samples` of silence so that a decoder that
    drops the pre-skip still gets the whole input out; the last packet is
    therefore partly padding (trim it with the Ogg end granule if needed).
    """

    codec = "opus"

    def __init__(self, bitrate: int = 32000) -> None:
        if not 500 <= bitrate <= 512000:
            raise ValueError(f"opus bitrate must be in 500..512000 bps, got {bitrate}")
        super().__init__(OPUS_RATE)
        self.bitrate = bitrate
        self._enc = opuslib.Encoder(OPUS_RATE, 1, opuslib.APPLICATION_AUDIO)
        self._enc.bitrate = bitrate

    @property
    def lookahead_samples(self) -> int:
        try:
            return int(self._enc.lookahead)
        except (AttributeError, opuslib.OpusError):
            return DEFAULT_OPUS_LOOKAHEAD

    def _flush_padding(self) -> int:
        return self.lookahead_samples

    def encode_frame(self, frame: Float32Array) -> bytes:
        packet: bytes = self._enc.encode(float_to_int16(frame).tobytes(), frame.size)
        return packet


class Pcm16Encoder(FrameEncoder):
    """Raw little-endian int16 frames at one of PCM16_RATES."""

    codec = "pcm16"

    def __init__(self, sample_rate: int = SOURCE_RATE) -> None:
        if sample_rate not in PCM16_RATES:
            raise ValueError(f"pcm16 sample_rate must be one of {PCM16_RATES}, got {sample_rate}")
        super().__init__(sample_rate)

    def encode_frame(self, frame: Float32Array) -> bytes:
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


class MulawEncoder(FrameEncoder):
    """8 kHz G.711 μ-law, 160 bytes per 20 ms: the telephony seam."""

    codec = "mulaw"

    def __init__(self) -> None:
        super().__init__(MULAW_RATE)

    def encode_frame(self, frame: Float32Array) -> bytes:
        return mulaw_encode(float_to_int16(frame)).tobytes()


CODECS = ("opus", "pcm16", "mulaw")


def make_encoder(
    codec: str, *, sample_rate: int | None = None, bitrate: int | None = None
) -> FrameEncoder:
    """Build the encoder for one turn. `bitrate` only applies to opus."""
    name = codec.lower()
    if name == "opus":
        if sample_rate not in (None, OPUS_RATE):
            raise ValueError(f"opus output is always {OPUS_RATE} Hz, got sample_rate={sample_rate}")
        return OpusEncoder(bitrate=32000 if bitrate is None else bitrate)
    if name == "pcm16":
        return Pcm16Encoder(SOURCE_RATE if sample_rate is None else sample_rate)
    if name == "mulaw":
        if sample_rate not in (None, MULAW_RATE):
            raise ValueError(
                f"mulaw output is always {MULAW_RATE} Hz, got sample_rate={sample_rate}"
            )
        return MulawEncoder()
    raise ValueError(f"unknown codec {codec!r}; expected one of {', '.join(CODECS)}")
