"""Sessions over a real WebSocket: audio, turns, deltas, roles, cancel, isolation."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import numpy as np
import opuslib
from conftest import run

from voiceagent.bench.clients import Client, connect
from voiceagent.engine.embedded import EmbeddedEngine
from voiceagent.model.checkpoint import SpeechModel
from voiceagent.model.sampling import SamplingParams
from voiceagent.pipeline.turn import FrameFormat, Turn, TurnSettings
from voiceagent.session.playout import PlayoutConfig

FAST = PlayoutConfig(lead_ms=100_000)  # no real-time pacing where timing is not the point
SENTENCE = "Your order shipped this morning."


def reference_pcm(model: SpeechModel, text: str, voice: str, seed: int) -> np.ndarray:
    """The same turn synthesized offline in this process (whole-utterance mode)."""
    engine = EmbeddedEngine(model)
    engine.start()

    async def go() -> np.ndarray:
        settings = TurnSettings(model.voices[voice], SamplingParams(seed=seed), 1.0, FrameFormat())
        turn = Turn("ref", settings, engine, streaming=False, record_pcm=True)
        turn.start()
        turn.push_text(text)
        turn.end_text()
        while await turn.output.get() is not None:
            pass
        return np.concatenate(turn.pcm or [])

    try:
        return asyncio.run(go())
    finally:
        engine.stop()


def pcm16(frames) -> np.ndarray:
    return np.concatenate([np.frombuffer(f.payload, "<i2") for f in frames]).astype(np.float32)


def test_opus_frames_decode_to_continuous_audio_of_the_right_length(make_server, tiny_model):
    server = make_server(playout=FAST)

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(voice="agent", sampling={"seed": 4})
            return await c.speak(SENTENCE)

    r = run(go())
    done = r.event("turn.done")
    assert [f.seq for f in r.frames] == list(range(len(r.frames)))
    assert [f.pts_ms for f in r.frames] == [20 * i for i in range(len(r.frames))]
    assert {f.codec for f in r.frames} == {"opus"}
    decoder = opuslib.Decoder(48000, 1)
    decoded = [np.frombuffer(decoder.decode(f.payload, 960), "<i2") for f in r.frames]
    assert all(len(d) == 960 for d in decoded)
    audio = np.concatenate(decoded).astype(np.float32) / 32768
    # Duration: the synthesized audio, plus at most the codec delay and one padded frame.
    audio_s = done["timings"]["audio_ms"] / 1000
    assert audio_s <= len(audio) / 48000 <= audio_s + 0.0065 + 0.02
    # Same sound as the offline reference (Opus is lossy: compare envelopes per 20 ms).
    ref = reference_pcm(tiny_model, SENTENCE, "agent", 4)
    ref48 = np.repeat(ref, 2)
    delay = 312  # libopus lookahead at 48 kHz
    got = audio[delay : delay + len(ref48)]
    env_ref = np.sqrt((ref48[: len(got) // 960 * 960].reshape(-1, 960) ** 2).mean(1))
    env_got = np.sqrt((got[: len(got) // 960 * 960].reshape(-1, 960) ** 2).mean(1))
    # (the tiny model speaks noise, which Opus tuned for speech high-passes and shapes:
    # 0.80 here; the same frames in reverse order: -0.08)
    assert np.corrcoef(env_ref, env_got)[0, 1] > 0.7
    # No gap: no 20 ms block of silence inside the turn.
    assert env_got[:-1].min() > 0.01


def test_pcm16_over_websocket_equals_offline_synthesis(make_server, tiny_model):
    server = make_server(playout=FAST)

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(voice="narrator", sampling={"seed": 11}, format={"codec": "pcm16"})
            return await c.speak(SENTENCE)

    r = run(go())
    got = pcm16(r.frames)
    ref = np.rint(reference_pcm(tiny_model, SENTENCE, "narrator", 11) * 32767)
    assert len(got) == -(-len(ref) // 480) * 480  # whole 20 ms frames, last one padded
    assert np.abs(got[: len(ref)] - ref).max() <= 1  # one 16-bit step
    assert not got[len(ref) :].any()


def test_eight_concurrent_sessions_each_sound_as_when_alone(make_server):
    server = make_server(playout=FAST)
    voices = ["agent", "narrator", "supervisor"]

    async def session(i: int):
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(
                voice=voices[i % 3], sampling={"seed": 100 + i}, format={"codec": "pcm16"}
            )
            return pcm16((await c.speak(f"Caller {i} asked about the invoice.")).frames)

    async def together():
        return await asyncio.gather(*(session(i) for i in range(8)))

    concurrent = run(together())
    solo = [run(session(i)) for i in range(8)]
    for a, b in zip(concurrent, solo, strict=True):
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= 1
    assert len({a.tobytes() for a in concurrent}) == 8


def test_text_deltas_start_audio_before_the_text_ends(server):
    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            for piece in ["Thanks for ", "waiting, I found ", "your booking. ", "It is for"]:
                await c.send({"type": "text.delta", "text": piece, "turn_id": "llm-1"})
            first = await asyncio.wait_for(ws.recv(), 10)
            while isinstance(first, str):  # turn.started, turn.first_audio
                first = await asyncio.wait_for(ws.recv(), 10)
            # Audio is flowing although the text is still open.
            await c.send({"type": "text.delta", "text": " two people.", "turn_id": "llm-1"})
            await c.send({"type": "text.end", "turn_id": "llm-1"})
            r = await c.turn()
            return r

    r = run(go())
    assert r.event("turn.done")["turn_id"] == "llm-1"


def test_turns_play_in_order_and_roles_switch_between_turns(make_server):
    server = make_server(playout=FAST)

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(voice="agent")
            await c.send({"type": "speak", "text": "First turn."})
            await c.send({"type": "speak", "text": "Second turn.", "voice": "supervisor"})
            first = await c.turn()
            second = await c.turn()
            await c.send({"type": "session.update", "voice": "narrator"})
            updated = await c.event()
            third = await c.speak("Third turn.")
            return first, second, updated, third

    first, second, updated, third = run(go())
    assert first.event("turn.started")["voice"] == "agent"
    assert first.event("turn.done")["turn"] == 1
    assert {f.turn for f in first.frames} == {1}
    # Turn 2 was queued behind turn 1 and played after it, with its own voice.
    started2 = [e for e in first.events if e["type"] == "turn.started" and e["turn"] == 2]
    assert started2 and started2[0]["voice"] == "supervisor" and started2[0]["queued"]
    assert {f.turn for f in second.frames} == {2}
    assert updated["settings"]["voice"] == "narrator"
    assert third.event("turn.started")["voice"] == "narrator"


def test_cancel_stops_audio_at_once_and_frees_the_turn(make_server):
    server = make_server()  # real-time pacing, 200 ms lead

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(format={"codec": "pcm16"})
            await c.send({"type": "speak", "text": "This is a long answer. " * 6, "turn_id": "a"})
            received = 0
            while received < 25:  # about 0.5 s of audio into the turn
                if isinstance(await ws.recv(), bytes):
                    received += 1
            await c.send({"type": "cancel"})
            frames_before_event = received
            while True:
                msg = await asyncio.wait_for(ws.recv(), 5)
                if isinstance(msg, bytes):
                    frames_before_event += 1
                    continue
                event = json.loads(msg)
                if event["type"] == "turn.cancelled":
                    break
            # Nothing of the cancelled turn may follow its cancelled event.
            late = []
            try:
                while True:
                    late.append(await asyncio.wait_for(ws.recv(), 0.5))
            except TimeoutError:
                pass
            t0 = time.monotonic()
            after = await c.speak("Still here.")
            return event, received, frames_before_event, late, after, time.monotonic() - t0

    event, received, total, late, after, _ = run(go())
    assert event["turn_id"] == "a"
    assert event["sent_ms"] == 20 * total  # the client got exactly what the server counted
    # stopped within what was already on its way: at most the 200 ms sent ahead of real
    # time (a busy client reads late, so all of it may still be in its socket)
    assert total - received <= 200 // 20 + 2
    assert late == []
    assert after.event("turn.done")["turn"] == 2
    assert server.engine.lm.load == 0  # the LM request was dropped with the turn


def test_cancel_of_a_queued_turn_leaves_the_playing_one_alone(make_server):
    server = make_server(playout=FAST)

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "speak", "text": "Playing turn.", "turn_id": "p"})
            await c.send({"type": "speak", "text": "Queued turn.", "turn_id": "q"})
            await c.send({"type": "cancel", "turn_id": "q"})
            return await c.turn(until=("turn.done",))

    r = run(go())
    cancelled = r.event("turn.cancelled")
    assert cancelled["turn_id"] == "q" and cancelled["sent_ms"] == 0
    assert r.event("turn.done")["turn_id"] == "p"
    assert {f.turn for f in r.frames} == {1}


def test_a_format_update_leaves_the_playing_turn_in_its_own_framing(make_server):
    """A turn copies `format` when it opens. What was seen: a `framing` changed while it
    played switched its frames from headers to raw mid-turn (or sent Opus in Twilio
    messages), where only the next turn should change."""
    server = make_server(playout=PlayoutConfig(lead_ms=100_000))
    text = "Let me read the full terms and conditions to you now. " * 2

    async def go() -> tuple[list[int], list[int]]:
        async with connect(server.url) as ws:
            await ws.send(json.dumps({"type": "session.start", "format": {"codec": "pcm16"}}))
            await ws.recv()
            sizes: dict[str, list[int]] = {"a": [], "b": []}
            for turn in ("a", "b"):
                await ws.send(json.dumps({"type": "speak", "turn_id": turn, "text": text}))
                while True:
                    message = await asyncio.wait_for(ws.recv(), 60)
                    if isinstance(message, bytes):
                        sizes[turn].append(len(message))
                        if turn == "a" and len(sizes["a"]) == 5:
                            update = {"type": "session.update", "format": {"framing": "raw"}}
                            await ws.send(json.dumps(update))
                    elif json.loads(message)["type"] == "turn.done":
                        break
            return sizes["a"], sizes["b"]

    a, b = run(go())
    samples = 24000 * 20 // 1000  # 20 ms of pcm16 at 24 kHz: 960 bytes
    assert set(a) == {2 * samples + 16}, set(a)  # the header, all through turn a
    assert set(b) == {2 * samples}  # raw from the next turn on


def test_health_reports_sessions(server):
    async def go():
        async with connect(server.url) as ws:
            await Client(ws).start()
            with urllib.request.urlopen(server.http + "/health") as resp:
                return json.loads(resp.read())

    health = run(go())
    assert health["ready"] is True and health["sessions"] == 1


def test_a_long_session_keeps_nothing_of_its_finished_turns_framing(server):
    # What was seen: each turn that sent audio (in header or raw framing) left its framing
    # behind in the transport, one entry a turn for the whole session.
    async def go() -> int:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            for framing in ("header", "raw", "header"):
                await c.send({"type": "session.update", "format": {"framing": framing}})
                assert (await c.event())["type"] == "session.updated"
                await c.send({"type": "speak", "text": "Hi there."})
                while not (isinstance(m := await ws.recv(), str) and '"turn.done"' in m):
                    pass
            await c.send({"type": "speak", "text": "A longer sentence that is cut off."})
            while not isinstance(await ws.recv(), bytes):
                pass
            await c.send({"type": "cancel"})
            await c.turn(until=("turn.cancelled",))
            [runner] = server.voice_server.admission.runners
            return len(runner.transport._framing)

    assert run(go()) == 0
