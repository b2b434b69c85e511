"""Bad input over a real WebSocket connection to the real server.

Every kind of bad input gets an `error` event with its stable code, the connection stays
open, and the same session still speaks afterwards. Transport-level violations (a message
over the hard cap, too many sessions) close only the offending connection, with the
documented close code, and the server keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import websockets
from conftest import run

from voiceagent.bench.clients import Client, TurnResult, connect
from voiceagent.model.checkpoint import SpeechModel
from voiceagent.protocol.errors import CloseCode
from voiceagent.protocol.session import Limits
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.session.playout import PlayoutConfig

UNPACED = PlayoutConfig(lead_ms=100_000)  # send audio as soon as it exists
MESSAGE_TOO_BIG = 1009  # WebSocket close code for a message over the transport cap
Message = dict[str, Any] | str | bytes


@pytest.fixture(scope="module")
def shared_server(tiny_model: SpeechModel) -> Iterator[BackgroundServer]:
    """One unpaced server for the table of cases; each case has its own connection."""
    server = BackgroundServer(tiny_model, ServerConfig(port=free_port(), playout=UNPACED)).start()
    yield server
    server.stop()


async def expect_error(c: Client, code: str, timeout: float = 5.0) -> dict[str, Any]:
    event = await c.event(timeout)
    assert event["type"] == "error", event
    assert event["code"] == code, event
    assert isinstance(event["message"], str) and event["message"]
    assert "turn_id" not in event, event
    return event


def assert_complete(result: TurnResult) -> dict[str, Any]:
    """A turn that ran to its end with audio, and with nothing but its own events."""
    done = result.event("turn.done")
    kinds = [e["type"] for e in result.events if e["type"] != "turn.words"]
    assert kinds == ["turn.started", "turn.first_audio", "turn.done"], result.events
    assert len({e["turn_id"] for e in result.events}) == 1
    assert result.frames, "no audio frames"
    assert [f.seq for f in result.frames] == list(range(len(result.frames)))
    assert {f.turn for f in result.frames} == {done["turn"]}
    assert done["sent_ms"] == 20 * len(result.frames)
    levels = [x for e in result.levels for x in e["levels"]]  # one per frame, in order
    assert len(levels) == len(result.frames)
    assert [e["offset_ms"] for e in result.levels] == [
        sum(len(e["levels"]) for e in result.levels[:i]) * 20 for i in range(len(result.levels))
    ]
    return done


async def still_speaks(c: Client, text: str = "Hi.") -> TurnResult:
    result = await c.speak(text)
    assert_complete(result)
    return result


async def closed_with(ws: Any, timeout: float = 5.0) -> tuple[int | None, list[Any]]:
    """Read until the server closes the connection; return its close code and what came."""
    received: list[Any] = []
    deadline = time.monotonic() + timeout
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            left = deadline - time.monotonic()
            received.append(await asyncio.wait_for(ws.recv(), max(0.1, left)))
    return ws.close_code, received


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# -- a table of bad messages in a started session -----------------------------------------

CASES: list[tuple[str, Message, str]] = [
    ("truncated json", "{", "invalid_json"),
    ("not json", "hello server", "invalid_json"),
    ("trailing comma", '{"type": "ping",}', "invalid_json"),
    ("deep nesting", "[" * 20_000, "invalid_json"),
    ("huge integer", '{"type": "ping", "n": ' + "9" * 5000 + "}", "invalid_json"),
    ("array", '[{"type": "speak", "text": "Hi."}]', "invalid_message"),
    ("null", "null", "invalid_message"),
    ("number", "42", "invalid_message"),
    ("no type", {"text": "Hi."}, "invalid_message"),
    ("type not a string", {"type": 5}, "invalid_message"),
    ("speak without text", {"type": "speak"}, "invalid_message"),
    ("unknown type", {"type": "spek", "text": "Hi."}, "unknown_type"),
    ("empty type", {"type": ""}, "unknown_type"),
    ("binary", b"\x01\x01\x00\x00garbage", "unexpected_binary"),
    ("binary json", b'{"type": "ping"}', "unexpected_binary"),
    ("text too long", {"type": "speak", "text": "x" * 20_001}, "text_too_long"),
    ("unknown voice update", {"type": "session.update", "voice": "nobody"}, "unknown_voice"),
    ("unknown voice speak", {"type": "speak", "text": "Hi.", "voice": "nobody"}, "unknown_voice"),
    ("speed 0", {"type": "session.update", "speed": 0}, "invalid_parameter"),
    ("speed 5", {"type": "session.update", "speed": 5}, "invalid_parameter"),
    ("speed string", {"type": "session.update", "speed": "fast"}, "invalid_parameter"),
    ("speed bool", {"type": "session.update", "speed": True}, "invalid_parameter"),
    (
        "temperature -1",
        {"type": "session.update", "sampling": {"temperature": -1}},
        "invalid_parameter",
    ),
    ("top_k 1.5", {"type": "session.update", "sampling": {"top_k": 1.5}}, "invalid_parameter"),
    ("top_p 0", {"type": "session.update", "sampling": {"top_p": 0}}, "invalid_parameter"),
    ("seed -1", {"type": "session.update", "sampling": {"seed": -1}}, "invalid_parameter"),
    ("codec mp3", {"type": "session.update", "format": {"codec": "mp3"}}, "invalid_parameter"),
    (
        "codec list",
        {"type": "session.update", "format": {"codec": ["opus"]}},
        "invalid_parameter",
    ),
    (
        "pcm16 11025",
        {"type": "session.update", "format": {"codec": "pcm16", "sample_rate": 11025}},
        "invalid_parameter",
    ),
    ("bitrate 1", {"type": "session.update", "format": {"bitrate": 1}}, "invalid_parameter"),
    ("unknown setting", {"type": "session.update", "volume": 2}, "invalid_parameter"),
    (
        "unknown sampling key",
        {"type": "session.update", "sampling": {"min_p": 0.1}},
        "invalid_parameter",
    ),
    ("text not a string", {"type": "speak", "text": 5}, "invalid_parameter"),
    ("second start", {"type": "session.start"}, "session_already_started"),
    ("text.end with no turn", {"type": "text.end"}, "no_open_turn"),
    ("cancel unknown turn", {"type": "cancel", "turn_id": "nope"}, "unknown_turn"),
    ("end unknown turn", {"type": "text.end", "turn_id": "nope"}, "unknown_turn"),
    (
        "playback unknown turn",
        {"type": "playback", "turn_id": "nope", "played_ms": 0},
        "unknown_turn",
    ),
    ("playback no turn_id", {"type": "playback", "played_ms": 0}, "invalid_message"),
    (
        "playback negative",
        {"type": "playback", "turn_id": "t1", "played_ms": -5},
        "invalid_parameter",
    ),
    (
        "playback reports string",
        {"type": "session.update", "playback": {"reports": "yes"}},
        "invalid_parameter",
    ),
    (
        "playback timeout 1e9",
        {"type": "session.update", "playback": {"timeout_ms": 10**9}},
        "invalid_parameter",
    ),
    (
        "input rate float",
        {"type": "session.update", "input": {"sample_rate": 16000.0}},
        "invalid_parameter",
    ),
]


@pytest.mark.parametrize(("message", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_its_error_and_the_session_still_speaks(
    shared_server: BackgroundServer, message: Message, code: str
) -> None:
    async def go() -> None:
        async with connect(shared_server.url) as ws:
            c = Client(ws)
            created = await c.start(voice="narrator", sampling={"seed": 1})
            await c.send(message)
            await expect_error(c, code)
            await c.send({"type": "ping"})
            assert (await c.event()) == {"type": "pong"}
            result = await still_speaks(c)
            # settings were not disturbed by the bad message
            assert result.event("turn.started")["voice"] == "narrator"
            assert result.event("turn.started")["turn_id"] == "t1"
            assert created["settings"]["voice"] == "narrator"  # as started, not as attempted

    run(go())


BEFORE_START: list[tuple[str, Message, str]] = [
    ("speak", {"type": "speak", "text": "Hi."}, "session_not_started"),
    ("text.delta", {"type": "text.delta", "text": "Hi."}, "session_not_started"),
    ("text.end", {"type": "text.end"}, "session_not_started"),
    ("update", {"type": "session.update", "voice": "narrator"}, "session_not_started"),
    ("cancel", {"type": "cancel"}, "session_not_started"),
    ("bad json", "{", "invalid_json"),
    ("binary", b"\x00\x01", "session_not_started"),
    ("unknown voice", {"type": "session.start", "voice": "nobody"}, "unknown_voice"),
    ("bad speed", {"type": "session.start", "speed": "fast"}, "invalid_parameter"),
    ("unknown key", {"type": "session.start", "volume": 1}, "invalid_parameter"),
]


@pytest.mark.parametrize(
    ("message", "code"), [c[1:] for c in BEFORE_START], ids=[c[0] for c in BEFORE_START]
)
def test_bad_input_before_session_start_gets_its_error_and_start_still_works(
    shared_server: BackgroundServer, message: Message, code: str
) -> None:
    async def go() -> None:
        async with connect(shared_server.url) as ws:
            c = Client(ws)
            await c.send(message)
            await expect_error(c, code)
            created = await c.start()
            assert created["settings"]["voice"] == "agent"
            await still_speaks(c)

    run(go())


def test_repeated_bad_input_never_closes_the_session(shared_server: BackgroundServer) -> None:
    async def go() -> None:
        async with connect(shared_server.url) as ws:
            c = Client(ws)
            await c.start()
            for case in CASES * 2:
                await c.send(case[1])
            for case in CASES * 2:
                await expect_error(c, case[2])
            first = await still_speaks(c)
            assert first.event("turn.done")["turn_id"] == "t1"
            assert (await still_speaks(c)).event("turn.done")["turn_id"] == "t2"

    run(go())


# -- limits ---------------------------------------------------------------------------------


def test_text_over_the_limit_across_deltas_is_rejected_and_the_turn_still_plays(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server(limits=Limits(max_text_chars=20), playout=UNPACED)

    async def go() -> None:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "text.delta", "text": "Hi there, "})
            await c.send({"type": "text.delta", "text": "x" * 11})  # 21 in all
            await c.send({"type": "text.end"})
            result = await c.turn()
            errors = [e for e in result.events if e["type"] == "error"]
            assert [e["code"] for e in errors] == ["text_too_long"]
            assert "turn_id" not in errors[0]
            result.events.remove(errors[0])
            assert_complete(result)
            # a whole turn over the limit is rejected up front; the next one plays
            await c.send({"type": "speak", "text": "y" * 21})
            await expect_error(c, "text_too_long")
            again = await still_speaks(c, "x" * 20)
            assert again.event("turn.done")["turn_id"] == "t2"

    run(go())


def test_a_message_over_the_session_limit_is_message_too_large_and_the_session_goes_on(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server(limits=Limits(max_message_bytes=1024), playout=UNPACED)

    async def go() -> None:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.send({"type": "session.start", "voice": "x" * 2000})
            await expect_error(c, "message_too_large")
            created = await c.start()
            assert created["limits"]["max_message_bytes"] == 1024
            for size in (1025, 2000, 100_000):
                await c.send(json.dumps({"type": "speak", "text": "x" * size}))
                await expect_error(c, "message_too_large")
            await c.send({"type": "speak", "text": "é" * 600})  # 600 chars, 1200 bytes
            await expect_error(c, "message_too_large")
            await still_speaks(c)

    run(go())


@pytest.mark.parametrize(
    "oversized",
    [b"\x00" * 8193, json.dumps({"type": "speak", "text": "x" * 9000})],
    ids=["binary", "text"],
)
def test_a_message_over_the_hard_cap_closes_only_that_connection_with_1009(
    make_server: Callable[..., BackgroundServer], oversized: str | bytes
) -> None:
    server = make_server(
        hard_max_message_bytes=8192, limits=Limits(max_message_bytes=1024), playout=UNPACED
    )

    async def go() -> None:
        async with connect(server.url) as other, connect(server.url) as ws:
            bystander = Client(other)
            await bystander.start()
            c = Client(ws)
            await c.start()
            await c.send("x" * 4000)  # under the cap: a protocol error, not a close
            await expect_error(c, "message_too_large")
            await c.send(oversized)
            code, received = await closed_with(ws)
            assert code == MESSAGE_TOO_BIG
            assert received == []
            await wait_until(lambda: server.voice_server.admission.sessions == 1)
            # the other session and new clients are served as before
            await still_speaks(bystander)
            async with connect(server.url) as ws2:
                c2 = Client(ws2)
                await c2.start()
                await still_speaks(c2)

    run(go())


def test_over_the_session_limit_a_client_is_refused_with_1013_and_can_retry_later(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server(max_sessions=2, playout=UNPACED)

    async def go() -> None:
        first = await connect(server.url)
        second = await connect(server.url)
        try:
            a, b = Client(first), Client(second)
            await a.start()
            await b.start()
            async with connect(server.url) as third:
                code, received = await closed_with(third)
                assert code == CloseCode.TRY_AGAIN_LATER == 1013
                assert len(received) == 1
                event = json.loads(received[0])
                assert event["type"] == "error" and event["code"] == "too_many_sessions"
            assert server.voice_server.admission.sessions == 2
            await still_speaks(b)  # the admitted sessions are unaffected
        finally:
            await first.close()
        await wait_until(lambda: server.voice_server.admission.sessions == 1)
        try:
            async with connect(server.url) as fourth:
                d = Client(fourth)
                await d.start()
                await still_speaks(d)
                await still_speaks(b)
        finally:
            await second.close()

    run(go())


# -- isolation ------------------------------------------------------------------------------

GARBAGE: list[Message] = [
    "{",
    b"\xff" * 64,
    {"type": "nope"},
    {"type": "session.start"},
    {"type": "session.update", "speed": 99},
    {"type": "speak", "text": "x", "voice": "nobody"},
    {"type": "cancel", "turn_id": "t1"},  # A's turn id, but in B's session: unknown there
    {"type": "text.end"},
    "[" * 10_000,
]

# the same, less what would rightly act on a session's own live turn t1
GARBAGE_SAFE = [m for m in GARBAGE if not (isinstance(m, dict) and m["type"] == "cancel")]


async def _speak_alone(url: str, text: str, seed: int) -> TurnResult:
    async with connect(url) as ws:
        c = Client(ws)
        await c.start(sampling={"seed": seed})
        return await c.speak(text)


def test_bad_input_in_one_session_never_disturbs_another_sessions_turn(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server()  # paced at real time, so the turn overlaps B's garbage
    text, seed = "Hi there.", 11

    async def session_a(done: asyncio.Event) -> TurnResult:
        try:
            async with connect(server.url) as ws:
                c = Client(ws)
                await c.start(sampling={"seed": seed})
                return await c.speak(text)
        finally:
            done.set()

    async def session_b(done: asyncio.Event) -> int:
        """Send garbage (each answered by an error) until A's turn is over; return how
        many were answered while A's turn was still running."""
        sent = during = 0
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(voice="narrator")
            while not done.is_set() or sent < 3 * len(GARBAGE):
                message = GARBAGE[sent % len(GARBAGE)]
                await c.send(message)
                event = await c.event()
                assert event["type"] == "error", event
                sent += 1
                during += not done.is_set()
                await asyncio.sleep(0.005)
            await still_speaks(c)
        return during

    async def go() -> tuple[TurnResult, TurnResult, int]:
        alone = await _speak_alone(server.url, text, seed)
        done = asyncio.Event()
        together, during = await asyncio.gather(session_a(done), session_b(done))
        return alone, together, during

    alone, together, during = run(go())
    assert during >= len(GARBAGE), "B's garbage did not overlap A's turn"
    assert_complete(alone)
    assert_complete(together)
    assert len(together.frames) == len(alone.frames)
    assert (
        together.event("turn.done")["timings"]["tokens"]
        == alone.event("turn.done")["timings"]["tokens"]
    )


