"""The simulated carriers (bench/carriers.py) against tiny bot servers on loopback: their
messages follow each platform's schema, marks echo only once the audio before them has
played by the carrier's clock, clear flushes, the caller's audio is paced at 20 ms, and
what breaks the schema is recorded. Bounds are generous: a busy 2-core machine passes."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.server import ServerConnection, serve

from voiceagent.audio.codecs import mulaw_encode
from voiceagent.bench import phone_speech
from voiceagent.bench.carriers import (
    SimulatedTelnyxCall,
    SimulatedTwilioCall,
    SimulatedVonageCall,
)
from voiceagent.bench.playout import Playout

Script = Callable[["Bot", ServerConnection], Awaitable[None]]


class Bot:
    """A fake bot server: records what the carrier sends (with arrival times) and runs
    `script` on the connection."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.received: list[tuple[float, Any]] = []  # (time, parsed JSON or bytes)
        self.error: BaseException | None = None

    async def handler(self, ws: ServerConnection) -> None:
        script = asyncio.create_task(self.script(self, ws))
        async for msg in ws:  # until the carrier hangs up
            self.received.append(
                (time.monotonic(), json.loads(msg) if isinstance(msg, str) else msg)
            )
        if script.done() and not script.cancelled():
            self.error = script.exception()
        script.cancel()
        await asyncio.gather(script, return_exceptions=True)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [m for _, m in self.received if isinstance(m, dict) and m.get("event") == name]

    async def wait_for(self, name: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.events(name):
            assert time.monotonic() < deadline, f"no {name} from the carrier"
            await asyncio.sleep(0.01)
        return self.events(name)[0]


def run_call(make_call: Callable[[str], Any], script: Script, body: Callable[..., Any]) -> Bot:
    """Serve `script` on 127.0.0.1:0, place the call, run `body(call, bot)` in it."""

    async def main() -> Bot:
        bot = Bot(script)
        async with serve(bot.handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with make_call(f"ws://127.0.0.1:{port}/") as call:
                await body(call, bot)
        if bot.error is not None:
            raise bot.error
        return bot

    return asyncio.run(asyncio.wait_for(main(), 60))


def tone(seconds: float, rate: int = 8000, level: int = 8000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (level * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


def twilio_media(sid: str, pcm: np.ndarray) -> str:
    payload = base64.b64encode(mulaw_encode(pcm).tobytes()).decode()
    return json.dumps({"event": "media", "streamSid": sid, "media": {"payload": payload}})


def twilio_mark(sid: str, name: str) -> str:
    return json.dumps({"event": "mark", "streamSid": sid, "mark": {"name": name}})


async def idle(bot: Bot, ws: ServerConnection) -> None:
    await asyncio.sleep(30)


# -- Twilio ------------------------------------------------------------------------------


def test_twilio_start_schema_and_inbound_pacing() -> None:
    async def body(call: SimulatedTwilioCall, bot: Bot) -> None:
        await asyncio.sleep(1.2)

    bot = run_call(
        lambda url: SimulatedTwilioCall(url, {"token": "t0k", "voice": "v1"}), idle, body
    )
    first, second = bot.received[0][1], bot.received[1][1]
    assert first == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    assert second["event"] == "start" and second["sequenceNumber"] == "1"
    start = second["start"]
    assert start["streamSid"] == second["streamSid"] and start["streamSid"].startswith("MZ")
    assert start["callSid"].startswith("CA") and start["accountSid"].startswith("AC")
    assert start["tracks"] == ["inbound"]
    assert start["customParameters"] == {"token": "t0k", "voice": "v1"}
    assert start["mediaFormat"] == {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
    media = [(t, m) for t, m in bot.received if isinstance(m, dict) and m["event"] == "media"]
    assert len(media) >= 30
    for _, m in media:
        assert set(m) == {"event", "sequenceNumber", "media", "streamSid"}
        assert set(m["media"]) == {"track", "chunk", "timestamp", "payload"}
        assert m["media"]["track"] == "inbound"
        assert len(base64.b64decode(m["media"]["payload"])) == 160
    seqs = [int(m["sequenceNumber"]) for _, m in media]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert [m["media"]["chunk"] for _, m in media[:3]] == ["1", "2", "3"]
    period = (media[-1][0] - media[0][0]) / (len(media) - 1)
    assert 0.015 < period < 0.03, period  # 20 ms on average, whatever the jitter
    last = media[-1][1]["media"]
    assert int(last["timestamp"]) == (int(last["chunk"]) - 1) * 20
    assert bot.events("stop")[0]["stop"].keys() == {"accountSid", "callSid"}


def test_twilio_marks_echo_only_after_their_audio_played() -> None:
    sent: dict[str, float] = {}

    async def script(bot: Bot, ws: ServerConnection) -> None:
        sid = (await bot.wait_for("start"))["streamSid"]
        sent["early"] = time.monotonic()
        await ws.send(twilio_mark(sid, "early"))  # nothing queued: echoed at once
        await asyncio.sleep(0.2)
        sent["audio"] = time.monotonic()
        for k in range(25):  # 0.5 s in 20 ms messages, sent at once
            await ws.send(twilio_media(sid, tone(0.5)[k * 160 : (k + 1) * 160]))
        await ws.send(twilio_mark(sid, "after"))
        await asyncio.sleep(30)

    async def body(call: SimulatedTwilioCall, bot: Bot) -> None:
        await call.wait_until(lambda: len(call.marks) == 2)
        await bot.wait_for("mark")
        await asyncio.sleep(0.1)

    calls: list[SimulatedTwilioCall] = []

    def make(url: str) -> SimulatedTwilioCall:
        calls.append(SimulatedTwilioCall(url))
        return calls[0]

    bot = run_call(make, script, body)
    call = calls[0]
    early, after = call.marks
    assert (early.name, early.by, after.name, after.by) == ("early", "play", "after", "play")
    assert early.at - sent["early"] < 0.25
    audio = [p for p in call.played if p.pcm.size]
    assert sum(p.pcm.size for p in audio) == 4000
    assert after.at >= audio[-1].at + 0.02  # the last frame had finished
    assert after.at - sent["audio"] > 0.45  # 0.5 s of audio cannot play faster
    assert call.first_media_at is not None and call.first_media_at >= sent["audio"]
    echoes = bot.events("mark")
    assert [e["mark"]["name"] for e in echoes] == ["early", "after"]
    assert all(set(e) == {"event", "sequenceNumber", "streamSid", "mark"} for e in echoes)
    assert call.violations == [] and call.underruns == 0
    heard = call.played_pcm()
    assert heard.size == 4000 and np.corrcoef(heard, tone(0.5))[0, 1] > 0.95


def test_twilio_clear_flushes_audio_and_echoes_pending_marks_at_once() -> None:
    sent: dict[str, float] = {}

    async def script(bot: Bot, ws: ServerConnection) -> None:
        sid = (await bot.wait_for("start"))["streamSid"]
        await ws.send(twilio_media(sid, tone(3.0)))  # one big message: any size plays
        await ws.send(twilio_mark(sid, "a"))
        await ws.send(twilio_media(sid, tone(1.0)))
        await ws.send(twilio_mark(sid, "b"))
        await asyncio.sleep(0.5)
        sent["clear"] = time.monotonic()
        await ws.send(json.dumps({"event": "clear", "streamSid": sid}))
        await asyncio.sleep(30)

    calls: list[SimulatedTwilioCall] = []

    async def body(call: SimulatedTwilioCall, bot: Bot) -> None:
        await call.wait_until(lambda: len(call.marks) == 2)
        await asyncio.sleep(0.3)

    bot = run_call(lambda url: calls.append(SimulatedTwilioCall(url)) or calls[0], script, body)
    call = calls[0]
    assert [(m.name, m.by) for m in call.marks] == [("a", "clear"), ("b", "clear")]
    assert call.clears and all(m.at - call.clears[0] < 0.2 for m in call.marks)
    assert [e["mark"]["name"] for e in bot.events("mark")] == ["a", "b"]
    heard_s = call.played_pcm().size / 8000
    assert 0.3 < heard_s < 1.5, heard_s  # about the 0.5 s before the clear, not 4 s
    assert all(p.at < call.clears[0] + 0.05 for p in call.played if p.pcm.size)
    assert call.violations == []


def test_twilio_records_schema_violations() -> None:
    async def script(bot: Bot, ws: ServerConnection) -> None:
        sid = (await bot.wait_for("start"))["streamSid"]
        await ws.send(mulaw_encode(tone(0.02)).tobytes())  # binary: Twilio refuses it
        await ws.send(json.dumps({"event": "speak", "streamSid": sid}))
        await ws.send(json.dumps({"event": "clear"}))  # no streamSid
        await ws.send(json.dumps({"event": "mark", "streamSid": "MZother", "mark": {"name": "x"}}))
        await ws.send(json.dumps({"event": "media", "streamSid": sid, "media": {"payload": "%%"}}))
        await ws.send(twilio_media(sid, tone(0.013)))  # not whole 20 ms frames
        bad = {"event": "media", "streamSid": sid, "media": {"payload": "", "track": "x"}}
        await ws.send(json.dumps(bad))
        await ws.send("{oops")
        await asyncio.sleep(30)

    calls: list[SimulatedTwilioCall] = []

    async def body(call: SimulatedTwilioCall, bot: Bot) -> None:
        await call.wait_until(lambda: len(call.violations) >= 9)

    run_call(lambda url: calls.append(SimulatedTwilioCall(url)) or calls[0], script, body)
    kinds = [v.kind for v in calls[0].violations]
    for kind in ("binary", "unknown-event", "stream-id", "base64", "frame-size", "schema", "json"):
        assert kind in kinds, (kind, calls[0].violations)


def test_underruns_count_gaps_inside_a_stretch_only() -> None:
    p = Playout(8000)
    t = 0.0
    p.push_audio(np.ones(160, np.int16), t)
    p.tick(t)
    p.tick(t + 0.02)  # ran dry: the stretch is not over (no mark)
    p.push_audio(np.ones(160, np.int16), t + 0.03)  # late: an underrun
    assert p.underruns == 1 and p.gaps == [(0.02, 0.03)]
    p.tick(t + 0.04)
    p.push_mark("end", t + 0.045)  # the stretch ends
    p.tick(t + 0.06)
    p.tick(t + 0.08)
    p.push_audio(np.ones(160, np.int16), t + 0.1)  # a new stretch: no underrun
    assert p.underruns == 1


def test_caller_speech_onset_is_recorded_and_media_before_start_is_sent() -> None:
    async def body(call: SimulatedTwilioCall, bot: Bot) -> None:
        await call.send_media_now()  # media before start: bad input for the server
        await call.send_start()
        clip = phone_speech.barge_in_sentences(1)[0].pcm
        said = time.monotonic()
        call.say(clip)
        await call.wait_until(lambda: bool(call.said_at))
        assert 0 <= call.said_at[0] - said < 0.2
        await asyncio.sleep(0.2)

    class Late(SimulatedTwilioCall):
        async def __aenter__(self) -> SimulatedTwilioCall:
            await self.open(start=False)
            return self

    bot = run_call(Late, idle, body)
    assert [m["event"] for _, m in bot.received[:3]] == ["media", "connected", "start"]
    loud = [m for m in bot.events("media") if np.abs(np.frombuffer(base64.b64decode(
        m["media"]["payload"]), np.uint8).astype(int) - 0x7F).max() > 20]  # fmt: skip
    assert loud  # the prompt went out


# -- DTMF on each platform ------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["twilio", "telnyx", "vonage"])
def test_dtmf_schema(platform: str) -> None:
    makers = {"twilio": SimulatedTwilioCall, "telnyx": SimulatedTelnyxCall}

    async def body(call: Any, bot: Bot) -> None:
        await call.send_dtmf("5")
        await bot.wait_for("websocket:dtmf" if platform == "vonage" else "dtmf")

    bot = run_call(makers.get(platform, SimulatedVonageCall), idle, body)
    if platform == "twilio":
        d = bot.events("dtmf")[0]
        assert set(d) == {"event", "streamSid", "sequenceNumber", "dtmf"}
        assert d["dtmf"] == {"track": "inbound_track", "digit": "5"}
    elif platform == "telnyx":
        d = bot.events("dtmf")[0]
        assert set(d) == {"event", "stream_id", "occurred_at", "sequence_number", "dtmf"}
        assert d["dtmf"] == {"digit": "5"} and d["occurred_at"].endswith("Z")
    else:
        assert bot.events("websocket:dtmf")[0] == {
            "event": "websocket:dtmf",
            "digit": "5",
            "duration": 260,
        }


# -- Telnyx and Vonage -----------------------------------------------------------------------


def test_telnyx_l16_is_big_endian_and_marks_echo_after_play() -> None:
    pcm = tone(0.4, rate=16000)

    async def script(bot: Bot, ws: ServerConnection) -> None:
        start = await bot.wait_for("start")
        assert start["start"]["media_format"] == {
            "encoding": "L16",
            "sample_rate": 16000,
            "channels": 1,
        }
        assert start["start"]["custom_parameters"] == {"token": "x"}
        payload = base64.b64encode(pcm.astype(">i2").tobytes()).decode()
        await ws.send(json.dumps({"event": "media", "media": {"payload": payload}}))
        await ws.send(json.dumps({"event": "mark", "mark": {"name": "m"}}))
        await asyncio.sleep(30)

    calls: list[SimulatedTelnyxCall] = []

    def make(url: str) -> SimulatedTelnyxCall:
        calls.append(SimulatedTelnyxCall(url, {"token": "x"}, encoding="L16", rate=16000))
        return calls[0]

    async def body(call: SimulatedTelnyxCall, bot: Bot) -> None:
        await call.wait_until(lambda: bool(call.marks))
        await bot.wait_for("mark")

    bot = run_call(make, script, body)
    call = calls[0]
    assert np.array_equal(call.played_pcm(), pcm)
    assert call.marks[0].at - call.media_at[0] > 0.35
    echo = bot.events("mark")[0]
    assert echo["mark"] == {"name": "m"} and echo["stream_id"] == call.stream_id
    assert len(base64.b64decode(bot.events("media")[0]["media"]["payload"])) == 640
    assert bot.received[0][1] == {"event": "connected", "version": "1.0.0"}
    assert call.violations == []


def test_vonage_connected_binary_audio_notify_and_clear() -> None:
    async def script(bot: Bot, ws: ServerConnection) -> None:
        await bot.wait_for("websocket:connected")
        pcm = tone(0.3, rate=16000).astype("<i2").tobytes()
        for k in range(0, len(pcm), 640):
            await ws.send(pcm[k : k + 640])
        await ws.send(json.dumps({"action": "notify", "payload": {"turn": 1}}))
        await bot.wait_for("websocket:notify")
        await ws.send(tone(2.0, rate=16000).tobytes())  # one 2 s frame: not 20 ms
        await ws.send(json.dumps({"action": "notify", "payload": {"turn": 2}}))
        await asyncio.sleep(0.3)
        await ws.send(json.dumps({"action": "clear"}))
        await asyncio.sleep(30)

    calls: list[SimulatedVonageCall] = []

    def make(url: str) -> SimulatedVonageCall:
        calls.append(SimulatedVonageCall(url, headers={"token": "t", "voice": "v"}))
        return calls[0]

    async def body(call: SimulatedVonageCall, bot: Bot) -> None:
        await bot.wait_for("websocket:cleared")
        await asyncio.sleep(0.3)

    bot = run_call(make, script, body)
    call = calls[0]
    assert bot.received[0][1] == {
        "event": "websocket:connected",
        "content-type": "audio/l16;rate=16000",
        "token": "t",
        "voice": "v",
    }
    frames = [m for _, m in bot.received if isinstance(m, bytes)]
    assert frames and all(len(f) == 640 for f in frames)
    assert bot.events("websocket:notify") == [{"event": "websocket:notify", "payload": {"turn": 1}}]
    first, second = call.marks
    assert first.by == "play" and first.at - call.media_at[0] > 0.25
    assert second.by == "dropped"  # not confirmed that Vonage sends them on clear
    assert [v.kind for v in call.violations] == ["frame-size"]


# -- real phone speech ---------------------------------------------------------------------


@pytest.mark.skipif(not phone_speech.available(), reason="asterisk-core-sounds-en-wav missing")
def test_phone_speech_loads_real_prompts_with_text() -> None:
    prompts = phone_speech.prompts()
    assert len(prompts) > 500
    thanks = phone_speech.prompt("auth-thankyou")
    assert thanks.pcm.dtype == np.int16 and 0.3 < thanks.seconds < 2.0
    if not phone_speech.TRANSCRIPTS.exists():
        pytest.skip("asterisk-core-sounds-en (transcripts) missing")
    assert thanks.text == "Thank you."
    assert phone_speech.prompt("digits/5").text == "five"
    picks = phone_speech.barge_in_sentences(5)
    assert len(picks) == 5
    for p in picks:
        assert p.is_speech and 1.0 <= p.seconds <= 3.0 and p.text and p.text.endswith(".")
        assert np.abs(p.pcm).max() > 3000  # real speech, not silence
