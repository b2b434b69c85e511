"""Specification tests for voiceagent.audio: resampling, framing, codecs, Ogg/WAV output."""

from __future__ import annotations

import io
import itertools
import math
import struct
import warnings
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np
import opuslib
import pytest

from voiceagent.audio.codecs import (
    Encoder,
    MulawEncoder,
    OpusEncoder,
    Pcm16Encoder,
    alaw_decode,
    alaw_encode,
    make_encoder,
    mulaw_decode,
    mulaw_encode,
)
from voiceagent.audio.format import MODEL_RATE as SOURCE_RATE
from voiceagent.audio.framing import Framer
from voiceagent.audio.levels import loudness
from voiceagent.audio.ogg import OggOpusWriter
from voiceagent.audio.resample import StreamResampler
from voiceagent.audio.wav import write_wav

IRREGULAR = (7, 333, 1000, 1, 4801, 96, 2400, 0, 59)


def sine(freq: float, rate: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    n = round(rate * seconds)
    return (amp * np.sin(2 * np.pi * freq * np.arange(n) / rate)).astype(np.float32)


def chunks(x: np.ndarray, sizes: tuple[int, ...] = IRREGULAR) -> Iterator[np.ndarray]:
    pos = 0
    for size in itertools.cycle(sizes):
        if pos >= x.size:
            return
        yield x[pos : pos + size]
        pos += size


def framer_for(enc: Encoder) -> Framer:
    return Framer(enc.sample_rate, enc.tail_samples)


def encode_all(
    enc: Encoder, x: np.ndarray, chunked: bool = True, framer: Framer | None = None
) -> list[bytes]:
    """Frame `x` (in irregular chunks, or whole) and encode every frame, as a turn and its
    sender do."""
    framer = framer or framer_for(enc)
    frames = []
    for c in chunks(x) if chunked else [x]:
        frames += framer.frames(c)
    return [enc.encode(f) for f in frames + framer.flush()]


def dominant_freq(x: np.ndarray, rate: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1 / rate)[np.argmax(spec)])


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    noise = ref.astype(np.float64) - test
    return 10 * math.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum(noise**2))


# --- resampler ---------------------------------------------------------------


@pytest.mark.parametrize("out_rate", [48000, 16000, 8000])
def test_resampler_chunking_does_not_change_output(out_rate: int) -> None:
    x = np.random.default_rng(0).uniform(-0.5, 0.5, 24000).astype(np.float32)
    whole = StreamResampler(SOURCE_RATE, out_rate)
    one_shot = np.concatenate([whole.process(x), whole.flush()])

    parts = StreamResampler(SOURCE_RATE, out_rate)
    chunked = np.concatenate([parts.process(c) for c in chunks(x)] + [parts.flush()])

    assert chunked.dtype == np.float32
    # soxr is delay-compensated: after flush the length is exactly in * ratio.
    assert one_shot.size == chunked.size == 24000 * out_rate // SOURCE_RATE
    np.testing.assert_allclose(chunked, one_shot, atol=1e-6)


def test_resampler_output_is_aligned_with_input() -> None:
    rs = StreamResampler(SOURCE_RATE, 48000)
    y = np.concatenate([rs.process(sine(440, SOURCE_RATE, 1.0)), rs.flush()])
    ref = sine(440, 48000, 1.0)
    # No group delay left in the output: the upsampled sine lines up sample for sample.
    assert np.max(np.abs(y[480:-480] - ref[480:-480])) < 1e-3


def test_resampler_same_rate_is_passthrough_and_flush_resets() -> None:
    x = sine(440, SOURCE_RATE, 0.1)
    rs = StreamResampler(SOURCE_RATE, SOURCE_RATE)
    np.testing.assert_array_equal(rs.process(x), x)
    assert rs.flush().size == 0

    up = StreamResampler(SOURCE_RATE, 48000)
    first = np.concatenate([up.process(x), up.flush()])
    second = np.concatenate([up.process(x), up.flush()])  # reusable after flush
    np.testing.assert_array_equal(first, second)


def test_resampler_rejects_non_mono() -> None:
    with pytest.raises(ValueError, match="mono"):
        StreamResampler(SOURCE_RATE, 48000).process(np.zeros((10, 2), dtype=np.float32))


# --- Opus --------------------------------------------------------------------


