"""Streaming encoders for the HTTP speech APIs (OpenAI, Cartesia, ElevenLabs): float32 mono
PCM at MODEL_RATE in, in chunks of any size, and the bytes of the requested format out as
soon as the codec can produce them. Nothing is buffered whole and nothing already handed out
is ever rewritten, so the concatenation of every `encode()` and the `finish()` is the file.

Lossy and compressed formats go through PyAV (ffmpeg's libmp3lame, libopus, aac, flac)
writing to a sink without seek(): ffmpeg then treats the output as a pipe and its muxers
never go back to patch a header (FLAC's STREAMINFO keeps "length unknown", MP3 gets no Xing
frame). AAC is ADTS, the one AAC container that needs no index at the end.

Durations: wav, flac, the raw formats and Ogg Opus decode to the input's exact length (the
resampler is delay-compensated; Ogg's pre-skip and end granule trim Opus' lookahead and
padding). MP3 and ADTS have nowhere to say how much to trim without a seek back, so a decoder
also plays the priming and padding: AAC 1024 samples of priming + up to one frame (1024);
MP3 starts 1105 samples late (LAME's 576 + the decoder's 529) and LAME pads at least a
granule (576) at the end, so it decodes 1152 + up to one frame (576, or 1152 from 32 kHz up)
samples longer than its input.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Callable

import av
import numpy as np
from numpy.typing import NDArray

from .codecs import alaw_encode, float_to_int16, mulaw_encode
from .format import DEFAULT_OPUS_BITRATE, MODEL_RATE, OPUS_BITRATES, OPUS_RATE, frame_samples
from .resample import Float32Array, StreamResampler

# The rates Cartesia and ElevenLabs ask for; every format that resamples accepts them all.
RATES = (8000, 16000, 22050, 24000, 44100, 48000)

CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "pcm_s16le": "audio/pcm",
    "pcm_f32le": "audio/pcm",
    "pcm_mulaw": "audio/basic",
    "pcm_alaw": "audio/x-alaw-basic",
}
FORMATS = tuple(CONTENT_TYPES)

FORMAT_RATES: dict[str, tuple[int, ...]] = {
    fmt: RATES for fmt in FORMATS if fmt not in ("opus", "pcm")
} | {
    # Opus always decodes at 48 kHz whatever it was fed (RFC 7845).
    "opus": (OPUS_RATE,),
    # OpenAI's pcm is fixed: its SDK plays the bytes as 24 kHz s16le without asking.
    "pcm": (MODEL_RATE,),
}

# MP3 bit rates (kbit/s) a CBR frame can signal: MPEG-1 for 32 kHz and up, MPEG-2/2.5 below.
MP3_BITRATES_MPEG1 = (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)
MP3_BITRATES_MPEG2 = (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)
AAC_BITRATES = (16000, 320000)  # the range accepted, bit/s
DEFAULT_AAC_BITRATE = 64000

# A 20 ms page per Opus packet: Ogg's default (1 s pages) would hold the audio back a second.
OGG_PAGE_DURATION_US = 20000


class StreamEncoder(ABC):
    """One stream: float32 mono MODEL_RATE chunks in, encoded bytes out, in call order.
    `finish()` ends it (flushes the codec, writes any trailer); calls after it raise."""

    content_type: str  # the HTTP Content-Type of the bytes
    sample_rate: int  # the rate a decoder of the bytes plays

    def __init__(self, codec_rate: int) -> None:
        # Streaming (soxr keeps its filter state), so chunk boundaries never click.
        self._resampler = StreamResampler(MODEL_RATE, codec_rate)
        self._finished = False

    def encode(self, pcm: np.ndarray) -> bytes:
        """Any number of samples (0 too); returns the bytes ready now (may be b"")."""
        self._check_open()
        return self._encode(self._resampler.process(pcm))

    def finish(self) -> bytes:
        self._check_open()
        self._finished = True
        return self._encode(self._resampler.flush()) + self._close()

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("this stream encoder has already finished")

    @abstractmethod
    def _encode(self, pcm: Float32Array) -> bytes:
        """Samples at the codec's rate -> the bytes ready now."""

    def _close(self) -> bytes:
        return b""

    def seal(self, head: bytes, size: int) -> bytes:
        """The first bytes of a finished stream, `size` bytes in all, with the lengths its
        header left unknown filled in (for a whole file, sent once it is all made)."""
        return head


Converter = Callable[[Float32Array], bytes]


def _s16le(x: Float32Array) -> bytes:
    return float_to_int16(x).astype("<i2").tobytes()


def _f32le(x: Float32Array) -> bytes:
    # Clipped like every integer format, so a client sees the same signal in each.
    return np.clip(x, -1.0, 1.0).astype("<f4").tobytes()


def _mulaw(x: Float32Array) -> bytes:
    return mulaw_encode(float_to_int16(x)).tobytes()


