"""Isolation, bit for bit: a session's audio does not depend on what runs beside it.

The same turn (voice, seed, text) goes to a real server over a real WebSocket as PCM16,
alone, beside 7 other sessions, and beside a session that is cancelled mid-turn; its
samples must be identical, not merely within a tolerance. The LM tokens of the turn are
recorded on the server side and must be identical too.

What is exact and what is not (measured, see docs/architecture.md#session-isolation):
the acoustic stage runs each turn's chunk alone by default (`engine.acoustic_batching =
"invariant"`), so a turn's audio is a function of its own tokens only. The LM decodes all
turns in one batch; its logits differ from a solo decode in the last bits (batched vs
single-row matrix products), which has not changed a sampled token in any measured run,
so the test checks the tokens as well.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from conftest import run

from voiceagent.bench.clients import Client, connect
from voiceagent.engine.acoustic import AcousticWorker, ChunkResult
from voiceagent.engine.lm_engine import EmbeddedLM, TokenStream
from voiceagent.model.contract import PAD_TOKEN, Voice
from voiceagent.model.sampling import SamplingParams
from voiceagent.model.speech_model import SpeechModel
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.session.playout import PlayoutConfig

FAST = PlayoutConfig(lead_ms=100_000)  # no real-time pacing: the samples are the point
VOICES = ("agent", "narrator", "supervisor")


@dataclass(frozen=True)
class Speaker:
    voice: str
    seed: int
    text: str


TARGET = Speaker(
    "narrator",
    11,
    "Thanks for calling. Your order shipped this morning and should arrive on Thursday.",
)
NEIGHBOURS = [
    Speaker(VOICES[i % 3], 100 + i, f"Caller {i} asked about the invoice for March.")
    for i in range(7)
]
CANCELLED = Speaker("agent", 7, "This is a long answer that nobody will hear the end of. " * 4)


class RecordingLM(EmbeddedLM):
    """The embedded LM, recording the tokens of every request by (voice, seed, text)."""

    def __init__(self, model: SpeechModel) -> None:
        super().__init__(model)
        self.tokens: dict[tuple[str, int, tuple[int, ...]], list[list[int]]] = {}

    def generate(
        self,
        text_ids: list[int],
        voice: Voice,
        params: SamplingParams,
        gen: torch.Generator,
        min_len: int,
        max_len: int,
    ) -> TokenStream:
        stream = super().generate(text_ids, voice, params, gen, min_len, max_len)
        produced: list[int] = []
        self.tokens.setdefault((voice.name, params.seed, tuple(text_ids)), []).append(produced)
        feed = stream.feed

        def recording(item: list[int] | BaseException | None) -> None:
            if isinstance(item, list):
                produced.extend(item)
            feed(item)

        stream.feed = recording  # type: ignore[method-assign]
        return stream

    def of(self, speaker: Speaker) -> list[list[list[int]]]:
        """`speaker`'s tokens: for each segment of its text, those of every run so far."""
        return [
            runs
            for (voice, seed, _), runs in self.tokens.items()
            if (voice, seed) == (speaker.voice, speaker.seed)
        ]


@pytest.fixture
def recording_server(tiny_model: SpeechModel) -> Iterator[BackgroundServer]:
    lm = RecordingLM(tiny_model)
    with BackgroundServer(tiny_model, ServerConfig(port=free_port(), playout=FAST), lm) as s:
        yield s


def samples(frames: list[Any]) -> np.ndarray:
    return np.concatenate([np.frombuffer(f.payload, "<i2") for f in frames])


async def speak(url: str, who: Speaker) -> tuple[np.ndarray, float]:
    """One turn in a session of its own: its PCM16 samples, and when turn.done came."""
    frames, done_at = await speak_frames(url, who, "pcm16")
    return samples(frames), done_at


async def speak_frames(url: str, who: Speaker, codec: str) -> tuple[list[Any], float]:
    """One turn in a session of its own: its binary frames, and when turn.done came."""
    async with connect(url) as ws:
        c = Client(ws)
        await c.start(voice=who.voice, sampling={"seed": who.seed}, format={"codec": codec})
        result = await c.speak(who.text)
        result.event("turn.done")
        return result.frames, asyncio.get_running_loop().time()


