"""Specification tests for voiceagent.audio.containers: the streaming encoders behind the
HTTP speech APIs. Every stream is decoded again with PyAV (ffmpeg), from its bytes."""

from __future__ import annotations

import io
import itertools
import struct
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import av
import numpy as np
import pytest

from voiceagent.audio.codecs import alaw_decode, float_to_int16, mulaw_decode
from voiceagent.audio.containers import (
    FORMATS,
    RATES,
    StreamEncoder,
    make_stream_encoder,
)
from voiceagent.audio.format import MODEL_RATE
from voiceagent.audio.resample import StreamResampler

# 37 ms, 250 ms, 3 ms and nothing: chunks that never line up with a codec frame.
UNEVEN = (888, 6000, 72, 0)
# Headerless formats: the ffmpeg demuxer that reads each (told the rate, like any client).
RAW_DEMUXERS = {
    "pcm": "s16le",
    "pcm_s16le": "s16le",
    "pcm_f32le": "f32le",
    "pcm_mulaw": "mulaw",
    "pcm_alaw": "alaw",
}


def sine(freq: float, seconds: float, rate: int = MODEL_RATE, amp: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


TONE = sine(440, 1.3)


def chunks(x: np.ndarray, sizes: tuple[int, ...]) -> Iterator[np.ndarray]:
    pos = 0
    for size in itertools.cycle(sizes):
        if pos >= x.size:
            return
        yield x[pos : pos + size]
        pos += size


def stream(enc: StreamEncoder, x: np.ndarray, sizes: tuple[int, ...] = UNEVEN) -> list[bytes]:
    """What a response would send: the bytes of every encode() call, then finish()'s."""
    return [enc.encode(c) for c in chunks(x, sizes)] + [enc.finish()]


def encoded(
    fmt: str,
    rate: int | None = None,
    x: np.ndarray = TONE,
    sizes: tuple[int, ...] = UNEVEN,
    bitrate: int | None = None,
) -> bytes:
    return b"".join(stream(make_stream_encoder(fmt, rate, bitrate), x, sizes))


@dataclass
class Decoded:
    container: str
    codec: str
    rate: int
    channels: int
    samples: np.ndarray  # as the decoder gives them: int16 or float32
    bit_rate: int

    @property
    def floats(self) -> np.ndarray:
        s = self.samples
        return s.astype(np.float32) / 32768 if s.dtype == np.int16 else s


def decode(data: bytes, fmt: str, rate: int) -> Decoded:
    """Decode with ffmpeg; headerless formats need their layout told, like any client does."""
    if fmt in RAW_DEMUXERS:
        options = {"sample_rate": str(rate), "ch_layout": "mono"}
        c = av.open(io.BytesIO(data), "r", format=RAW_DEMUXERS[fmt], options=options)
    else:
        c = av.open(io.BytesIO(data), "r")
    with c:
        s = c.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(s)]
        return Decoded(
            c.format.name,
            s.codec_context.name,
            s.rate,
            s.channels,
            np.concatenate(frames),
            s.bit_rate or 0,
        )


def reference(rate: int, x: np.ndarray = TONE) -> np.ndarray:
    """The input at `rate`, converted in one go (no stream): what a lossless format holds."""
    rs = StreamResampler(MODEL_RATE, rate)
    return np.concatenate([rs.process(x), rs.flush()])


def dominant_freq(x: np.ndarray, rate: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1 / rate)[np.argmax(spec)])


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


# --- lossless: the decoded samples are the input's --------------------------------------

LOSSLESS = {
    # format: (PyAV's container name, its decoder)
    "wav": ("wav", "pcm_s16le"),
    "flac": ("flac", "flac"),
    "pcm": ("s16le", "pcm_s16le"),
    "pcm_s16le": ("s16le", "pcm_s16le"),
    "pcm_f32le": ("f32le", "pcm_f32le"),
}


@pytest.mark.parametrize(
    ("fmt", "rate"),
    [
        ("wav", 24000),
        ("wav", 8000),
        ("flac", 24000),
        ("flac", 44100),
        ("flac", 16000),
        ("pcm", 24000),
        ("pcm_s16le", 24000),
        ("pcm_s16le", 22050),
        ("pcm_f32le", 24000),
        ("pcm_f32le", 48000),
    ],
)
def test_lossless_formats_decode_to_the_input_samples_at_its_exact_length(
    fmt: str, rate: int
) -> None:
    enc = make_stream_encoder(fmt, rate)
    assert enc.sample_rate == rate
    d = decode(encoded(fmt, rate), fmt, rate)

    assert (d.container, d.codec) == LOSSLESS[fmt]
    assert (d.rate, d.channels) == (rate, 1)
    ref = reference(rate)
    assert d.samples.size == ref.size == round(TONE.size * rate / MODEL_RATE)  # no padding
    # At 24 kHz the samples are the input's, bit for bit. Resampled, the streamed soxr
    # may round a sample the other way than the one-shot reference (1e-6): 1 LSB.
    if d.samples.dtype == np.int16:
        diff = np.abs(d.samples.astype(np.int32) - float_to_int16(ref))
        assert diff.max() <= (0 if rate == MODEL_RATE else 1)
    else:
        np.testing.assert_allclose(d.samples, ref, atol=0 if rate == MODEL_RATE else 1e-5)