def test_opus_one_second_sine_frames_decode_to_a_440hz_sine() -> None:
    x = sine(440, SOURCE_RATE, 1.0)
    enc = OpusEncoder()
    framer = framer_for(enc)
    assert (enc.codec, enc.sample_rate, framer.frame_samples) == ("opus", 48000, 960)
    # libopus' 48 kHz lookahead (2.5 ms window + 4 ms delay compensation).
    assert enc.tail_samples == 312

    packets = encode_all(enc, x, framer=framer)

    # flush pushes lookahead zeros so the decoder releases all real audio,
    # then pads to a whole frame: ceil((48000 + 312) / 960) = 51.
    n48 = x.size * 2
    assert framer.samples_out == n48
    assert len(packets) == math.ceil((n48 + enc.tail_samples) / 960) == 51

    dec = opuslib.Decoder(48000, 1)
    pcm = []
    for p in packets:
        out = np.frombuffer(dec.decode(p, 960), dtype=np.int16)
        assert out.size == 960
        pcm.append(out)
    decoded = np.concatenate(pcm).astype(np.float32) / 32768
    decoded = decoded[enc.tail_samples : enc.tail_samples + n48]  # drop codec delay

    ref = sine(440, 48000, 1.0)
    assert decoded.size == ref.size
    # Tuned for speech (VoIP), Opus keeps a tone's pitch and level, not its exact
    # waveform: correlation 0.97 here, 0.99 with the general-audio tuning.
    assert correlation(decoded[960:], ref[960:]) > 0.95
    assert abs(dominant_freq(decoded, 48000) - 440) <= 2
    assert snr_db(ref[960:], decoded[960:]) > 10


def test_opus_chunking_gives_byte_identical_packets() -> None:
    x = sine(440, SOURCE_RATE, 1.0) + sine(1234, SOURCE_RATE, 1.0, amp=0.2)
    chunked = encode_all(OpusEncoder(), x, chunked=True)
    whole = encode_all(OpusEncoder(), x, chunked=False)
    assert chunked == whole


def test_framing_returns_only_whole_frames_and_flush_is_idempotent() -> None:
    framer = framer_for(OpusEncoder())
    assert framer.frames(np.zeros(0, dtype=np.float32)) == []
    assert framer.flush() == []  # nothing was fed
    # 5 ms of input cannot make a 20 ms frame yet.
    assert framer.frames(sine(440, SOURCE_RATE, 0.005)) == []
    assert len(framer.flush()) == 1
    assert framer.flush() == []


def test_gain_scales_a_frame_at_encoding() -> None:
    enc = Pcm16Encoder()
    frame = np.full(480, 0.5, np.float32)
    assert np.frombuffer(enc.encode(frame, gain=0.25), "<i2").tolist() == [4096] * 480


def test_a_gain_change_is_ramped_so_ducking_does_not_click() -> None:
    # What was seen: the gain stepped from 1 to 0.25 at a frame edge, a jump of 0.363
    # where a 180 Hz tone's largest step is 0.024 (15 times).
    x = sine(180, SOURCE_RATE, 0.1, amp=0.5)
    enc = Pcm16Encoder()
    gains = [1.0, 1.0, 0.25, 0.25, 1.0]
    frames = [x[k * 480 : (k + 1) * 480] for k in range(len(gains))]
    pairs = zip(frames, gains, strict=True)
    y = np.concatenate([np.frombuffer(enc.encode(f, g), "<i2") for f, g in pairs])
    y = y.astype(np.float32) / 32767
    natural = float(np.abs(np.diff(x)).max())
    assert float(np.abs(np.diff(y)).max()) < 1.5 * natural
    # the new gain holds once the ramp is over
    np.testing.assert_allclose(y[3 * 480 : 4 * 480], 0.25 * x[3 * 480 : 4 * 480], atol=1e-4)


def test_opus_clips_out_of_range_input_instead_of_wrapping() -> None:
    enc = OpusEncoder()
    packets = encode_all(enc, sine(440, SOURCE_RATE, 0.5, amp=3.0))
    dec = opuslib.Decoder(48000, 1)
    y = np.concatenate([np.frombuffer(dec.decode(p, 960), np.int16) for p in packets])
    y = y[enc.tail_samples : enc.tail_samples + 24000].astype(np.float32) / 32768
    # Clipping yields a near-square 440 Hz wave; int16 wrap-around would be noise.
    ref = np.clip(sine(440, 48000, 0.5, amp=3.0), -1, 1)
    assert correlation(y[960:], ref[960:]) > 0.95


def test_opus_is_tuned_for_speech_as_webrtc_s_encoder_is() -> None:
    # the VoIP application: the shipped voice is heard better through it (docs/training-runs.md)
    assert OpusEncoder()._enc.application == opuslib.APPLICATION_VOIP


