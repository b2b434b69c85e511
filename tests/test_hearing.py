"""Tests that hear: voiceagent's own voice (the one this copy ships, voiceagent/data/voice-en)
speaks through the real server on each transport, and the real pocketsphinx transcribes
what the client received: Opus over a WebSocket, Opus over a WebRTC track (aiortc peer),
and μ-law at 8 kHz on a simulated Twilio call. A transport, codec or resampling bug that
garbles the audio fails here, as no test on the random-weight tiny model can tell.

The bound is loose: pocketsphinx is a weak recognizer and our voice is still training
(docs/training.md). The sentences are of the kinds the voice says best so far (the
corpus' templates: amounts, spelled codes, phone numbers). Each test also hears its audio
time-reversed, with the same sounds and levels but no words, and asserts that it scores
worse than the bound: the meter tells speech from garble on these very clips.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from voiceagent.bench import intelligibility
from voiceagent.bench.carriers import SimulatedTwilioCall
from voiceagent.bench.clients import Client, connect, open_peer
from voiceagent.model import checkpoint
from voiceagent.model.speech_model import SpeechModel
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.train import sizes, wer

SENTENCES = (
    "Your balance is $45.20.",
    "Your confirmation code is 7 3 9 1.",
    "Our toll free number is 1-800-555-0142.",
)
BOUND = 0.6  # pooled WER over SENTENCES; garbled audio scores about 1
# 8 kHz μ-law keeps less of the speech, and a real-time track on a busy CPU can run dry
# (measured beside two CPU hogs: WebRTC 0.625, its reversed audio 1.125)
REAL_TIME_BOUND = 0.75
SEED = 0


@pytest.fixture(scope="module")
def voice() -> SpeechModel:
    pytest.importorskip("pocketsphinx", reason="pocketsphinx (a test extra) is not installed")
    if not (checkpoint.SHIPPED_VOICE / "TRAINED").is_file():
        pytest.skip(f"this copy ships no voice of its own ({checkpoint.SHIPPED_VOICE})")
    return checkpoint.load(checkpoint.SHIPPED_VOICE)


@pytest.fixture(scope="module")
def server(voice: SpeechModel) -> Iterator[BackgroundServer]:
    with BackgroundServer(voice, ServerConfig(port=free_port())) as server:
        yield server


def heard(clips: list[tuple[np.ndarray, int]]) -> tuple[float, float]:
    """(pooled WER of the clips, of the same clips reversed) against SENTENCES."""
    pairs = list(zip(SENTENCES, clips, strict=True))
    forward = [(text, wer.transcribe(pcm, rate)) for text, (pcm, rate) in pairs]
    back = [(text, wer.transcribe(pcm[::-1].copy(), rate)) for text, (pcm, rate) in pairs]
    return wer.corpus_wer(forward), wer.corpus_wer(back)


def test_the_shipped_voice_is_small_enough_to_live_with_the_project() -> None:
    """Issue 17 asks for 50 MB at most (weights, tokenizer, dictionary and the training
    state a new machine resumes from)."""
    files = [p for p in checkpoint.SHIPPED_VOICE.rglob("*") if p.is_file()]
    assert files and sum(p.stat().st_size for p in files) <= 50e6


def test_a_session_draws_our_voices_tokens_as_its_files_say(
    voice: SpeechModel, server: BackgroundServer
) -> None:
    """Its yaml's top-k and temperature (`train.sizes.TOP_K` and `TEMPERATURE`: 5 and
    0.8, against CosyVoice2's 25 and 1.0) are what a session starts with, and says so
    in `session.created`."""

    async def created() -> dict[str, Any]:
        async with connect(server.url) as ws:
            return await Client(ws).start()

    assert (voice.sampling.temperature, voice.sampling.top_k) == (sizes.TEMPERATURE, sizes.TOP_K)
    sampling = asyncio.run(created())["settings"]["sampling"]
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"]) == (
        sizes.TEMPERATURE,
        sizes.TOP_K,
        voice.sampling.top_p,
    )


def test_our_voice_is_understood_over_a_websocket(server: BackgroundServer) -> None:
    clips = []
    for text in SENTENCES:
        _, frames = asyncio.run(intelligibility.speak(server.url, text, SEED))
        clips.append((intelligibility.decode_opus(frames), intelligibility.OPUS_RATE))
    ours, reversed_ = heard(clips)
    assert ours <= BOUND < reversed_, (ours, reversed_)


def test_our_voice_is_understood_over_webrtc(server: BackgroundServer) -> None:
    base = server.url.removesuffix("/v1/ws")

    async def one(text: str) -> np.ndarray:
        peer = await open_peer(base, keep_audio=True, offer_timeout=30, open_timeout=20)
        try:
            peer.send({"type": "session.start", "sampling": {"seed": SEED}})
            await peer.event(("session.created",), 20)
            assert peer.audio is not None
            start = len(peer.audio)
            peer.send({"type": "speak", "text": text})
            done = await peer.event(("turn.done",), 60)
            # the track plays in real time: wait for all the turn's audio, and a margin
            want = (done["sent_ms"] + 500) // 20
            for _ in range(3000):
                if len(peer.audio) - start >= want:
                    break
                await asyncio.sleep(0.01)
            return np.concatenate(peer.audio[start:])
        finally:
            await peer.close()

    clips = [(asyncio.run(one(text)), 48000) for text in SENTENCES]
    ours, reversed_ = heard(clips)
    assert ours <= REAL_TIME_BOUND < reversed_, (ours, reversed_)


def test_our_voice_is_understood_on_a_phone_call(server: BackgroundServer) -> None:
    """Twilio's μ-law at 8 kHz, as the carrier played it to the caller."""
    base = server.url.removesuffix("/v1/ws")

    async def one(text: str) -> np.ndarray:
        token = secrets.token_urlsafe(18)
        async with SimulatedTwilioCall(base + "/v1/telephony/twilio", {"token": token}) as call:
            bot = Client(await connect(base + "/v1/calls"))
            try:
                await bot.send({"type": "session.attach", "token": token})
                assert (await bot.event(30))["type"] == "session.created"
                await bot.send({"type": "session.update", "sampling": {"seed": SEED}})
                await bot.send({"type": "speak", "text": text})
                while (event := await bot.event(60))["type"] != "turn.done":
                    assert event["type"] != "error", event
                await call.wait_until(lambda: call.playout.queued_s == 0, 30)
                return call.played_pcm().astype(np.float32) / 32768
            finally:
                await bot.ws.close()

    clips = [(asyncio.run(one(text)), 8000) for text in SENTENCES]
    ours, reversed_ = heard(clips)
    assert ours <= REAL_TIME_BOUND < reversed_, (ours, reversed_)


def test_a_break_tag_is_heard_as_silence_between_words_said(server: BackgroundServer) -> None:
    """`<break time="1.5s"/>` between two sentences: 1.5 s of silence there, and the
    recognizer hears the two sentences (not "break time")."""
    text = f'{SENTENCES[0]} <break time="1.5s"/> {SENTENCES[1]}'
    _, frames = asyncio.run(intelligibility.speak(server.url, text, SEED))
    pcm = intelligibility.decode_opus(frames)
    window = intelligibility.OPUS_RATE // 50  # 20 ms
    n = len(pcm) // window
    rms = np.sqrt(np.mean(pcm[: n * window].reshape(n, window) ** 2, axis=1))
    quiet = rms < rms.max() / 100  # 40 dB under the loudest
    longest = run = 0
    for q in quiet:
        run = run + 1 if q else 0
        longest = max(longest, run)
    assert longest * 20 >= 1400, longest * 20
    said = wer.transcribe(pcm, intelligibility.OPUS_RATE)
    assert "break" not in said.split(), said
    joined = f"{SENTENCES[0]} {SENTENCES[1]}"
    assert wer.corpus_wer([(joined, said)]) <= BOUND, said