def test_bad_input_during_a_turn_does_not_disturb_that_turn(
    make_server: Callable[..., BackgroundServer],
) -> None:
    server = make_server()  # paced: the turn is still playing while the garbage arrives
    text, seed = "Hi there.", 4

    async def go() -> tuple[TurnResult, TurnResult]:
        alone = await _speak_alone(server.url, text, seed)
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(sampling={"seed": seed})
            await c.send({"type": "speak", "text": text})
            for message in GARBAGE_SAFE:
                await c.send(message)
            during = await c.turn()
        return alone, during

    alone, during = run(go())
    errors = [e for e in during.events if e["type"] == "error"]
    assert len(errors) == len(GARBAGE_SAFE)
    assert all("turn_id" not in e for e in errors), errors
    for e in errors:
        during.events.remove(e)
    assert_complete(during)
    assert len(during.frames) == len(alone.frames)


def test_text_that_makes_a_reading_rule_backtrack_is_spoken_and_stalls_no_one(
    make_server: Callable[..., BackgroundServer],
) -> None:
    """What was seen: 40 x's in a turn's text held the event loop for seconds (the
    masked-number reading, `****1234`, backtracked exponentially; 50 would have held it
    for minutes, every session with it)."""
    server = make_server(playout=UNPACED)

    async def go() -> TurnResult:
        async with connect(server.url) as ws_a, connect(server.url) as ws_b:
            a, b = Client(ws_a), Client(ws_b)
            await a.start()
            await b.start()
            turn = await a.speak("x" * 60 + " and " + "*" * 60 + ".")
            await still_speaks(b)
            return turn

    assert_complete(run(go()))
