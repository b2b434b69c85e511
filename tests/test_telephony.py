"""Phone calls through voiceagent, way (a): a simulated carrier (bench/carriers.py, which
follows each platform's schema and plays our audio on its own 20 ms clock) places the
call, a bot attaches by token at /v1/calls and drives it. The caller who barges in is a
real person: Asterisk's recorded prompts (8 kHz speech, Debian asterisk-core-sounds-en-wav).

Timing is read on the carrier's clock (its playout and echo records), with bounds that
hold on a busy machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import websockets
from conftest import run
from twilio.request_validator import RequestValidator

from voiceagent.bench import phone_speech
from voiceagent.bench.asterisk import SimulatedAsteriskWebSocketCall, SimulatedAudioSocketCall
from voiceagent.bench.carriers import (
    SimulatedTelnyxCall,
    SimulatedTwilioCall,
    SimulatedVonageCall,
)
from voiceagent.bench.clients import Client, connect
from voiceagent.protocol import frames
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.session.playout import PlayoutConfig
from voiceagent.telephony import marks
from voiceagent.telephony.bot import BotLink
from voiceagent.telephony.call import CallRegistry, TelephonyConfig
from voiceagent.telephony.marks import MarkBook
from voiceagent.transport.guard import GuardConfig

LONG = (
    "Thank you for calling the support line. Your call matters to us, and an agent will "
    "be with you shortly. Meanwhile, you can find answers to many questions on our site."
)


def token() -> str:
    return secrets.token_urlsafe(18)


def base(server: BackgroundServer) -> str:
    return server.url.removesuffix("/v1/ws")


def twilio(server: BackgroundServer, **params: str) -> SimulatedTwilioCall:
    return SimulatedTwilioCall(base(server) + "/v1/telephony/twilio", params)


async def attach(server: BackgroundServer, tok: str, **extra: Any) -> Client:
    """A bot on /v1/calls, attached to the call with token `tok`."""
    bot = Client(await connect(base(server) + "/v1/calls"))
    await bot.send({"type": "session.attach", "token": tok, **extra})
    return bot


async def attached(server: BackgroundServer, tok: str, **extra: Any) -> tuple[Client, dict]:
    bot = await attach(server, tok, **extra)
    created = await bot.event()
    assert created["type"] == "session.created", created
    return bot, created


async def until(bot: Client, kind: str, timeout: float = 30) -> dict[str, Any]:
    """The bot's next event of `kind`, skipping others."""
    while True:
        event = await bot.event(timeout)
        if event["type"] == kind:
            return event


def heard_ms(played: list[Any], before: float, rate: int = 8000) -> float:
    """Milliseconds of audio the carrier played before time `before`, the frame in
    progress counted up to `before`."""
    total = 0.0
    for p in played:
        if p.pcm.size and p.at < before:
            total += min(p.pcm.size / rate, before - p.at) * 1000
    return total


def has_sound(pcm: np.ndarray) -> bool:
    return pcm.size > 0 and float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) > 50


@pytest.fixture(scope="module")
def caller_speech() -> np.ndarray:
    if not phone_speech.available():
        pytest.skip("asterisk-core-sounds-en-wav is not installed (deploy/setup.sh --test)")
    sentence = phone_speech.barge_in_sentences(1)[0]
    return sentence.pcm


# -- a Twilio call from start to end ---------------------------------------------------