# --- PCM16 -------------------------------------------------------------------


def test_pcm16_at_source_rate_round_trips_within_one_lsb() -> None:
    x = np.random.default_rng(1).uniform(-1, 1, 24000 + 100).astype(np.float32)
    enc = Pcm16Encoder()
    frames = encode_all(enc, x)

    assert all(len(f) == 480 * 2 for f in frames)  # 20 ms of int16 at 24 kHz
    assert len(frames) == math.ceil(x.size / 480) == 51
    y = np.frombuffer(b"".join(frames), dtype="<i2")
    np.testing.assert_allclose(y[: x.size] / 32767, x, atol=1 / 32767)
    assert not y[x.size :].any()  # the last frame is zero-padded


def test_pcm16_at_16k_has_320_sample_frames_and_right_duration() -> None:
    x = sine(440, SOURCE_RATE, 1.0)
    frames = encode_all(make_encoder("pcm16", sample_rate=16000), x)

    assert all(len(f) == 320 * 2 for f in frames)
    assert len(frames) == 50  # exactly 1.0 s at 16 kHz
    y = np.frombuffer(b"".join(frames), dtype="<i2").astype(np.float32) / 32767
    assert abs(dominant_freq(y, 16000) - 440) <= 2
    assert correlation(y[160:-160], sine(440, 16000, 1.0)[160:-160]) > 0.999


def test_pcm16_clips_to_int16_range() -> None:
    frames = encode_all(Pcm16Encoder(), np.array([2.0, -2.0, 1.0, -1.0, 0.0], np.float32))
    y = np.frombuffer(b"".join(frames), dtype="<i2")
    assert y[:5].tolist() == [32767, -32767, 32767, -32767, 0]


# --- μ-law -------------------------------------------------------------------


def test_mulaw_reference_code_points() -> None:
    # G.711 values (same as the classic Sun g711.c / CPython audioop): silence is
    # 0xFF, full scale is 0x80 / 0x00 (±32124), tiny negatives land on 0x7E.
    pcm = np.array([0, 32767, -32768, 1, -1, 1000, -1000], dtype=np.int16)
    assert mulaw_encode(pcm).tolist() == [0xFF, 0x80, 0x00, 0xFF, 0x7E, 0xCE, 0x4E]
    assert mulaw_decode(bytes([0xFF, 0x80, 0x00, 0x7F])).tolist() == [0, 32124, -32124, 0]


def test_mulaw_every_code_survives_decode_encode() -> None:
    codes = np.arange(256, dtype=np.uint8)
    again = mulaw_encode(mulaw_decode(codes))
    # 0x7F is "negative zero": it decodes to 0, which encodes as 0xFF.
    expected = codes.copy()
    expected[0x7F] = 0xFF
    np.testing.assert_array_equal(again, expected)


def test_mulaw_encoder_frames_and_snr() -> None:
    x = sine(440, SOURCE_RATE, 1.0)
    enc = MulawEncoder()
    frames = encode_all(enc, x)

    assert (enc.codec, enc.sample_rate) == ("mulaw", 8000)
    assert all(len(f) == 160 for f in frames)
    assert len(frames) == 50
    y = mulaw_decode(b"".join(frames)).astype(np.float32) / 32768
    ref = sine(440, 8000, 1.0)
    assert snr_db(ref[80:-80], y[80:-80]) > 30


def test_mulaw_encodes_silence_as_0xff() -> None:
    frames = encode_all(MulawEncoder(), np.zeros(SOURCE_RATE // 10, dtype=np.float32))
    assert len(frames) == 5
    assert set(b"".join(frames)) == {0xFF}


# --- A-law -------------------------------------------------------------------


def test_alaw_reference_code_points() -> None:
    # G.711 A-law: the smallest steps around zero are 0xD5 (+8) and 0x55 (-8); full
    # scale is 0xAA / 0x2A (±32256); the even bits are sent inverted.
    pcm = np.array([0, -1, 32767, -32768, 1000, -1000], dtype=np.int16)
    assert alaw_encode(pcm).tolist() == [0xD5, 0x55, 0xAA, 0x2A, 0xFA, 0x7A]
    assert alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A])).tolist() == [8, -8, 32256, -32256]


