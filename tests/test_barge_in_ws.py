"""Barge-in on a WebSocket session: the client streams its microphone (PCM16) up; real
speech (espeak-ng) over the bot's turn cancels it and reports what was heard."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
from conftest import run

from voiceagent.bench.clients import Client, connect
from voiceagent.bench.clips import espeak_pcm, have_espeak

pytestmark = pytest.mark.skipif(
    not have_espeak(),
    reason="espeak-ng is not installed (apt-get install espeak-ng)",
)


def speech_16k(tmp_path) -> bytes:
    out, _ = espeak_pcm("Wait, stop, I have a question.", 16000)
    return (np.clip(out, -1, 1) * 32767).astype("<i2").tobytes()


def run_session(server, mic: bytes, mode: str):
    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(
                format={"codec": "pcm16"},
                input={"sample_rate": 16000},
                barge_in={"mode": mode, "guard_ms": 300},
            )
            await c.send({"type": "speak", "text": "Here is a long answer. " * 8, "turn_id": "a"})
            frames, events = 0, []
            while frames == 0:
                msg = await ws.recv()
                frames += isinstance(msg, bytes)
            await asyncio.sleep(0.6)  # the listener has heard more than the guard
            silence = bytes(16000 // 50 * 2 * 10)  # 200 ms
            t_sent = time.monotonic()
            for i in range(0, len(silence + mic), 640):  # 20 ms messages
                await ws.send((silence + mic)[i : i + 640])
            cancelled_at = None
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                try:
                    msg = await asyncio.wait_for(ws.recv(), 0.5)
                except TimeoutError:
                    break
                if isinstance(msg, bytes):
                    frames += 1
                    assert cancelled_at is None, "audio after turn.cancelled"
                    continue
                event = json.loads(msg)
                events.append(event)
                if event["type"] == "turn.cancelled":
                    cancelled_at = time.monotonic() - t_sent
            return events, frames, cancelled_at

    return run(go())


def test_speaking_over_the_bot_cancels_its_turn(make_server, tmp_path):
    server = make_server()
    events, frames, cancelled_after = run_session(server, speech_16k(tmp_path), "cancel")
    kinds = [e["type"] for e in events]
    assert "speech_started" in kinds and "turn.cancelled" in kinds
    assert kinds.index("speech_started") < kinds.index("turn.cancelled")
    cancelled = next(e for e in events if e["type"] == "turn.cancelled")
    assert cancelled["reason"] == "barge_in" and cancelled["turn_id"] == "a"
    assert 300 <= cancelled["played_ms"] <= cancelled["sent_ms"] == 20 * frames
    assert cancelled_after is not None and cancelled_after < 1.0
    # operators see it (What was seen: the counter stayed at zero through every barge-in)
    page = httpx.get(f"{server.http}/metrics").text
    assert 'voiceagent_barge_ins_total{transport="websocket"} 1.0' in page


def test_with_barge_in_off_speech_is_reported_and_the_turn_plays_on(make_server, tmp_path):
    events, _, cancelled_after = run_session(make_server(), speech_16k(tmp_path), "off")
    kinds = [e["type"] for e in events]
    assert "speech_started" in kinds and "turn.cancelled" not in kinds
    assert cancelled_after is None


def test_in_duck_mode_the_bot_gets_quieter_while_the_person_speaks(make_server, tmp_path):
    mic = speech_16k(tmp_path)

    async def go() -> list[dict]:
        async with connect(make_server().url) as ws:
            c = Client(ws)
            await c.start(
                format={"codec": "pcm16"},
                input={"sample_rate": 16000},
                barge_in={"mode": "duck", "guard_ms": 300, "duck_gain": 0.25},
            )
            await c.send({"type": "speak", "text": "Here is a long answer. " * 8})
            events: list[dict] = []

            async def listen() -> None:
                async for msg in ws:
                    if isinstance(msg, str):
                        events.append(json.loads(msg))

            listener = asyncio.get_running_loop().create_task(listen())
            await asyncio.sleep(1.0)
            for i in range(0, len(mic), 640):  # the person speaks, in real time
                await ws.send(mic[i : i + 640])
                await asyncio.sleep(0.02)
            for _ in range(40):  # then silence, until the VAD hears the end
                await ws.send(bytes(640))
                await asyncio.sleep(0.02)
            listener.cancel()
            return events

    events = run(go())
    kinds = [e["type"] for e in events]
    assert "turn.cancelled" not in kinds  # ducking never stops the turn
    ducked, unducked = kinds.index("audio.ducked"), kinds.index("audio.unducked")
    assert kinds.index("speech_started") < ducked < kinds.index("speech_stopped") < unducked
    assert events[ducked]["gain"] == 0.25

    def mean_level(batches: list[dict]) -> float:
        values = [x for e in batches if e["type"] == "audio.levels" for x in e["levels"]]
        assert values
        return float(np.mean(values))

    # Levels describe frames as sent: 0.25 is -12 dB, 0.2 on the 60 dB level scale.
    # The first batch after each switch may hold frames from before it.
    before = mean_level(events[:ducked])
    during = mean_level([e for e in events[ducked:unducked] if e["type"] == "audio.levels"][1:])
    assert before - during == pytest.approx(0.2, abs=0.05)


def talk_from_the_first_frame(server, mic: bytes, guard_ms: int = 300) -> list[dict]:
    """The person speaks (in real time) from the moment the bot's first frame arrives,
    then is silent: the onset falls inside the guard."""

    async def go() -> list[dict]:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(
                format={"codec": "pcm16"},
                input={"sample_rate": 16000},
                barge_in={"mode": "cancel", "guard_ms": guard_ms},
            )
            await c.send({"type": "speak", "text": "Here is a long answer. " * 8, "turn_id": "a"})
            events: list[dict] = []

            async def listen() -> None:
                async for msg in ws:
                    if isinstance(msg, str):
                        events.append(json.loads(msg))

            while not isinstance(await ws.recv(), bytes):
                pass
            listener = asyncio.get_running_loop().create_task(listen())
            for i in range(0, len(mic), 640):
                await ws.send(mic[i : i + 640])
                await asyncio.sleep(0.02)
            for _ in range(50):  # a second of silence
                await ws.send(bytes(640))
                await asyncio.sleep(0.02)
            listener.cancel()
            return events

    return run(go())


def test_speech_that_begins_inside_the_guard_and_goes_on_barges_in(make_server, tmp_path):
    # What was seen: a person who spoke up as the bot began was never heard as a barge-in
    # (the onset fell inside the guard, and no second onset came), so the bot talked on.
    events = talk_from_the_first_frame(make_server(), speech_16k(tmp_path))
    kinds = [e["type"] for e in events]
    assert "speech_started" in kinds and "turn.cancelled" in kinds, kinds
    assert kinds.index("speech_started") < kinds.index("turn.cancelled")
    cancelled = next(e for e in events if e["type"] == "turn.cancelled")
    assert cancelled["reason"] == "barge_in" and cancelled["played_ms"] >= 300


def test_a_burst_inside_the_guard_alone_is_an_echo_and_the_turn_plays_on(make_server, tmp_path):
    burst = speech_16k(tmp_path)[: 16000 * 2 * 200 // 1000]  # its first 200 ms
    # 500 ms: the speech is still "on" then (its 300 ms hangover), so only the voiced
    # audio past the guard tells it from a barge-in; and a busy machine that delays the
    # burst by up to ~300 ms does not push 120 ms of it past the guard
    events = talk_from_the_first_frame(make_server(), burst, guard_ms=500)
    kinds = [e["type"] for e in events]
    assert "speech_started" in kinds and "turn.cancelled" not in kinds, kinds