def test_pcm_is_openai_raw_24khz_s16le() -> None:
    data = encoded("pcm")
    assert data == float_to_int16(TONE).astype("<i2").tobytes()
    assert make_stream_encoder("pcm").content_type == "audio/pcm"


def test_wav_streams_its_header_first_with_unknown_sizes() -> None:
    enc = make_stream_encoder("wav", 16000)
    first = enc.encode(np.zeros(0, np.float32))  # the header needs no audio
    assert len(first) == 44
    riff, riff_size, wave_id = struct.unpack_from("<4sI4s", first, 0)
    assert (riff, wave_id) == (b"RIFF", b"WAVE")
    assert struct.unpack_from("<4sI", first, 36) == (b"data", 0xFFFFFFFF)
    assert riff_size == 0xFFFFFFFF  # the length is unknown while streaming
    # fmt: PCM, mono, 16 kHz, 32000 bytes/s, 2-byte frames, 16 bits.
    assert struct.unpack_from("<4sIHHIIHH", first, 12) == (b"fmt ", 16, 1, 1, 16000, 32000, 2, 16)
    assert enc.encode(np.zeros(0, np.float32)) == b""  # ... and only once


def test_pythons_wave_reads_a_streamed_wav_to_its_end() -> None:
    data = encoded("wav")
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        # nframes comes from the unknown (max) size; reading stops at the real end.
        frames = w.readframes(w.getnframes())
    assert np.frombuffer(frames, "<i2").tolist() == float_to_int16(TONE).tolist()


def test_flac_streaminfo_says_length_unknown_since_it_is_never_patched() -> None:
    data = encoded("flac")
    assert data[:4] == b"fLaC"
    streaminfo = data[8:42]
    min_block, max_block = struct.unpack_from(">HH", streaminfo, 0)
    assert min_block == max_block == 480  # 20 ms blocks: a block leaves when it is full
    # 20 bits rate, 3 channels-1, 5 bits-per-sample-1, then 36 bits of total samples.
    packed = int.from_bytes(streaminfo[10:18], "big")
    assert packed >> 44 == 24000
    assert (packed >> 41) & 7 == 0  # mono
    assert packed & ((1 << 36) - 1) == 0  # "unknown": a pipe cannot go back to fill it in


# --- G.711 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "rate", "project_decoder"),
    [
        ("pcm_mulaw", 8000, mulaw_decode),
        ("pcm_alaw", 8000, alaw_decode),
        ("pcm_mulaw", 24000, mulaw_decode),
        ("pcm_alaw", 44100, alaw_decode),
    ],
)
def test_g711_bytes_decode_back_to_the_tone(
    fmt: str, rate: int, project_decoder: Callable[[bytes], np.ndarray]
) -> None:
    data = encoded(fmt, rate)
    d = decode(data, fmt, rate)
    assert (d.container, d.codec, d.rate, d.channels) == (RAW_DEMUXERS[fmt], fmt, rate, 1)
    ref = reference(rate)
    assert len(data) == d.samples.size == ref.size  # one byte a sample
    np.testing.assert_array_equal(project_decoder(data), d.samples)  # ffmpeg agrees with ours
    noise = d.floats - ref
    snr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum(noise.astype(np.float64) ** 2))
    assert snr > 30


# --- lossy: the tone, where and how long the codec says ------------------------------


@dataclass(frozen=True)
class Lossy:
    container: str
    codec: str
    start: int  # where the first input sample lands in the decoded output
    extra: int  # decoded samples beyond the input, besides rounding up to a frame


# MP3: LAME's 576-sample encoder delay and ffmpeg's 529-sample decoder delay put the first
# sample at 1105; LAME pads the end by at least 576 more (a granule) before rounding up to a
# frame, so the stream decodes 1152 + [0, frame) samples longer. AAC (ADTS): 1024 samples of
# priming, then up to a frame of padding. Neither container can carry the trim without a
# seek back. Ogg Opus carries both (pre-skip, end granule): decoders play the exact length.
LOSSY = {
    "mp3": Lossy("mp3", "mp3float", start=1105, extra=1152),
    "aac": Lossy("aac", "aac", start=1024, extra=1024),
    "opus": Lossy("ogg", "opus", start=0, extra=0),
}