def _alaw(x: Float32Array) -> bytes:
    return alaw_encode(float_to_int16(x)).tobytes()


RAW_CONVERTERS: dict[str, Converter] = {
    "pcm": _s16le,
    "pcm_s16le": _s16le,
    "pcm_f32le": _f32le,
    "pcm_mulaw": _mulaw,
    "pcm_alaw": _alaw,
}


class RawEncoder(StreamEncoder):
    """Headerless samples: every input sample is out as soon as the resampler lets it go."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        super().__init__(sample_rate)
        self.content_type = CONTENT_TYPES[fmt]
        self.sample_rate = sample_rate
        self._convert = RAW_CONVERTERS[fmt]

    def _encode(self, pcm: Float32Array) -> bytes:
        return self._convert(pcm) if pcm.size else b""


# A RIFF size field of 0xFFFFFFFF means "until the end": the length is unknown when the
# header goes out. ffmpeg and Python's `wave` read such files to EOF; a strict reader that
# trusts the size would expect 4 GiB.
UNKNOWN_SIZE = 0xFFFFFFFF


def streaming_wav_header(sample_rate: int) -> bytes:
    """RIFF/WAVE header for 16-bit mono PCM of unknown length."""
    fmt_chunk = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (
        struct.pack("<4sI4s", b"RIFF", UNKNOWN_SIZE, b"WAVE")
        + struct.pack("<4sI", b"fmt ", len(fmt_chunk))
        + fmt_chunk
        + struct.pack("<4sI", b"data", UNKNOWN_SIZE)
    )


class WavEncoder(RawEncoder):
    """16-bit mono WAV: the header with unknown sizes first, then s16le as it comes."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__("pcm_s16le", sample_rate)
        self.content_type = CONTENT_TYPES["wav"]
        self._header = streaming_wav_header(sample_rate)

    def _encode(self, pcm: Float32Array) -> bytes:
        out = self._header + super()._encode(pcm)
        self._header = b""
        return out

    def seal(self, head: bytes, size: int) -> bytes:
        sized = bytearray(head)
        sized[4:8] = struct.pack("<I", size - 8)  # RIFF: all after its size field
        sized[40:44] = struct.pack("<I", size - 44)  # data: the samples
        return bytes(sized)