def test_g711_matches_the_standard_librarys_audioop() -> None:
    audioop = pytest.importorskip("audioop", reason="audioop left the stdlib in Python 3.13")
    x = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)
    codes = bytes(range(256))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert alaw_encode(x).tobytes() == audioop.lin2alaw(x.tobytes(), 2)
        assert alaw_decode(codes).tobytes() == audioop.alaw2lin(codes, 2)
        assert mulaw_encode(x).tobytes() == audioop.lin2ulaw(x.tobytes(), 2)
        assert mulaw_decode(codes).tobytes() == audioop.ulaw2lin(codes, 2)


def test_alaw_every_code_survives_decode_encode() -> None:
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(alaw_encode(alaw_decode(codes)), codes)


def test_alaw_error_is_within_half_a_step_of_its_segment() -> None:
    x = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)
    err = np.abs(alaw_decode(alaw_encode(x)).astype(np.int32) - x)
    loud = np.abs(x.astype(np.int32)) >= 256
    assert err.max() <= 512  # the top segment's half step
    assert (err[loud] / np.abs(x[loud].astype(np.int32))).max() <= 1 / 32


def test_alaw_encoder_frames_and_snr() -> None:
    enc = make_encoder("alaw")
    frames = encode_all(enc, sine(440, SOURCE_RATE, 1.0))
    assert (enc.codec, enc.sample_rate) == ("alaw", 8000)
    assert [len(f) for f in frames] == [160] * 50
    y = alaw_decode(b"".join(frames)).astype(np.float32) / 32768
    assert snr_db(sine(440, 8000, 1.0)[80:-80], y[80:-80]) > 30


# --- factory -----------------------------------------------------------------


def test_make_encoder_builds_each_codec() -> None:
    assert isinstance(make_encoder("opus", bitrate=24000), OpusEncoder)
    assert make_encoder("opus").sample_rate == 48000
    assert make_encoder("pcm16").sample_rate == 24000
    assert make_encoder("pcm16", sample_rate=8000).sample_rate == 8000
    assert isinstance(make_encoder("mulaw"), MulawEncoder)