async def speak_and_cancel(url: str, who: Speaker, after_frames: int) -> tuple[dict, float]:
    """A turn cancelled after `after_frames` frames: its turn.cancelled, and when."""
    async with connect(url) as ws:
        c = Client(ws)
        await c.start(voice=who.voice, sampling={"seed": who.seed}, format={"codec": "pcm16"})
        await c.send({"type": "speak", "text": who.text, "turn_id": "doomed"})
        received = 0
        while received < after_frames:
            if isinstance(await ws.recv(), bytes):
                received += 1
        await c.send({"type": "cancel", "turn_id": "doomed"})
        while True:
            msg = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(msg, str) and json.loads(msg)["type"] == "turn.cancelled":
                return json.loads(msg), asyncio.get_running_loop().time()


def differing(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f"lengths {a.shape} vs {b.shape}"
    diff = np.abs(a.astype(np.int32) - b.astype(np.int32))
    return f"{int((diff > 0).sum())} of {a.size} samples differ, by up to {int(diff.max())}"


def test_a_turn_sounds_the_same_bit_for_bit_whatever_runs_beside_it(recording_server):
    server, lm = recording_server, recording_server.engine.lm
    assert isinstance(lm, RecordingLM)
    url = server.url
    worker = server.engine.acoustic

    alone, _ = run(speak(url, TARGET))
    segments = lm.of(TARGET)
    assert len(segments) == 2 and all(runs[0] for runs in segments)  # two sentences
    assert np.abs(alone).max() > 1000  # not trivially equal silence

    async def beside_seven() -> np.ndarray:
        results = await asyncio.gather(*(speak(url, w) for w in [TARGET, *NEIGHBOURS]))
        return results[0][0]

    together_before = worker.max_round
    beside = run(beside_seven())
    # The neighbours' chunks were waiting with the target's: a batching worker would have
    # run them as one batch.
    assert worker.max_round >= 4 > together_before

    async def beside_a_cancel() -> tuple[np.ndarray, float, dict, float]:
        (pcm, done_at), (cancelled, cancelled_at) = await asyncio.gather(
            speak(url, TARGET), speak_and_cancel(url, CANCELLED, after_frames=10)
        )
        return pcm, done_at, cancelled, cancelled_at

    with_cancel, done_at, cancelled, cancelled_at = run(beside_a_cancel())
    assert cancelled["sent_ms"] > 0 and cancelled_at < done_at  # cancelled mid-turn, mid-target
    again, _ = run(speak(url, TARGET))  # and once more alone, after all that

    got = {"beside 7 sessions": beside, "beside a cancel": with_cancel, "alone again": again}
    differs = {
        k: differing(pcm, alone) for k, pcm in got.items() if pcm.tobytes() != alone.tobytes()
    }
    assert not differs
    for runs in lm.of(TARGET):  # each segment's tokens, in all four runs
        assert len(runs) == 4 and all(tokens == runs[0] for tokens in runs)


def test_opus_packets_are_identical_too(recording_server):
    """The encoder (resampler, Opus) is the session's own: same samples, same packets."""
    url = recording_server.url

    async def opus(who: Speaker) -> list[bytes]:
        return [f.payload for f in (await speak_frames(url, who, "opus"))[0]]

    async def beside_seven() -> list[bytes]:
        return (await asyncio.gather(opus(TARGET), *(speak(url, w) for w in NEIGHBOURS)))[0]

    alone = run(opus(TARGET))
    assert run(beside_seven()) == alone


def test_batched_acoustic_mode_stays_within_one_16_bit_step(tiny_model):
    """`acoustic_batching = "batched"`: the tolerance the docs state for it."""
    config = ServerConfig(port=free_port(), playout=FAST)
    with BackgroundServer(tiny_model, config, acoustic_batching="batched") as server:
        alone, _ = run(speak(server.url, TARGET))

        async def beside_seven() -> np.ndarray:
            results = await asyncio.gather(*(speak(server.url, w) for w in [TARGET, *NEIGHBOURS]))
            return results[0][0]

        beside = run(beside_seven())
        assert server.engine.acoustic.batched_calls > 0  # chunks of several turns ran together
    assert beside.shape == alone.shape
    assert np.abs(beside.astype(np.int32) - alone.astype(np.int32)).max() <= 1


# -- the acoustic worker on its own ------------------------------------------------------


def turn_tokens(model: SpeechModel, seed: int, sizes: tuple[int, ...]) -> list[list[int]]:
    """A turn's chunks as the worker gets them: tokens, each with its lookahead."""
    look = model.pre_lookahead
    tokens = torch.randint(0, 6561, (sum(sizes),), generator=torch.Generator().manual_seed(seed))
    chunks, i = [], 0
    for n in sizes:
        ahead = tokens[i + n : i + n + look].tolist()
        chunks.append(tokens[i : i + n].tolist() + ahead + [PAD_TOKEN] * (look - len(ahead)))
        i += n
    return chunks


def synthesize_rounds(
    model: SpeechModel,
    voices: list[Voice],
    chunks: list[list[list[int]]],
    batching: str = "invariant",
) -> list[list[ChunkResult | BaseException]]:
    """Each turn's chunk k, for every k: all turns' chunks queued before a worker starts,
    so they are taken together (the batch a busy server would form). A turn whose chunk
    failed sends no more."""
    streams = [AcousticWorker(model).new_stream(v, 1.0, None) for v in voices]
    results: list[list[ChunkResult | BaseException]] = [[] for _ in voices]

    async def one_round(k: int) -> None:
        worker = AcousticWorker(model, batching=batching)  # type: ignore[arg-type]
        live = [i for i, r in enumerate(results) if not r or not isinstance(r[-1], Exception)]
        final = k == len(chunks[0]) - 1
        tasks = [
            asyncio.ensure_future(worker.synthesize(streams[i], chunks[i][k], final)) for i in live
        ]
        await asyncio.sleep(0.05)  # every job is in the queue
        worker.start()
        try:
            done = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            worker.stop()
        assert worker.rounds == 1 and worker.max_round == len(live)
        for i, r in zip(live, done, strict=True):
            results[i].append(r)

    for k in range(len(chunks[0])):
        run(one_round(k))
    return results


def pcm_of(results: list[ChunkResult | BaseException]) -> np.ndarray:
    assert all(isinstance(r, ChunkResult) for r in results), results
    return np.concatenate([r.pcm for r in results if isinstance(r, ChunkResult)])


@pytest.mark.parametrize("batching", ["invariant", "batched"])
def test_a_chunk_that_fails_fails_only_its_own_turn(tiny_model, batching):
    agent, narrator = tiny_model.voices["agent"], tiny_model.voices["narrator"]
    broken = Voice("broken", (), (), torch.zeros(3))  # a speaker vector of the wrong size
    sizes = (4, 8, 8)
    chunks = [turn_tokens(tiny_model, seed, sizes) for seed in (1, 2, 3)]
    together = synthesize_rounds(tiny_model, [agent, broken, narrator], chunks, batching)
    assert len(together[1]) == 1 and isinstance(together[1][0], RuntimeError)
    solo_agent = synthesize_rounds(tiny_model, [agent], chunks[:1])[0]
    solo_narrator = synthesize_rounds(tiny_model, [narrator], chunks[2:])[0]
    for got, solo in ((together[0], solo_agent), (together[2], solo_narrator)):
        a, b = pcm_of(got), pcm_of(solo)
        if batching == "invariant":
            assert a.tobytes() == b.tobytes()
        else:  # after the failed batch, the next chunks of the two still run as one batch
            assert a.shape == b.shape and np.abs(a - b).max() < 1e-5


def test_a_turn_alone_computes_the_same_bits_in_every_run(tiny_model):
    """The same single-turn computation, run again (other allocations in between, a new
    worker thread, other turns' chunks around it) gives the same bits; what does change
    them is the number of torch threads (see docs/architecture.md#session-isolation), and
    one server runs with one number throughout."""
    agent = tiny_model.voices["agent"]
    sizes = (4, 8, 16, 25, 25)
    mine = turn_tokens(tiny_model, 7, sizes)
    first = pcm_of(synthesize_rounds(tiny_model, [agent], [mine])[0])
    clutter = [torch.empty(n * 17 + 1) for n in range(50)]  # shift where tensors land
    second = pcm_of(synthesize_rounds(tiny_model, [agent], [mine])[0])
    del clutter
    others = [turn_tokens(tiny_model, seed, sizes) for seed in range(8, 15)]
    voices = [tiny_model.voices[VOICES[i % 3]] for i in range(7)]
    among = synthesize_rounds(
        tiny_model, [*voices[:3], agent, *voices[3:]], [*others[:3], mine, *others[3:]]
    )
    third = pcm_of(among[3])
    assert second.tobytes() == first.tobytes()
    assert third.tobytes() == first.tobytes()
    assert np.abs(first).max() > 0.05