class _Sink:
    """Collects what the muxer writes. It has no seek()/tell(), so PyAV hands ffmpeg a
    non-seekable output and no muxer can go back to rewrite bytes already sent."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class AvEncoder(StreamEncoder):
    """A codec and muxer from ffmpeg (PyAV). Input is cut into the codec's frame size here
    (mp3 576 or 1152, aac 1024, opus 480 at 24 kHz, flac 20 ms), so any chunking works and
    gives the same frames; `finish()` encodes the short last frame and drains the codec."""

    def __init__(
        self,
        fmt: str,
        container: str,
        codec: str,
        codec_rate: int,
        sample_rate: int,
        sample_format: str,
        bitrate: int | None = None,
        container_options: dict[str, str] | None = None,
        codec_options: dict[str, str] | None = None,
    ) -> None:
        super().__init__(codec_rate)
        self.content_type = CONTENT_TYPES[fmt]
        self.sample_rate = sample_rate
        self._codec_rate = codec_rate
        self._sink = _Sink()
        # flush_packets: every packet leaves ffmpeg's 32 KiB I/O buffer as it is muxed.
        self._out = av.open(
            self._sink,
            "w",
            format=container,
            container_options={"flush_packets": "1", **(container_options or {})},
        )
        stream = self._out.add_stream(
            codec, rate=codec_rate, layout="mono", options=codec_options or {}
        )
        assert isinstance(stream, av.AudioStream)  # `codec` is an audio codec
        self._stream = stream
        ctx = self._stream.codec_context
        ctx.format = sample_format
        if bitrate is not None:
            ctx.bit_rate = bitrate
        self._out.start_encoding()  # opens the codec (frame_size is known) and writes the header
        self._frame_size = ctx.frame_size
        self._sample_format = sample_format
        self._pending: Float32Array = np.zeros(0, dtype=np.float32)
        self._pts = 0

    def _encode(self, pcm: Float32Array) -> bytes:
        if pcm.size:
            self._pending = np.concatenate([self._pending, pcm])
        n = self._frame_size
        whole = self._pending.size // n * n
        for start in range(0, whole, n):
            self._encode_frame(self._pending[start : start + n])
        self._pending = self._pending[whole:]
        return self._sink.take()

    def _close(self) -> bytes:
        if self._pending.size:
            self._encode_frame(self._pending)  # short last frame; the codec pads it
        self._out.mux(self._stream.encode(None))  # drain the codec's delay
        self._out.close()  # trailer (nothing for these muxers on a pipe)
        return self._sink.take()

    def seal(self, head: bytes, size: int) -> bytes:
        if self._out.format.name != "flac":
            return head
        # STREAMINFO's 36-bit sample count: the low nibble of byte 21, then bytes 22-25
        sized = bytearray(head)
        total = self._pts
        sized[21] = (sized[21] & 0xF0) | (total >> 32 & 0x0F)
        sized[22:26] = struct.pack(">I", total & 0xFFFFFFFF)
        return bytes(sized)

    def _encode_frame(self, x: Float32Array) -> None:
        # s16 (flac) takes the same ints as wav and pcm: flac is their lossless twin.
        s16 = self._sample_format == "s16"
        samples: NDArray[np.int16] | Float32Array = (
            float_to_int16(x) if s16 else np.clip(x, -1.0, 1.0)
        )
        frame = av.AudioFrame.from_ndarray(
            samples.reshape(1, -1), format=self._sample_format, layout="mono"
        )
        frame.sample_rate = self._codec_rate
        frame.pts = self._pts
        self._pts += x.size
        self._out.mux(self._stream.encode(frame))


def mp3_bitrates(sample_rate: int) -> tuple[int, ...]:
    kbps = MP3_BITRATES_MPEG1 if sample_rate >= 32000 else MP3_BITRATES_MPEG2
    return tuple(k * 1000 for k in kbps)


def _check_bitrate(fmt: str, bitrate: int, sample_rate: int) -> None:
    if fmt == "mp3":
        allowed = mp3_bitrates(sample_rate)
        if bitrate not in allowed:
            rates = ", ".join(map(str, allowed))
            raise ValueError(
                f"mp3 bitrate at {sample_rate} Hz must be one of {rates}, got {bitrate}"
            )
        return
    lo, hi = {"opus": OPUS_BITRATES, "aac": AAC_BITRATES}.get(fmt, (0, -1))
    if hi < 0:
        raise ValueError(f"{fmt} has no bitrate (only mp3, opus and aac take one)")
    if not lo <= bitrate <= hi:
        raise ValueError(f"{fmt} bitrate must be in {lo}..{hi} bit/s, got {bitrate}")


def make_stream_encoder(
    fmt: str, sample_rate: int | None = None, bitrate: int | None = None
) -> StreamEncoder:
    """The encoder for one response. `sample_rate` defaults to 24000 (48000 for opus);
    `bitrate` (bit/s) applies to mp3, opus and aac only."""
    if fmt not in CONTENT_TYPES:
        raise ValueError(f"unknown audio format {fmt!r}; expected one of {', '.join(FORMATS)}")
    rates = FORMAT_RATES[fmt]
    rate = (OPUS_RATE if fmt == "opus" else MODEL_RATE) if sample_rate is None else sample_rate
    if rate not in rates:
        raise ValueError(
            f"{fmt} sample_rate must be one of {', '.join(map(str, rates))}, got {sample_rate}"
        )
    if bitrate is not None:
        _check_bitrate(fmt, bitrate, rate)

    if fmt in RAW_CONVERTERS:
        return RawEncoder(fmt, rate)
    if fmt == "wav":
        return WavEncoder(rate)
    if fmt == "mp3":
        return AvEncoder(
            fmt,
            container="mp3",
            codec="libmp3lame",
            codec_rate=rate,
            sample_rate=rate,
            sample_format="fltp",
            bitrate=bitrate or (128000 if rate >= 32000 else 64000),
            # No ID3 tag (there is nothing to say) and no Xing frame (it needs a seek back).
            container_options={"id3v2_version": "0", "write_xing": "0"},
        )
    if fmt == "aac":
        return AvEncoder(
            fmt,
            container="adts",
            codec="aac",
            codec_rate=rate,
            sample_rate=rate,
            sample_format="fltp",
            bitrate=bitrate or DEFAULT_AAC_BITRATE,
        )
    if fmt == "opus":
        # libopus takes 24 kHz as it is (one of Opus' own rates: no resampler delay); the
        # OpusHead records 24000 as the input rate, and every decoder plays 48 kHz.
        return AvEncoder(
            fmt,
            container="ogg",
            codec="libopus",
            codec_rate=MODEL_RATE,
            sample_rate=OPUS_RATE,
            sample_format="flt",
            bitrate=bitrate or DEFAULT_OPUS_BITRATE,
            container_options={"page_duration": str(OGG_PAGE_DURATION_US)},
            codec_options={"application": "voip"},  # speech, as `codecs.OpusEncoder`
        )
    return AvEncoder(
        fmt,
        container="flac",
        codec="flac",
        codec_rate=rate,
        sample_rate=rate,
        sample_format="s16",
        # The 8 KiB padding block only serves a writer that seeks back to fill it.
        container_options={"metadata_header_padding": "0"},
        # 20 ms blocks instead of ffmpeg's 2304 samples (96 ms at 24 kHz): a block leaves
        # only when full, and the stream is ~4% bigger for it.
        codec_options={"frame_size": str(frame_samples(rate))},
    )
