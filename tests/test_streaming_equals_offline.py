"""Streamed audio equals one offline pass over the same tokens, seams included.

Tolerance: 1e-5 absolute on float PCM in [-1, 1] (float32 rounding of batched vs.
unbatched convolutions; 1e-5 is a third of one 16-bit step).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from voiceagent.engine.embedded import EmbeddedEngine
from voiceagent.model import checkpoint
from voiceagent.model.contract import PAD_TOKEN
from voiceagent.model.cosyvoice2.random_checkpoint import write_random_cosyvoice2
from voiceagent.model.sampling import SamplingParams
from voiceagent.model.speech_model import SpeechModel
from voiceagent.model.stretch import MelStretcher
from voiceagent.pipeline.turn import FrameFormat, Turn, TurnFailed, TurnSettings
from voiceagent.text.timing import SpokenSegment

TOL = 1e-5


def stream_tokens(model: SpeechModel, tokens: list[int], sizes: list[int], speed: float):
    """Feed `tokens` chunk by chunk (each with its lookahead) through flow and vocoder."""
    voice = model.voices["agent"]
    look = model.pre_lookahead
    flow_state, voc_state = model.flow.initial_state(voice), model.vocoder.initial_state()
    stretcher = MelStretcher(speed)
    out, i, k = [], 0, 0
    while i < len(tokens):
        n = sizes[min(k, len(sizes) - 1)]
        chunk = tokens[i : i + n]
        i, k = i + len(chunk), k + 1
        ahead = tokens[i : i + look]
        ids = torch.tensor([chunk + ahead + [PAD_TOKEN] * (look - len(ahead))])
        mel, flow_state = model.flow.forward_chunk(ids, voice.embedding[None], flow_state)
        mel = stretcher.push(mel[0], final=i >= len(tokens))[None]
        pcm, voc_state = model.vocoder.forward_chunk(mel, voc_state, final=i >= len(tokens))
        out.append(pcm[0].numpy())
    return np.concatenate(out)


@pytest.mark.parametrize("sizes", [[1], [4, 8, 16, 25], [7], [25]])
@pytest.mark.parametrize("speed", [1.0, 0.8, 1.25])
def test_chunked_stages_equal_one_offline_pass(tiny_model, sizes, speed):
    tokens = torch.randint(0, 6561, (61,), generator=torch.Generator().manual_seed(3)).tolist()
    offline = tiny_model.synthesize_offline(tokens, tiny_model.voices["agent"], speed)
    streamed = stream_tokens(tiny_model, tokens, sizes, speed)
    assert streamed.shape == offline.shape
    assert np.abs(streamed - offline).max() < TOL
    assert np.abs(offline).max() > 0.05  # not trivially equal silence


def test_streaming_state_has_constant_size(tiny_model):
    """Chunk cost does not grow with position: the carried state never grows."""
    voice = tiny_model.voices["agent"]
    state = tiny_model.flow.initial_state(voice)
    shapes = {k: v.shape for k, v in state.items()}
    for _ in range(20):
        ids = torch.randint(0, 6561, (1, 8 + tiny_model.pre_lookahead))
        _, state = tiny_model.flow.forward_chunk(ids, voice.embedding[None], state)
    assert {k: v.shape for k, v in state.items()} == shapes
    assert int(state["frame"]) == 20 * 8 * 2


async def _run_turn(
    engine: EmbeddedEngine,
    text: str,
    seed: int,
    voice: str = "agent",
    speed: float = 1.0,
) -> Turn:
    settings = TurnSettings(
        engine.model.voices[voice], SamplingParams(seed=seed), speed, FrameFormat(24000)
    )
    turn = Turn("t", settings, engine, record_pcm=True)
    turn.start()
    turn.push_text(text)
    turn.end_text()
    while (item := await turn.output.get()) is not None:
        assert not isinstance(item, TurnFailed), item
    return turn


@pytest.mark.parametrize("speed", [1.0, 1.3])
def test_turn_streamed_through_engine_equals_offline(tiny_model, speed):
    engine = EmbeddedEngine(tiny_model)
    engine.start()
    try:
        turn = asyncio.run(
            _run_turn(engine, "A single sentence for the equality check.", 5, speed=speed)
        )
    finally:
        engine.stop()
    assert turn.stats.chunks >= 4  # really streamed in several chunks
    streamed = np.concatenate(turn.pcm or [])
    offline = tiny_model.synthesize_offline(turn.tokens, tiny_model.voices["agent"], speed)
    assert streamed.shape == offline.shape
    assert np.abs(streamed - offline).max() < TOL


def test_concurrent_turns_match_solo_runs(tiny_model):
    """8 turns with different voices and seeds, decoded in one batch, give the same tokens
    as each alone, and audio within TOL."""
    voices = ["agent", "narrator", "supervisor"]
    jobs = [(f"Session {i} says something different.", i, voices[i % 3]) for i in range(8)]
    engine = EmbeddedEngine(tiny_model)
    engine.start()

    async def together():
        return await asyncio.gather(*(_run_turn(engine, t, s, v) for t, s, v in jobs))

    async def alone():
        return [await _run_turn(engine, t, s, v) for t, s, v in jobs]

    try:
        steps0 = engine.lm.steps
        concurrent = asyncio.run(together())
        batched_steps = engine.lm.steps - steps0
        solo = asyncio.run(alone())
    finally:
        engine.stop()
    total_tokens = sum(len(t.tokens) for t in concurrent)
    assert batched_steps < total_tokens / 2  # decode steps were shared (batched)
    for a, b in zip(concurrent, solo, strict=True):
        assert a.tokens == b.tokens
        pa, pb = np.concatenate(a.pcm or []), np.concatenate(b.pcm or [])
        assert pa.shape == pb.shape
        assert np.abs(pa - pb).max() < TOL
    assert len({tuple(t.tokens) for t in solo}) == len(solo)  # sessions really differ


def test_a_segment_never_speaks_past_the_ceiling(tiny_model):
    engine = EmbeddedEngine(tiny_model)
    engine.start()

    async def go() -> Turn:
        settings = TurnSettings(tiny_model.voices["agent"], SamplingParams(seed=1), 1.0)
        turn = Turn("t", settings, engine, max_segment_tokens=6)
        turn.start()
        turn.push_text("A sentence that would speak for a good while.")
        turn.end_text()
        while await turn.output.get() is not None:
            pass
        return turn

    try:
        turn = asyncio.run(go())
    finally:
        engine.stop()
    assert len(turn.tokens) == 6


def test_a_turn_synthesizes_only_a_bounded_lead_ahead_of_its_consumer(tiny_model):
    """With `max_output_frames`, a turn nobody reads stops after that much audio (the
    acoustic work waits, and its LM request sits out once its unread tokens pile up);
    read out, it is the same audio as without the bound."""
    engine = EmbeddedEngine(tiny_model)
    engine.start()
    text = "A long answer that goes on and on and on. " * 3
    lm_while_stalled: list[tuple[int, int]] = []  # (live requests, decode steps)
    stalled_s: list[float] = []  # from the bound reached to reading again

    async def go(bound: int) -> tuple[Turn, int, int]:
        settings = TurnSettings(
            tiny_model.voices["agent"], SamplingParams(seed=2), 1.0, FrameFormat(24000)
        )
        turn = Turn("t", settings, engine, record_pcm=True, max_output_frames=bound)
        turn.start()
        turn.push_text(text)
        turn.end_text()
        if bound:  # the consumer is not reading: wait (on events, not a fixed time) ...
            deadline = time.monotonic() + 60
            while not turn.output.full():  # ... until the turn reaches its bound,
                assert time.monotonic() < deadline, "the turn never reached its bound"
                await asyncio.sleep(0.02)
            full_at = time.monotonic()
            while True:  # ... and its LM request stops decoding (50 tokens unread)
                steps = engine.lm.steps
                await asyncio.sleep(0.5)
                if engine.lm.steps == steps:
                    break
                assert time.monotonic() < deadline, "the LM kept decoding for nobody"
            lm_while_stalled.append((engine.lm.load, engine.lm.steps - steps))
            stalled_s.append(time.monotonic() - full_at)
        queued, chunks = turn.output.qsize(), turn.stats.chunks
        while await turn.output.get() is not None:
            pass
        return turn, queued, chunks

    try:
        bounded, queued, stalled_chunks = asyncio.run(go(bound=25))
        free, _, _ = asyncio.run(go(bound=0))
    finally:
        engine.stop()
    assert queued == 25  # waiting at the bound (500 ms of audio)
    # and the LM request, not finished, sits out its decode steps
    assert lm_while_stalled[0] == (1, 0)
    assert stalled_chunks < bounded.stats.chunks  # most of the work came after reading
    assert bounded.tokens == free.tokens
    pa, pb = np.concatenate(bounded.pcm or []), np.concatenate(free.pcm or [])
    assert pa.shape == pb.shape and np.abs(pa - pb).max() < TOL
    # the wait at the bound is not counted as work in the real-time factor: the turn held
    # its work for (nearly) all the time nobody read (on the turn's own clock, not against
    # another run's RTF, which a busy machine moves by more than the wait)
    st = bounded.stats
    assert st.held_s > max(0.4, stalled_s[0] - 0.3), (st.held_s, stalled_s)
    assert st.rtf is not None and st.synth_start is not None and st.last_audio is not None
    busy = st.last_audio - st.synth_start - st.held_s
    assert st.rtf == pytest.approx(busy / (st.audio_ms / 1000))


@pytest.fixture(scope="module")
def hift_model(tmp_path_factory: pytest.TempPathFactory) -> SpeechModel:
    """Random weights with CosyVoice2's HiFT, whose exact hold-back is 20 mel frames."""
    model_dir = write_random_cosyvoice2(tmp_path_factory.mktemp("cv2") / "CosyVoice2-small")
    return checkpoint.load(model_dir)