def test_a_twilio_call_hears_the_bots_deltas_and_marks_tell_when_all_was_heard(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server()
    tok = token()

    async def go() -> None:
        async with twilio(server, token=tok, voice="narrator") as call:
            bot, created = await attached(server, tok)
            assert created["call"]["carrier"] == "twilio"
            assert created["call"]["params"] == {"voice": "narrator"}  # never the token
            assert created["settings"]["voice"] == "narrator"
            assert created["settings"]["format"]["codec"] == "mulaw"
            assert created["settings"]["barge_in"]["mode"] == "cancel"
            for delta in ("Hello, thanks ", "for calling. How can ", "I help you today?"):
                await bot.send({"type": "text.delta", "turn_id": "greet", "text": delta})
            await bot.send({"type": "text.end"})
            done = await until(bot, "turn.done")
            sent_ms = done["sent_ms"]
            # The final mark echoes once the carrier has played the turn to its end.
            last = f"va:{done['turn']}:{sent_ms}"
            await call.wait_until(lambda: any(m.name == last for m in call.marks), 10)
            echo = next(m for m in call.marks if m.name == last)
            assert echo.by == "play"
            assert len(call.played_pcm()) == sent_ms * 8  # every sample, 8 per ms
            assert has_sound(call.played_pcm())
            # Marks came every 100 ms and each echoed only after its audio had played.
            assert sum(m.name.startswith("va:") for m in call.marks) == -(-sent_ms // 100)
            # (Underruns are the benchmark's business: on a busy CPU a turn may run dry.)
            assert not call.violations, call.violations
            await call.send_dtmf("5")
            assert (await until(bot, "dtmf"))["digit"] == "5"

    run(go())


def test_a_caller_who_speaks_stops_the_bot_and_played_ms_is_what_the_carrier_played(
    make_server: Callable[..., BackgroundServer], caller_speech: np.ndarray
) -> None:
    server = make_server()
    tok = token()

    async def go() -> None:
        async with twilio(server, token=tok) as call:
            bot, _ = await attached(server, tok)
            await bot.send({"type": "speak", "text": LONG})
            await call.wait_until(lambda: heard_ms(call.played, 1e18) >= 1000, 30)
            call.say(caller_speech)
            assert (await until(bot, "speech_started"))["type"] == "speech_started"
            cancelled = await until(bot, "turn.cancelled")
            assert cancelled["reason"] == "barge_in"
            assert call.clears, "no clear reached the carrier"
            clear_at = call.clears[0]
            # Nothing of the turn came after the clear (the carrier would have played it).
            assert all(t <= clear_at for t in call.media_at)
            truth = heard_ms(call.played, clear_at)
            assert cancelled["played_source"] == "report"  # from the marks
            assert abs(cancelled["played_ms"] - truth) <= 20, (cancelled["played_ms"], truth)
            assert call.said_at and clear_at - call.said_at[0] < 2.0
            assert not call.violations, call.violations

    run(go())


def test_the_bot_may_attach_first_and_receive_the_callers_audio_at_16_khz(
    make_server: Callable[..., BackgroundServer], caller_speech: np.ndarray
) -> None:
    server = make_server()
    tok = token()

    async def go() -> None:
        bot_task = asyncio.ensure_future(attached(server, tok, caller_audio_rate=16000))
        await asyncio.sleep(0.3)  # the bot waits for its call
        async with twilio(server, token=tok) as call:
            bot, created = await bot_task
            assert created["call"]["call_id"]
            call.say(caller_speech)
            received: list[frames.AudioFrame] = []
            while sum(len(f.payload) for f in received) < 2 * 16000 * 1.5:
                msg = await asyncio.wait_for(bot.ws.recv(), 10)
                if isinstance(msg, bytes):
                    received.append(frames.unpack(msg))
            assert {(f.codec, f.turn) for f in received} == {("pcm16", 0)}
            assert all(len(f.payload) == 640 for f in received)  # 20 ms at 16 kHz
            # on the call's timeline: from its first audio (a frame or so may pass
            # before the waiting bot is attached), 20 ms apart
            first = received[0].pts_ms
            assert first <= 100 and [f.pts_ms - first for f in received[:3]] == [0, 20, 40]
            pcm = np.frombuffer(b"".join(f.payload for f in received), dtype="<i2")
            assert has_sound(pcm)

    run(go())


def test_a_bot_attached_late_hears_the_caller_on_the_same_timeline_as_speech_started(
    make_server: Callable[..., BackgroundServer], caller_speech: np.ndarray
) -> None:
    # What was seen: a bot attached 2 s into the call got frames stamped from 0, while
    # speech_started said 2,620 ms: 2 s apart.
    server = make_server()
    tok = token()

    async def go() -> None:
        async with twilio(server, token=tok) as call:
            await asyncio.sleep(1.5)  # the call streams silence; no bot yet
            bot, _ = await attached(server, tok, caller_audio_rate=16000)
            call.say(caller_speech)
            started, loud_at = None, None
            while started is None or loud_at is None:
                msg = await asyncio.wait_for(bot.ws.recv(), 10)
                if isinstance(msg, bytes):
                    frame = frames.unpack(msg)
                    if loud_at is None and has_sound(np.frombuffer(frame.payload, "<i2")):
                        loud_at = frame.pts_ms
                elif json.loads(msg)["type"] == "speech_started":
                    started = json.loads(msg)["t_ms"]
            assert loud_at >= 1500
            assert abs(started - loud_at) <= 100, (started, loud_at)

    run(go())


# -- Telnyx and Vonage -------------------------------------------------------------------


@pytest.mark.parametrize("carrier", ["telnyx", "vonage"])
def test_telnyx_and_vonage_calls_hear_the_bot_get_cleared_and_deliver_dtmf(
    make_server: Callable[..., BackgroundServer], carrier: str
) -> None:
    server = make_server()
    tok = token()
    url = f"{base(server)}/v1/telephony/{carrier}"
    call = (
        SimulatedTelnyxCall(url, {"token": tok}, encoding="L16", rate=16000)
        if carrier == "telnyx"
        else SimulatedVonageCall(url, {"token": tok}, rate=16000)
    )

    async def go() -> None:
        async with call:
            bot, created = await attached(server, tok)
            assert created["call"]["carrier"] == carrier
            assert created["settings"]["format"] == {
                **created["settings"]["format"],
                "codec": "pcm16",
                "sample_rate": 16000,
            }
            await bot.send({"type": "speak", "text": LONG})
            await call.wait_until(lambda: heard_ms(call.played, 1e18, 16000) >= 600, 30)
            assert has_sound(call.played_pcm())
            await bot.send({"type": "cancel"})
            cancelled = await until(bot, "turn.cancelled")
            await call.wait_until(lambda: bool(call.clears), 5)
            truth = heard_ms(call.played, call.clears[0], 16000)
            # No marks here: played_ms is the server's clock estimate, and the carrier's
            # clock stops at the clear, which on a busy machine lands a loop turn or two
            # later (CI saw 24 ms): within three frames.
            assert abs(cancelled["played_ms"] - truth) <= 60, (cancelled, truth)
            await call.send_dtmf("#")
            assert (await until(bot, "dtmf"))["digit"] == "#"
            # the carrier's own errors reach the bot (they were dropped unseen)
            if carrier == "telnyx":
                error = {"code": "100003", "title": "malformed frame"}
                await call.send_raw(json.dumps({"event": "error", "payload": error}))
            else:
                await call.send_raw(json.dumps({"event": "websocket:error", "reason": "oops"}))
            reported = await until(bot, "error")
            assert reported["code"] == "carrier_error"
            assert ("malformed frame" if carrier == "telnyx" else "oops") in reported["message"]
            assert not call.violations, call.violations

    run(go())


# -- the bot's side ---------------------------------------------------------------------


def test_the_bot_switches_voices_between_turns_and_hangs_up(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server()
    tok = token()

    async def go() -> None:
        async with twilio(server, token=tok, voice="nobody") as call:
            bot, created = await attached(server, tok)
            # A parameter that cannot be used is reported; the call keeps its default.
            error = await until(bot, "error")
            assert error["code"] == "unknown_voice"
            assert created["settings"]["voice"] == "agent"
            await bot.send({"type": "session.update", "voice": "narrator"})
            assert (await until(bot, "session.updated"))["settings"]["voice"] == "narrator"
            await bot.send({"type": "speak", "text": "Hi."})
            assert (await until(bot, "turn.started"))["voice"] == "narrator"
            await until(bot, "turn.done")
            await bot.send({"type": "call.hangup"})
            ended = await until(bot, "call.ended")
            assert ended["reason"] == "hangup"  # (was "disconnected": our own hang-up)
            await call.wait_until(lambda: call.close_code is not None, 5)
            assert call.close_code == 1000
        assert server.voice_server.admission.sessions == 0

    run(go())


def test_a_call_whose_bot_never_comes_or_leaves_is_hung_up(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server(telephony=TelephonyConfig(attach_timeout_s=0.5, bot_grace_s=0.5))

    async def go() -> None:
        async with twilio(server, token=token()) as lonely:
            await lonely.wait_until(lambda: lonely.close_code is not None, 5)
            assert lonely.close_code == 1000
        tok = token()
        async with twilio(server, token=tok) as call:
            bot, _ = await attached(server, tok)
            await bot.ws.close()
            await call.wait_until(lambda: call.close_code is not None, 5)
        # A bot that asks for a call nobody placed hears so once the wait is over.
        bot = await attach(server, token())
        error = await bot.event()
        assert error["code"] == "unknown_call"

    run(go())


class DeadSocket:
    """A bot's socket whose sends fail, as a vanished TCP peer's do (a real socket cannot
    be made to fail on cue; the end-to-end resets above did not hit the window)."""

    def __init__(self) -> None:
        self.dead = False
        self.sent: list[str] = []

    async def send_text(self, text: str) -> None:
        if self.dead:
            raise ConnectionResetError("peer gone")
        self.sent.append(text)


def test_a_bot_that_dies_mid_send_still_leaves_the_call_to_its_grace_timer() -> None:
    # What was seen: a failed send forgot the bot, so its detach started no grace timer
    # and the call, with nobody to drive it, never hung up.
    async def go() -> None:
        link, first, second = BotLink(), DeadSocket(), DeadSocket()
        await link.attach(first, {"type": "session.created"}, 0)  # type: ignore[arg-type]
        first.dead = True
        await link.send({"type": "turn.done"})
        assert not link.attached  # a new bot may attach now
        assert link.detach(first)  # ... and its leaving leaves the call without a bot
        # a new bot may come before the dead one's socket notices: it stays attached
        link, first = BotLink(), DeadSocket()
        await link.attach(first, {"type": "session.created"}, 0)  # type: ignore[arg-type]
        first.dead = True
        await link.send({"type": "turn.done"})
        await link.attach(second, {"type": "session.created"}, 0)  # type: ignore[arg-type]
        assert not link.detach(first) and link.attached and link.ws is second
        assert json.loads(second.sent[-1])["type"] == "turn.done"  # kept for it

    run(go())


def test_a_bot_waiting_for_its_call_is_woken_though_another_waiter_gave_up() -> None:
    # What was seen: every bot waiting on a token shared one future, and the first to
    # time out removed it; a reconnected bot still within its own wait then got
    # unknown_call for a call that arrived in time.
    async def go() -> None:
        calls = CallRegistry()
        tok = token()
        gone = asyncio.create_task(calls.find(tok, 0.2))  # its socket died while waiting
        await asyncio.sleep(0.1)
        back = asyncio.create_task(calls.find(tok, 5.0))  # its reconnect
        assert await gone is None
        call = object()
        assert calls.add(tok, call)  # type: ignore[arg-type]
        assert await asyncio.wait_for(back, 5) is call
        assert not calls._waiting  # nothing left behind

    run(go())


def test_bad_attach_messages_are_refused_with_a_code(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server()
    tok = token()

    async def refused(first: str | bytes) -> tuple[dict[str, Any], int | None]:
        async with connect(base(server) + "/v1/calls") as ws:
            await ws.send(first)
            event = json.loads(await asyncio.wait_for(ws.recv(), 5))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            return event, ws.close_code

    async def go() -> None:
        for first in (
            "not json",
            json.dumps({"type": "session.start"}),
            json.dumps({"type": "session.attach", "token": "short"}),
            json.dumps({"type": "session.attach", "token": tok, "caller_audio_rate": 44100}),
        ):
            event, code = await refused(first)
            assert event["code"] == "invalid_parameter" and code == 1008, (first, event)
        async with twilio(server, token=tok):
            bot, _ = await attached(server, tok)
            second = await attach(server, tok)
            assert (await second.event())["code"] == "call_already_attached"
            await bot.send(b"\x00\x01")  # audio comes from the carrier, not the bot
            assert (await until(bot, "error"))["code"] == "unexpected_binary"
            await bot.send({"type": "session.start"})
            assert (await until(bot, "error"))["code"] == "session_already_started"
            await bot.send({"type": "speak", "text": "Still here."})
            await until(bot, "turn.done")

    run(go())


# -- bad input from the carrier -----------------------------------------------------------


def test_a_carriers_bad_messages_are_reported_and_touch_no_other_call(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server()
    tok_a, tok_b = token(), token()

    async def go() -> None:
        async with twilio(server, token=tok_a) as a, twilio(server, token=tok_b) as b:
            bot_a, _ = await attached(server, tok_a)
            bot_b, _ = await attached(server, tok_b)
            await bot_b.send({"type": "speak", "text": LONG})
            await a.send_raw("{not json")
            await a.send_bad_base64()
            await a.send_unknown_event()
            await a.send_raw(json.dumps({"event": "dtmf", "dtmf": {"digit": "xyz"}}))
            await a.send_raw(json.dumps({"event": "start", "start": {}}))  # a second start
            codes = [(await until(bot_a, "error"))["code"] for _ in range(4)]
            assert codes == ["invalid_carrier_message"] * 4
            await bot_a.send({"type": "speak", "text": "Hello."})  # call a still works
            await until(bot_a, "turn.done")
            done_b = await until(bot_b, "turn.done")  # call b never noticed
            await b.wait_until(lambda: heard_ms(b.played, 1e18) >= done_b["sent_ms"] - 20, 10)
            assert not b.violations

    run(go())


def test_broken_starts_and_tokens_are_closed_with_a_code(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server(max_sessions=1)
    tok = token()

    async def closed(call: SimulatedTwilioCall) -> int | None:
        await call.wait_until(lambda: call.close_code is not None, 5)
        await call.close()
        return call.close_code

    async def go() -> None:
        early = twilio(server, token=token())
        await early.open(start=False)
        await early.send_media_now()  # media before start
        assert await closed(early) == 1008
        stopped = twilio(server, token=token())
        await stopped.open(start=False)
        stop = {"callSid": "CA" + "0" * 32, "accountSid": "AC" + "0" * 32}
        await stopped.send_raw(
            json.dumps({"event": "stop", "sequenceNumber": "1", "streamSid": "MZ1", "stop": stop})
        )
        assert await closed(stopped) == 1008  # a stop before start, as the docs say
        no_token = twilio(server)
        await no_token.open()
        assert await closed(no_token) == 1008
        async with twilio(server, token=tok) as first:
            bot, _ = await attached(server, tok)
            same = twilio(server, token=tok)  # also refused for being full
            await same.open()
            assert await closed(same) in (1008, 1013)
            full = twilio(server, token=token())
            await full.open()
            assert await closed(full) == 1013
            assert first.close_code is None  # the live call goes on
            await bot.send({"type": "speak", "text": "Still fine."})
            await until(bot, "turn.done")

    run(go())


def test_a_carrier_that_vanishes_mid_turn_ends_the_call_for_its_bot(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server()
    tok = token()

    async def go() -> None:
        call = twilio(server, token=tok)
        await call.open()
        bot, _ = await attached(server, tok)
        await bot.send({"type": "speak", "text": LONG})
        await until(bot, "turn.first_audio")
        assert call.ws is not None
        call.ws.transport.abort()  # the carrier's connection drops without a close
        ended = await until(bot, "call.ended")
        assert ended["reason"] == "disconnected"
        await call.close()
        for _ in range(100):
            if server.voice_server.admission.sessions == 0:
                break
            await asyncio.sleep(0.05)
        assert server.voice_server.admission.sessions == 0

    run(go())


FLOOD = GuardConfig(messages_per_s=100, message_burst=100, flood_close_s=1.0)


def test_a_flooding_carrier_stream_is_held_back_then_hung_up_while_other_calls_go_on(
    make_server: Callable[..., BackgroundServer],
) -> None:
    # What was seen: carrier streams and bots had no message rate at all, so one flood
    # took the event loop from every other call and session.
    port = free_port()
    server = make_server(
        guard=FLOOD,
        telephony=TelephonyConfig(audiosocket_host="127.0.0.1", audiosocket_port=port),
    )
    tok_a, tok_b = token(), token()

    async def flood(send: Callable[[], Any], seconds: float = 20) -> float:
        t0 = time.monotonic()
        with contextlib.suppress(websockets.ConnectionClosed, ConnectionError):
            while time.monotonic() - t0 < seconds:
                await send()
        return time.monotonic() - t0

    async def go() -> None:
        async with twilio(server, token=tok_a) as a, twilio(server, token=tok_b) as b:
            bot_a, _ = await attached(server, tok_a)
            bot_b, _ = await attached(server, tok_b)
            await bot_b.send({"type": "speak", "text": LONG})
            flooded_for = await flood(a.send_media_now)
            ended = await until(bot_a, "call.ended")
            assert ended["reason"] == "rate_limited"
            assert 0.5 < flooded_for < 15
            done_b = await until(bot_b, "turn.done")  # call b spoke all along
            await b.wait_until(lambda: heard_ms(b.played, 1e18) >= done_b["sent_ms"] - 20, 10)
        # AudioSocket's TCP stream the same way (DTMF packets: each is one message)
        async with SimulatedAudioSocketCall("127.0.0.1", port, strict=False) as call:
            bot, _ = await attached(server, call.call_id)
            flooded_for = await flood(lambda: call.send_dtmf("5"))
            assert (await until(bot, "call.ended"))["reason"] == "rate_limited"
            assert 0.5 < flooded_for < 15
        metrics = server.voice_server.metrics
        assert metrics.closed.labels("rate_limited")._value.get() == 2

    run(go())


def test_a_flooding_bot_is_held_back_then_dropped_and_the_call_waits_for_it(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server(guard=FLOOD)
    tok = token()

    async def go() -> None:
        async with twilio(server, token=tok):
            bot, _ = await attached(server, tok)
            texts: list[str] = []

            async def read() -> None:
                with contextlib.suppress(websockets.ConnectionClosed):
                    async for message in bot.ws:
                        texts.append(str(message))

            reader = asyncio.create_task(read())
            t0, sent = time.monotonic(), 0
            with pytest.raises(websockets.ConnectionClosed):
                while time.monotonic() - t0 < 20:
                    await bot.send({"type": "ping"})
                    sent += 1
                    if sent % 100 == 0:
                        await asyncio.sleep(0)  # let the reader run
            flooded_for = time.monotonic() - t0
            await reader
            events = [json.loads(t) for t in texts]
            assert {e["code"] for e in events if e["type"] == "error"} == {"rate_limited"}
            assert sum(e["type"] == "pong" for e in events) < sent
            assert 0.5 < flooded_for < 15
            again, _ = await attached(server, tok)  # the call waited for its bot
            await again.send({"type": "speak", "text": "Hello again."})
            await until(again, "turn.done")

    run(go())


def test_twilio_streams_must_carry_a_valid_signature_when_a_token_is_set(
    make_server: Callable[..., BackgroundServer],
) -> None:
    secret = "twilio-auth-token"
    server = make_server(telephony=TelephonyConfig(twilio_auth_token=secret))
    url = base(server) + "/v1/telephony/twilio"
    signed = RequestValidator(secret).compute_signature(url.replace("ws://", "wss://"), {})
    tok = token()

    async def go() -> None:
        forged = SimulatedTwilioCall(url, {"token": token()}, {"X-Twilio-Signature": "bad"})
        with pytest.raises(websockets.InvalidStatus) as refused:
            await forged.open()
        assert refused.value.response.status_code == 403
        call = SimulatedTwilioCall(url, {"token": tok}, {"X-Twilio-Signature": signed})
        async with call:
            bot, _ = await attached(server, tok)
            await bot.send({"type": "speak", "text": "Signed."})
            await until(bot, "turn.done")

    run(go())


# -- way (b): the bot keeps its own media stream ------------------------------------------


def test_a_bot_that_keeps_its_twilio_stream_forwards_our_messages_and_barge_in_works(
    make_server: Callable[..., BackgroundServer], caller_speech: np.ndarray
) -> None:
    """The bot is Twilio's server here: it relays voiceagent's `twilio` framing to Twilio
    unchanged, and Twilio's media and mark echoes back to voiceagent unchanged."""
    server = make_server()
    events: list[dict[str, Any]] = []

    async def bot(twilio_ws: Any) -> None:
        early = []
        async for message in twilio_ws:  # connected, then start
            early.append(message)
            if json.loads(message)["event"] == "start":
                sid = json.loads(message)["streamSid"]
                break
        async with connect(server.url) as va:
            session = Client(va)
            await session.start(
                format={"codec": "mulaw", "framing": "twilio", "stream_sid": sid},
                barge_in={"mode": "cancel"},
            )
            for message in early:  # a relay forwards these too (seen: "a second 'start'")
                await va.send(message)
            await session.send({"type": "speak", "text": LONG})

            async def down() -> None:
                async for message in va:
                    assert isinstance(message, str)  # twilio framing: text only
                    msg = json.loads(message)
                    if "event" in msg:
                        await twilio_ws.send(message)
                    else:
                        events.append(msg)

            async def up() -> None:
                async for message in twilio_ws:
                    await va.send(message)

            relaying = asyncio.ensure_future(down())
            await up()  # until Twilio hangs up
            relaying.cancel()

    async def go() -> None:
        async with websockets.serve(bot, "127.0.0.1", 0) as relay:
            port = relay.sockets[0].getsockname()[1]
            async with SimulatedTwilioCall(f"ws://127.0.0.1:{port}/stream") as call:
                await call.wait_until(lambda: heard_ms(call.played, 1e18) >= 1000, 30)
                call.say(caller_speech)
                await call.wait_until(
                    lambda: any(e["type"] == "turn.cancelled" for e in events), 10
                )
                cancelled = next(e for e in events if e["type"] == "turn.cancelled")
                assert cancelled["reason"] == "barge_in"
                await call.wait_until(lambda: bool(call.clears), 5)  # the relay forwards it
                assert all(t <= call.clears[0] for t in call.media_at)
                truth = heard_ms(call.played, call.clears[0])
                assert cancelled["played_source"] == "report"
                # the last mark's echo plus the time since; each message crosses the relay
                # twice, so a busy machine adds its delay (45 ms seen beside another test
                # process); sent-not-played would be off by seconds
                assert abs(cancelled["played_ms"] - truth) <= 100, (cancelled, truth)
                assert not call.violations, call.violations
                errors = [e for e in events if e["type"] == "error"]
                assert not errors, errors

    run(go())


# -- Asterisk ------------------------------------------------------------------------------


async def eventually(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def frames_heard_ms(frames: list[Any], before: float = 1e18) -> float:
    """Audio the Asterisk caller heard before `before` (frames carry their rate)."""
    return sum(min(f.duration, max(0.0, before - f.at)) * 1000 for f in frames if f.pcm.size)


def test_an_audiosocket_call_hears_the_bot_barges_in_and_sends_dtmf(
    make_server: Callable[..., BackgroundServer], caller_speech: np.ndarray
) -> None:
    port = free_port()
    server = make_server(
        telephony=TelephonyConfig(audiosocket_host="127.0.0.1", audiosocket_port=port)
    )
    call_id = str(uuid.uuid4())

    async def go() -> None:
        async with SimulatedAudioSocketCall("127.0.0.1", port, call_id=call_id) as call:
            bot, created = await attached(server, call_id)  # the UUID is the token
            assert created["call"]["carrier"] == "audiosocket"
            # ... and the key to the call: it is named by a digest, in logs too
            assert call_id not in json.dumps(created)
            assert created["call"]["call_id"].startswith("as-")
            assert created["settings"]["format"]["sample_rate"] == 8000
            await bot.send({"type": "speak", "text": LONG})
            await eventually(lambda: frames_heard_ms(call.playback.frames) >= 1000, 30)
            # Asterisk plays what arrives at once: our frames must come paced, 20 ms apart.
            arrivals = [f.at for f in call.playback.frames[5:40]]
            spacing = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
            assert 0.015 < spacing < 0.03, spacing
            call.say(caller_speech)
            cancelled = await until(bot, "turn.cancelled")
            assert cancelled["reason"] == "barge_in"
            truth = frames_heard_ms(call.playback.frames)
            await asyncio.sleep(0.3)
            # Nothing more was played after the cancel (we hold back what is not due).
            assert frames_heard_ms(call.playback.frames) - truth <= 20
            assert abs(cancelled["played_ms"] - truth) <= 20, (cancelled["played_ms"], truth)
            await call.send_dtmf("7")
            assert (await until(bot, "dtmf"))["digit"] == "7"
            await bot.send({"type": "call.hangup"})
            assert await call.wait_ended(5)
            assert call.server_hung_up

    run(go())


@pytest.mark.parametrize("rate", [12000, 44100, 192000])
def test_an_audiosocket_call_at_any_slin_rate_hears_the_bot_at_that_rate(
    make_server: Callable[..., BackgroundServer], rate: int
) -> None:
    """Asterisk offers signed linear at 8 to 192 kHz and the call answers at the rate of
    its first audio: each must be spoken to (the session's encoder once refused all but
    8, 16, 24 and 48 kHz, and the bot was dropped with no event)."""
    port = free_port()
    server = make_server(
        telephony=TelephonyConfig(audiosocket_host="127.0.0.1", audiosocket_port=port)
    )
    call_id = str(uuid.uuid4())

    async def go() -> None:
        async with SimulatedAudioSocketCall(
            "127.0.0.1", port, call_id=call_id, sample_rate=rate
        ) as call:
            bot, created = await attached(server, call_id)
            fmt = created["settings"]["format"]
            assert (fmt["codec"], fmt["sample_rate"]) == ("pcm16", rate)
            await bot.send({"type": "speak", "text": "Your code is four four one."})
            done = await until(bot, "turn.done")
            await eventually(lambda: frames_heard_ms(call.playback.frames) >= done["sent_ms"], 10)
            frames = [f for f in call.playback.frames if f.pcm.size]
            assert {f.pcm.size for f in frames} == {rate // 50}
            assert has_sound(np.concatenate([f.pcm for f in frames]))

    run(go())


@pytest.mark.parametrize("control", ["plain-text", "json"])
def test_an_asterisk_websocket_call_honours_xoff_flushes_on_barge_in_and_marks_tell_played(
    make_server: Callable[..., BackgroundServer], caller_speech: np.ndarray, control: str
) -> None:
    server = make_server()
    tok = token()
    url = base(server) + "/v1/telephony/asterisk"

    async def go() -> None:
        call = SimulatedAsteriskWebSocketCall(
            url,
            control_format=control,
            uri_params={"token": tok, "voice": "narrator"},
            xoff_level=6,  # our 200 ms lead is 10 frames: Asterisk pushes back at once
            xon_level=3,
        )
        async with call:
            bot, created = await attached(server, tok)
            assert created["call"]["carrier"] == "asterisk"
            assert created["settings"]["voice"] == "narrator"
            await bot.send({"type": "speak", "text": LONG})
            await eventually(lambda: frames_heard_ms(call.playback.frames) >= 1000, 30)
            xoffs = call.times("xoff")
            assert xoffs and call.times("xon")
            # Each XOFF stops us: only frames already on their way (at most our 10-frame
            # lead) arrive after it. A server that ignored it would go on at 50 a second.
            assert call.media_while_xoff <= 10 * len(xoffs), (call.media_while_xoff, xoffs)
            call.say(caller_speech)
            cancelled = await until(bot, "turn.cancelled")
            assert cancelled["reason"] == "barge_in"
            await eventually(lambda: bool(call.times("flush")), 5)
            flushed_at = call.times("flush")[0]
            truth = frames_heard_ms(call.playback.frames, flushed_at)
            assert cancelled["played_source"] == "report"  # MEDIA_MARK_PROCESSED
            # within a frame or two: the last mark report can trail the flush by a frame
            # on a busy machine (21.4 ms seen once in the full suite)
            assert abs(cancelled["played_ms"] - truth) <= 45, (cancelled, truth)
            await asyncio.sleep(0.2)
            # silent after, but for the rest of the frame playing at the flush (20 ms; a
            # busy machine's timers add a few)
            assert frames_heard_ms(call.playback.frames) - truth <= 25
            await call.send_dtmf("3")
            assert (await until(bot, "dtmf"))["digit"] == "3"
            await call.report_error("FLUSH_MEDIA not supported in passthrough mode")
            reported = await until(bot, "error")
            assert reported["code"] == "carrier_error" and "passthrough" in reported["message"]

    run(go())


def test_phone_audio_has_no_seams_a_streamed_turn_sounds_as_if_rendered_in_one_piece(
    make_server: Callable[..., BackgroundServer],
) -> None:
    """The same text and seed over Twilio, streamed chunk by chunk and rendered whole
    (the naive path): the caller hears the same 8 kHz audio, within μ-law's rounding.
    A click at a chunk seam (or a resampler restarted per chunk) would show as a large
    difference right there."""
    streamed = make_server()
    whole = make_server(playout=PlayoutConfig(streaming=False))

    async def hear(server: BackgroundServer) -> np.ndarray:
        tok = token()
        async with twilio(server, token=tok) as call:
            bot, _ = await attached(server, tok)
            await bot.send({"type": "speak", "text": LONG})
            done = await until(bot, "turn.done")
            last = f"va:{done['turn']}:{done['sent_ms']}"
            await call.wait_until(lambda: any(m.name == last for m in call.marks), 20)
            return call.played_pcm().astype(np.float64) / 32768

    async def go() -> None:
        a, b = await hear(streamed), await hear(whole)
        assert a.size == b.size and has_sound((a * 32768).astype(np.int16))
        diff = np.abs(a - b)
        peak = np.abs(b).max()
        # μ-law steps are ~3% of a sample's size; a seam click would be of the signal's size.
        assert diff.max() < 0.1 * peak, (diff.max(), peak, int(diff.argmax()))

    run(go())


def test_the_mark_book_stays_small_when_marks_are_echoed_or_never_are() -> None:
    book = MarkBook(every_frames=1)
    names = [book.sent(1) for _ in range(10)]
    assert book.echoed(str(names[4])) == (1, 100)
    assert book.echoed(str(names[2])) is None  # before an echo: done with already
    assert book.echoed(str(names[5])) == (1, 120)
    # a carrier that never echoes (old Asterisk) does not grow the book without end
    for _ in range(3 * marks.MAX_PENDING):
        book.sent(2)
    assert len(book._pending) == marks.MAX_PENDING


def test_an_audiosocket_call_remembers_the_frames_of_its_last_turns_only() -> None:
    # What was seen (read in the code): the frames written of every turn of a call were
    # kept for the whole call, one entry a turn.
    from voiceagent.protocol.actions import SendAudio
    from voiceagent.telephony.audiosocket import KEPT_TURNS, AudioSocketTransport
    from voiceagent.telephony.events import CallInfo

    class Writer:
        def write(self, data: bytes) -> None:
            pass

        async def drain(self) -> None:
            pass

    async def go() -> AudioSocketTransport:
        info = CallInfo("audiosocket", "id", "id", "pcm16", 8000)
        transport = AudioSocketTransport(Writer(), info)  # type: ignore[arg-type]
        for num in range(1, KEPT_TURNS + 11):
            await transport.send_audio(SendAudio(num, 0, 0, "pcm16", bytes(320)))
        await eventually(lambda: transport.sent_ms(KEPT_TURNS + 10) == 20, 10)
        return transport

    transport = run(go())
    assert transport.sent_ms(KEPT_TURNS + 10) == 20 and transport.sent_ms(KEPT_TURNS) == 20
    assert len(transport._emitted) <= KEPT_TURNS + 1


class AsteriskWriter:
    """AudioSocket's writer as our side sees it: packets written, a drain that waits
    while Asterisk is not reading, and a close."""

    def __init__(self, reading: bool = True) -> None:
        self.written = b""
        self.reading = reading
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    async def drain(self) -> None:
        if not self.reading:
            await asyncio.Event().wait()

    def close(self) -> None:
        self.closed = True

    def pcm(self) -> np.ndarray:
        from voiceagent.telephony import audiosocket_frames as wire

        packets = wire.AudioSocketDecoder().feed(self.written)
        return np.concatenate([np.frombuffer(p.payload, "<i2") for p in packets]) / 32767


def test_an_audiosocket_call_cut_while_playing_ends_on_a_fade_not_a_click() -> None:
    # What was seen: a cancel jumped from mid-wave to silence (a click at each barge-in).
    from voiceagent.protocol.actions import SendAudio
    from voiceagent.telephony.audiosocket import AudioSocketTransport
    from voiceagent.telephony.events import CallInfo

    t = np.arange(160 * 8) / 8000
    tone = np.rint(0.5 * 32767 * np.sin(2 * np.pi * 90 * t)).astype("<i2")
    writer = AsteriskWriter()

    async def go() -> None:
        info = CallInfo("audiosocket", "id", "id", "pcm16", 8000)
        transport = AudioSocketTransport(writer, info)  # type: ignore[arg-type]
        for k in range(8):
            await transport.send_audio(
                SendAudio(1, k, 0, "pcm16", tone[k * 160 : (k + 1) * 160].tobytes())
            )
        await eventually(lambda: transport.sent_ms(1) >= 60, 10)
        await transport.drop_turn(1)
        await asyncio.sleep(0.1)
        await transport.stop_sender()

    run(go())
    pcm = writer.pcm()
    assert 4 * 160 <= pcm.size < 8 * 160  # what was heard, and one faded frame
    assert np.abs(pcm[-80:]).max() == 0  # silent within 10 ms of the last frame's start
    assert np.abs(np.diff(pcm)).max() < 1.5 * (0.5 * 2 * np.pi * 90 / 8000)  # the tone's step


def test_asterisk_that_stops_reading_ends_the_audiosocket_call() -> None:
    # What was seen (read in the code): packets were written without waiting for
    # Asterisk, so one that stopped reading had them pile up here without bound.
    from voiceagent.protocol.actions import SendAudio
    from voiceagent.telephony.audiosocket import AudioSocketTransport
    from voiceagent.telephony.events import CallInfo

    writer = AsteriskWriter(reading=False)

    async def go() -> None:
        info = CallInfo("audiosocket", "id", "id", "pcm16", 8000)
        transport = AudioSocketTransport(writer, info, send_timeout_s=0.2)  # type: ignore[arg-type]
        for k in range(50):
            await transport.send_audio(SendAudio(1, k, 0, "pcm16", bytes(320)))
        await eventually(lambda: writer.closed, 10)
        await transport.stop_sender()
        assert writer.written and transport.sent_ms(1) == 0  # written, never taken: unheard

    run(go())


class StuckSocket:
    """A WebSocket whose peer stopped reading: every send blocks."""

    def __init__(self) -> None:
        self.sends = 0

    async def send_text(self, data: str) -> None:
        self.sends += 1
        await asyncio.Event().wait()

    send_bytes = send_text  # type: ignore[assignment]


def test_a_bot_that_stops_reading_is_let_go_and_the_call_keeps_its_events() -> None:
    # What was seen: a bot that stopped reading blocked the call's loop, so the carrier's
    # hang-up went unseen and the session slot stayed taken until the bot's keepalive died.
    from voiceagent.telephony.bot import BotLink

    async def go() -> tuple[BotLink, float]:
        link = BotLink(send_timeout_s=0.2)
        link.ws = StuckSocket()  # type: ignore[assignment]
        started = time.monotonic()
        await link.send({"type": "turn.done"})
        return link, time.monotonic() - started

    link, took = run(go())
    assert took < 5 and not link.attached
    assert list(link._backlog) == [{"type": "turn.done"}]  # for the bot that comes next


def test_a_carrier_that_stops_reading_ends_the_call_s_session() -> None:
    from voiceagent.protocol.actions import SendAudio
    from voiceagent.telephony.events import CallInfo
    from voiceagent.telephony.media_streams import DIALECTS
    from voiceagent.telephony.stream_server import MediaStreamTransport

    dialect = DIALECTS["twilio"]()
    dialect.info = CallInfo("twilio", "CA1", "MZ1", "mulaw", 8000)
    stuck: Any = StuckSocket()
    transport = MediaStreamTransport(stuck, dialect, 1000, send_timeout_s=0.2)

    async def go() -> None:
        await transport.send_audio(SendAudio(1, 0, 0, "mulaw", bytes(160)))

    with pytest.raises(ConnectionError):
        run(go())