@pytest.mark.parametrize(
    ("fmt", "rate", "frame"),
    [
        ("mp3", 24000, 576),
        ("mp3", 22050, 576),
        ("mp3", 44100, 1152),
        ("mp3", 8000, 576),
        ("aac", 24000, 1024),
        ("aac", 44100, 1024),
        ("opus", 48000, 0),
    ],
)
def test_lossy_formats_decode_to_the_tone_within_priming_and_a_frame(
    fmt: str, rate: int, frame: int
) -> None:
    spec = LOSSY[fmt]
    assert make_stream_encoder(fmt, None if fmt == "opus" else rate).sample_rate == rate
    d = decode(encoded(fmt, None if fmt == "opus" else rate), fmt, rate)

    assert (d.container, d.codec, d.rate, d.channels) == (spec.container, spec.codec, rate, 1)
    ref = reference(rate)
    extra = d.samples.size - ref.size
    assert spec.extra <= extra <= spec.extra + frame
    y = d.floats[spec.start : spec.start + ref.size]
    assert abs(dominant_freq(y, rate) - 440) < 2
    # Lined up at `start`, the decoded tone follows the input (not shifted, not garbled);
    # the first and last 50 ms hold the codecs' fade-in and the tail's transient.
    edge = rate // 20
    # (Opus, tuned for speech, keeps 0.98 of an aligned tone: not its exact waveform)
    assert correlation(y[edge:-edge], ref[edge:-edge]) > (0.95 if fmt == "opus" else 0.99)


def test_opus_is_ogg_opus_fed_at_24khz_and_played_at_48khz() -> None:
    enc = make_stream_encoder("opus")
    assert (enc.content_type, enc.sample_rate) == ("audio/ogg", 48000)
    data = encoded("opus")
    head = data[data.index(b"OpusHead") :]
    version, channels, pre_skip, input_rate = struct.unpack_from("<BBHI", head, 8)
    assert (version, channels, input_rate) == (1, 1, 24000)
    assert pre_skip > 0  # the encoder's lookahead, which decoders drop
    assert decode(data, "opus", 48000).samples.size == 2 * TONE.size


def test_mp3_starts_with_audio_frames_and_no_tag_to_patch() -> None:
    data = encoded("mp3")
    # No ID3v2 tag, and the first frame is audio: no Xing/Info frame, whose counts would
    # need a seek back once the stream ends.
    assert data[0] == 0xFF and data[1] & 0xE0 == 0xE0  # an MPEG audio frame sync
    assert b"Xing" not in data[:1000] and b"Info" not in data[:1000]


def test_mp3_bitrate_is_the_one_asked_for() -> None:
    # ElevenLabs' mp3_44100_128 and mp3_22050_32.
    for rate, bitrate in ((44100, 128000), (22050, 32000)):
        d = decode(encoded("mp3", rate, bitrate=bitrate), "mp3", rate)
        assert d.bit_rate == bitrate
        assert d.rate == rate


# --- streaming -----------------------------------------------------------------------

# The most audio (ms) that goes in before the first audio bytes come out (headers aside):
# the codec's frame and lookahead (LAME holds 3 frames of 576, ffmpeg's AAC 2 of 1024; Ogg
# sends a page when the next 20 ms packet starts). Resampling adds soxr's delay.
FIRST_AUDIO_MS = {
    ("pcm", None): 1,
    ("pcm_s16le", None): 1,
    ("pcm_f32le", None): 1,
    ("pcm_mulaw", None): 1,
    ("pcm_alaw", None): 1,
    ("wav", None): 1,
    ("flac", None): 20,
    ("opus", None): 40,
    ("mp3", None): 72,
    ("aac", None): 86,
    ("flac", 44100): 39,
    ("mp3", 44100): 107,
    ("pcm_mulaw", 8000): 74,
}