@pytest.mark.parametrize(
    ("codec", "kwargs", "match"),
    [
        ("mp3", {}, "unknown codec 'mp3'"),
        ("pcm16", {"sample_rate": 11025}, "pcm16 sample_rate"),
        ("opus", {"sample_rate": 16000}, "opus sample_rate must be one of 48000"),
        ("mulaw", {"sample_rate": 16000}, "mulaw sample_rate must be one of 8000"),
        ("alaw", {"sample_rate": 16000}, "alaw sample_rate must be one of 8000"),
        ("opus", {"bitrate": 10}, "bitrate"),
    ],
)
def test_make_encoder_rejects_bad_requests(codec: str, kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_encoder(codec, **kwargs)


# --- Ogg Opus ----------------------------------------------------------------


def reference_ogg_crc(data: bytes) -> int:
    """Bit-at-a-time CRC-32/Ogg, written independently of the module's table version."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


@dataclass
class Page:
    version: int
    flags: int
    granule: int
    serial: int
    seq: int
    crc_ok: bool
    packets: list[bytes]


def parse_pages(data: bytes) -> list[Page]:
    pages = []
    pos = 0
    while pos < len(data):
        assert data[pos : pos + 4] == b"OggS", f"no capture pattern at {pos}"
        version, flags, granule, serial, seq, crc, nseg = struct.unpack_from(
            "<BBqIIIB", data, pos + 4
        )
        lacing = data[pos + 27 : pos + 27 + nseg]
        body_start = pos + 27 + nseg
        end = body_start + sum(lacing)
        zeroed = data[pos : pos + 22] + b"\0\0\0\0" + data[pos + 26 : end]
        packets: list[bytes] = []
        cur = b""
        body = data[body_start:end]
        off = 0
        for lace in lacing:
            cur += body[off : off + lace]
            off += lace
            if lace < 255:
                packets.append(cur)
                cur = b""
        assert cur == b"", "this writer never continues packets across pages"
        pages.append(
            Page(version, flags, granule, serial, seq, crc == reference_ogg_crc(zeroed), packets)
        )
        pos = end
    return pages


def write_sine_ogg(f: BinaryIO, trim: bool = True) -> OpusEncoder:
    enc = OpusEncoder()
    framer = framer_for(enc)
    writer = OggOpusWriter(f, pre_skip=enc.tail_samples, serial=0x1234)
    for p in encode_all(enc, sine(440, SOURCE_RATE, 1.0), framer=framer):
        writer.write_packet(p)
    writer.close(valid_samples48k=framer.samples_out if trim else None)
    return enc


def test_ogg_opus_file_plays_in_pyav(tmp_path: Path) -> None:
    path = tmp_path / "sine.opus"
    with path.open("wb") as f:
        write_sine_ogg(f)

    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "opus"
        frames = list(container.decode(stream))
    # ffmpeg's ogg demuxer checks page CRCs and silently drops a bad page, so a CRC
    # bug would show up here as missing audio (the page parser below checks directly).
    decoded = np.concatenate([fr.to_ndarray().reshape(-1) for fr in frames])
    assert frames[0].sample_rate == 48000
    assert abs(decoded.size / 48000 - 1.0) <= 0.025
    # pre-skip and end trim applied by the player leave exactly the input duration.
    assert decoded.size == 48000
    # A wrong pre-skip would shift the sine by hundreds of samples and ruin this (the
    # speech tuning keeps 0.98 of an aligned tone; 10 samples off would leave 0.84).
    assert correlation(decoded[960:], sine(440, 48000, 1.0)[960:]) > 0.95


def test_ogg_pages_follow_rfc_7845() -> None:
    buf = io.BytesIO()
    enc = write_sine_ogg(buf)
    pages = parse_pages(buf.getvalue())

    assert all(p.crc_ok for p in pages)
    assert all(p.version == 0 and p.serial == 0x1234 for p in pages)
    assert [p.seq for p in pages] == list(range(len(pages)))

    head, tags, *audio = pages
    assert head.flags == 0x02 and head.granule == 0  # BOS
    (head_pkt,) = head.packets
    magic, ver, ch, pre_skip, rate, gain, family = struct.unpack("<8sBBHIhB", head_pkt)
    assert (magic, ver, ch, rate, gain, family) == (b"OpusHead", 1, 1, 24000, 0, 0)
    assert pre_skip == enc.tail_samples == 312

    assert tags.flags == 0 and tags.granule == 0
    (tags_pkt,) = tags.packets
    vlen = struct.unpack_from("<I", tags_pkt, 8)[0]
    assert tags_pkt[:8] == b"OpusTags" and tags_pkt[12 : 12 + vlen] == b"voiceagent"

    assert sum(len(p.packets) for p in audio) == 51
    assert [p.flags for p in audio] == [0] * (len(audio) - 1) + [0x04]  # EOS on last only
    granules = [p.granule for p in audio]
    counts = itertools.accumulate(len(p.packets) for p in audio)
    # Every page but the last ends on a whole number of 960-sample packets...
    assert granules[:-1] == [960 * n for n in counts][:-1]
    # ...and the last is trimmed to pre-skip + the real audio length.
    assert granules[-1] == 312 + 48000


def test_ogg_without_trim_ends_at_packet_total_and_rejects_bad_trim() -> None:
    buf = io.BytesIO()
    write_sine_ogg(buf, trim=False)
    assert parse_pages(buf.getvalue())[-1].granule == 51 * 960

    w = OggOpusWriter(io.BytesIO(), pre_skip=312)
    for _ in range(20):
        w.write_packet(b"\xfc\xff\xfe")  # any bytes: the muxer does not parse packets
    with pytest.raises(ValueError, match="end granule"):
        w.close(valid_samples48k=0)  # would cut into pages already written


# --- WAV ---------------------------------------------------------------------


def test_write_wav_reads_back(tmp_path: Path) -> None:
    x = sine(440, 16000, 0.5)
    path = tmp_path / "out.wav"
    write_wav(path, x, 16000)

    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        assert w.getnframes() == x.size
        y = np.frombuffer(w.readframes(x.size), dtype="<i2")
    np.testing.assert_allclose(y / 32767, x, atol=1 / 32767)

    buf = io.BytesIO()
    write_wav(buf, x, 16000)
    assert buf.getvalue() == path.read_bytes()


def test_loudness_maps_minus_60_to_0_dbfs_onto_0_to_1() -> None:
    t = np.arange(960) / 48000
    sine = np.sin(2 * np.pi * 440 * t).astype(np.float32)  # RMS 1/sqrt(2): -3 dBFS
    assert loudness(np.zeros(960, np.float32)) == 0.0
    assert loudness(sine) == pytest.approx(1 - 3.01 / 60, abs=1e-3)
    assert loudness(sine * 10 ** (-27 / 20)) == pytest.approx(0.5, abs=1e-3)  # -30 dBFS
    assert loudness(sine * 1e-4) == 0.0  # below the floor
    assert loudness(np.ones(10, np.float32) * 4) == 1.0  # clipped at the top
