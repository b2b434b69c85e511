"""Audio facts every stage shares, defined once: the model's rate, the frame duration and
what each output codec accepts."""

from __future__ import annotations

MODEL_RATE = 24000  # the vocoder's PCM
FRAME_MS = 20  # one packet on every transport (Opus, RTP, telephony)

OPUS_RATE = 48000
MULAW_RATE = 8000  # G.711 (μ-law and A-law): telephony
# Every rate of Asterisk's signed-linear formats (slin .. slin192), which a call pins, and
# 22050; soxr resamples to any of them and each has a whole number of samples per frame.
PCM16_RATES = (8000, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 96000, 192000)
CODEC_RATES: dict[str, tuple[int, ...]] = {
    "opus": (OPUS_RATE,),
    "pcm16": PCM16_RATES,
    "mulaw": (MULAW_RATE,),
    "alaw": (MULAW_RATE,),
}
DEFAULT_RATES = {"opus": OPUS_RATE, "pcm16": MODEL_RATE, "mulaw": MULAW_RATE, "alaw": MULAW_RATE}
CODECS = tuple(CODEC_RATES)
OPUS_BITRATES = (6000, 510000)  # the range a session may ask for, in bit/s
DEFAULT_OPUS_BITRATE = 32000


def frame_samples(rate: int) -> int:
    return rate * FRAME_MS // 1000