@pytest.mark.parametrize(("fmt", "rate"), list(FIRST_AUDIO_MS))
def test_first_audio_bytes_need_no_more_input_than_the_codec_does(
    fmt: str, rate: int | None
) -> None:
    x = sine(440, 0.3)
    enc = make_stream_encoder(fmt, rate)
    enc.encode(x[:0])  # the container's header, if it has one
    step = MODEL_RATE // 1000
    lag_ms = next((i + step) // step for i in range(0, x.size, step) if enc.encode(x[i : i + step]))
    assert lag_ms <= FIRST_AUDIO_MS[fmt, rate]


STREAMING_CASES = [(f, None) for f in FORMATS] + [("mp3", 44100), ("pcm_mulaw", 8000)]


@pytest.mark.parametrize(("fmt", "rate"), STREAMING_CASES)
def test_bytes_come_out_as_the_audio_goes_in_and_are_never_rewritten(
    fmt: str, rate: int | None
) -> None:
    x = sine(440, 2.0)
    enc = make_stream_encoder(fmt, rate)
    header = enc.encode(x[:0])
    outs = [enc.encode(c) for c in chunks(x, (2400,))]
    before_finish = header + b"".join(outs)
    tail = enc.finish()

    # Audio bytes by the second chunk, and then from every chunk: a steady stream.
    assert all(outs[1:]), [len(b) for b in outs]
    # What was sent is a prefix of the file, so it must decode on its own: a client that
    # plays as it receives has most of the audio before finish() (nothing was held back,
    # nothing needed patching).
    enc_rate = enc.sample_rate
    streamed = decode(before_finish, fmt, enc_rate).samples.size / enc_rate
    whole = decode(before_finish + tail, fmt, enc_rate).samples.size / enc_rate
    assert streamed > 1.8
    assert whole >= 2.0


@pytest.mark.parametrize(("fmt", "rate"), [(f, None) for f in FORMATS] + [("flac", 44100)])
def test_chunking_does_not_change_the_stream(fmt: str, rate: int | None) -> None:
    # Codec frames are cut from the stream, not from the chunks; the resampler is streaming.
    def essence(data: bytes) -> object:
        if fmt != "opus":
            return data
        # Each Ogg stream gets a random serial number (so pages and CRCs differ): compare
        # what the pages carry.
        with av.open(io.BytesIO(data), "r") as c:
            return [(p.pts, bytes(p)) for p in c.demux(audio=0)]

    whole = essence(encoded(fmt, rate, sizes=(TONE.size,)))
    assert essence(encoded(fmt, rate, sizes=UNEVEN)) == whole
    assert essence(encoded(fmt, rate, sizes=(1, 479, 0, 7, 2400))) == whole


def test_finish_flushes_a_stream_shorter_than_one_codec_frame() -> None:
    x = sine(440, 0.01)  # 240 samples: less than any codec frame
    for fmt, spec in LOSSY.items():
        enc = make_stream_encoder(fmt)
        first = enc.encode(x)
        assert first == b"" or fmt == "opus"  # (opus: its Ogg headers, no audio yet)
        data = first + enc.finish()
        expected = x.size * enc.sample_rate // MODEL_RATE + spec.extra
        assert decode(data, fmt, enc.sample_rate).samples.size >= expected


def test_an_encoder_cannot_be_used_after_finish() -> None:
    enc = make_stream_encoder("mp3")
    enc.finish()
    with pytest.raises(RuntimeError, match="finished"):
        enc.encode(TONE)
    with pytest.raises(RuntimeError, match="finished"):
        enc.finish()


def test_out_of_range_samples_are_clipped_not_wrapped() -> None:
    x = np.array([2.0, -2.0, 0.5], np.float32)
    assert np.frombuffer(encoded("pcm_s16le", x=x), "<i2").tolist() == [32767, -32767, 16384]
    assert np.frombuffer(encoded("pcm_f32le", x=x), "<f4").tolist() == [1.0, -1.0, 0.5]


# --- requests ------------------------------------------------------------------------


def test_content_types() -> None:
    types = {f: make_stream_encoder(f).content_type for f in FORMATS}
    assert types == {
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


def test_default_rates_are_the_models_and_opus_native() -> None:
    rates = {f: make_stream_encoder(f).sample_rate for f in FORMATS}
    assert rates == {f: 48000 if f == "opus" else 24000 for f in FORMATS}
    assert RATES == (8000, 16000, 22050, 24000, 44100, 48000)


@pytest.mark.parametrize(
    ("fmt", "kwargs", "match"),
    [
        ("ogg", {}, "unknown audio format 'ogg'; expected one of mp3, opus, aac, flac, wav, pcm"),
        ("pcm_s16le", {"sample_rate": 11025}, "pcm_s16le sample_rate must be one of 8000, 16000"),
        ("pcm", {"sample_rate": 16000}, "pcm sample_rate must be one of 24000, got 16000"),
        ("opus", {"sample_rate": 24000}, "opus sample_rate must be one of 48000"),
        ("mp3", {"sample_rate": 44100, "bitrate": 144000}, "mp3 bitrate at 44100 Hz .* 128000"),
        ("mp3", {"sample_rate": 22050, "bitrate": 192000}, "mp3 bitrate at 22050 Hz .* 160000"),
        ("opus", {"bitrate": 1000}, "opus bitrate must be in 6000..510000"),
        ("wav", {"bitrate": 64000}, "wav has no bitrate"),
    ],
)
def test_bad_requests_say_what_is_supported(fmt: str, kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_stream_encoder(fmt, **kwargs)


def test_stereo_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="mono"):
        make_stream_encoder("wav").encode(np.zeros((10, 2), np.float32))