def test_a_turn_waiting_for_text_lets_out_the_audio_it_held_back(hift_model):
    # What was seen: after `text.flush`, the last 400 ms of the flushed sentence (the
    # vocoder's hold-back) came only with the next text, after the pause: the listener
    # heard the last word cut, then its end stuck to the next sentence.
    engine = EmbeddedEngine(hift_model)
    engine.start()
    spoken: list[SpokenSegment] = []

    async def on_spoken(segment: SpokenSegment) -> None:
        spoken.append(segment)

    async def take(turn: Turn, quiet_s: float) -> tuple[float, bool]:
        """Audio (ms) the consumer gets until none comes for `quiet_s`; whether it ended."""
        ms = 0.0
        while True:
            try:
                item = await asyncio.wait_for(turn.output.get(), quiet_s)
            except TimeoutError:
                return ms, False
            if item is None:
                return ms, True
            assert not isinstance(item, TurnFailed), item
            ms += len(item) / 24
        return ms, False

    async def go() -> tuple[float, Turn]:
        voice = hift_model.voices["agent"]
        settings = TurnSettings(voice, SamplingParams(seed=3), 1.0, FrameFormat(24000))
        turn = Turn(
            "t", settings, engine, record_pcm=True, max_segment_tokens=30, on_spoken=on_spoken
        )
        turn.start()
        turn.push_text("Hello there, I am checking on that order for you.")
        turn.flush_text()
        first, ended = await take(turn, 3.0)
        assert not ended
        turn.push_text("It has shipped.")
        turn.end_text()
        _, ended = await take(turn, 30.0)
        assert ended
        return first, turn

    try:
        first, turn = asyncio.run(go())
    finally:
        engine.stop()
    flushed, after = spoken[-2], spoken[-1]  # (the first segment ends at its comma)
    assert first >= flushed.end_ms  # all of the flushed sentence, before more text came
    # the next sentence starts after the silence let out with it (its words' times on
    # the audio's own timeline), and the turn's audio ends where it does
    assert engine.acoustic.pause_frames(turn._acoustic) == 20 + 2  # type: ignore[arg-type]
    assert after.start_ms == flushed.end_ms + 22 * 20
    assert sum(len(p) for p in turn.pcm or []) / 24 == after.end_ms
