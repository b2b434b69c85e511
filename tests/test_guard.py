"""Greedy and broken clients (transport/guard.py): a flood of messages is dropped and
then closed without holding anyone else up, a socket that never starts a session or sits
idle is closed, a client that stops reading loses its session, an address opening
connections too fast is refused before the upgrade, and nothing a client sends puts a
traceback in the log.

The gates are checked with a clock of our own; the rest against real servers on
loopback with real websockets clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable

import httpx
import pytest
import websockets
from conftest import run

from voiceagent.bench.clients import Client, connect, open_peer
from voiceagent.protocol.errors import CloseCode, ErrorCode
from voiceagent.server.background import BackgroundServer
from voiceagent.session.playout import PlayoutConfig
from voiceagent.transport.guard import (
    ConnectionGate,
    Deadlines,
    GuardConfig,
    MessageGate,
    Verdict,
)

LONG_TEXT = "This answer goes on and on, so that there is plenty of audio to send. " * 8


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def closed_after(ws: websockets.ClientConnection) -> tuple[int, list[str]]:
    """Read until the server closes; its close code and the text messages before it."""
    texts = []
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            message = await asyncio.wait_for(ws.recv(), 15)
            if isinstance(message, str):
                texts.append(message)
    assert closed.value.rcvd is not None, "closed without a close frame"
    return closed.value.rcvd.code, texts


# -- the gates, on a clock of our own ----------------------------------------------------


def test_a_connection_within_its_rate_passes_and_a_burst_is_allowed() -> None:
    gate = MessageGate(GuardConfig(messages_per_s=10, message_burst=5))
    assert [gate.check(0.0) for _ in range(5)] == [Verdict.PASS] * 5
    assert gate.check(0.0) is Verdict.WARN  # the sixth at once is over: read it later
    assert gate.delay == pytest.approx(0.1)
    assert gate.check(0.0) is Verdict.WAIT  # the client is told once a second
    assert gate.delay == pytest.approx(0.2)  # each one a token's time after the other
    assert gate.check(1.0) is Verdict.PASS  # the debt is paid off


def test_a_connection_held_back_for_too_long_is_closed() -> None:
    config = GuardConfig(messages_per_s=10, message_burst=1, flood_close_s=2.0)
    gate = MessageGate(config)
    now, verdicts = 0.0, []
    while Verdict.CLOSE not in verdicts and now < 10:
        verdicts.append(gate.check(now))
        now += gate.delay  # a client that always has the next message ready
    assert verdicts[-1] is Verdict.CLOSE
    assert 2.0 <= now <= 2.2
    # a client that pauses once in a while is only slowed down
    calm = MessageGate(config)
    now, verdicts = 0.0, []
    for i in range(100):
        verdicts.append(calm.check(now))
        now += calm.delay + (0.3 if i % 10 == 9 else 0.0)
    assert Verdict.CLOSE not in verdicts and Verdict.WAIT in verdicts


def test_new_connections_per_address_are_limited_and_loopback_is_exempt() -> None:
    gate = ConnectionGate(GuardConfig(connections_per_s=1, connection_burst=2))
    assert [gate.admit("198.51.100.7", 0.0) for _ in range(3)] == [True, True, False]
    assert gate.admit("198.51.100.8", 0.0)  # another address has its own budget
    assert gate.admit("198.51.100.7", 1.0)  # a second later, one more
    assert all(gate.admit("127.0.0.1", 0.0) for _ in range(100))
    assert all(gate.admit("::1", 0.0) for _ in range(100))


def test_the_connection_gate_forgets_idle_addresses_beyond_its_size() -> None:
    gate = ConnectionGate(GuardConfig(connections_per_s=10, connection_burst=10))
    gate.MAX_TRACKED = 100
    for i in range(100):
        gate.admit(f"198.51.100.{i}", 0.0)
    gate.admit("203.0.113.1", 60.0)  # the others have long refilled: forgotten
    assert list(gate.buckets) == ["203.0.113.1"]


def test_deadlines_give_a_start_its_time_and_idleness_counts_from_the_last_turn() -> None:
    clock = Deadlines(GuardConfig(start_timeout_s=5, idle_timeout_s=2), now=100.0)
    assert clock.next(100.0, started=False, idle_since=100.0) == 105.0
    assert clock.expired(104.9, False, 100.0) is None
    assert clock.expired(105.0, False, 100.0) is ErrorCode.SESSION_START_TIMEOUT
    clock.heard(103.0)  # session.start, then a speak
    assert clock.expired(110.0, True, None) is None  # a turn is live: never idle
    assert clock.next(110.0, True, None) == 112.0  # (look again then)
    # the turn ended at 111, long after the last message: idle from 111, not from 103
    assert clock.next(111.5, True, 111.0) == 113.0
    assert clock.expired(112.9, True, 111.0) is None
    assert clock.expired(113.0, True, 111.0) is ErrorCode.IDLE_TIMEOUT
    clock.heard(112.5)  # a message after the turn counts from itself
    assert clock.next(112.6, True, 111.0) == 114.5
    never = Deadlines(GuardConfig(idle_timeout_s=0), now=0.0)
    assert never.next(1e6, True, 0.0) is None and never.expired(1e6, True, 0.0) is None


# -- real servers ---------------------------------------------------------------------


def test_a_socket_that_never_starts_a_session_is_closed_and_frees_its_slot(
    make_server,
) -> None:
    server = make_server(max_sessions=1, guard=GuardConfig(start_timeout_s=0.5))

    async def go() -> None:
        async with connect(server.url) as ws:
            code, texts = await closed_after(ws)
        assert code == CloseCode.POLICY_VIOLATION
        assert json.loads(texts[-1])["code"] == "session_start_timeout"
        await wait_until(lambda: server.voice_server.admission.sessions == 0)
        async with connect(server.url) as ws:  # the slot is free for someone else
            await Client(ws).start()

    run(go())


def test_an_idle_session_is_closed_only_when_nothing_plays(make_server) -> None:
    server = make_server(guard=GuardConfig(idle_timeout_s=0.6), playout=PlayoutConfig(lead_ms=200))

    async def go() -> None:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            # a turn that plays for longer than the idle timeout is not cut
            done = (await c.speak(LONG_TEXT[:200])).event("turn.done")
            done_at = time.monotonic()
            assert done["sent_ms"] > 600
            code, texts = await closed_after(ws)
            # and once it ends, the session has the whole timeout (what was seen: closed
            # 0.2-0.4 s after turn.done with a timeout of 1 s, counted from the speak; here
            # 5 ms). Less a busy client's lateness in reading turn.done.
            assert time.monotonic() - done_at >= 0.6 - 0.25
        assert code == CloseCode.POLICY_VIOLATION
        assert json.loads(texts[-1])["code"] == "idle_timeout"

    run(go())


def test_a_turn_left_waiting_for_text_does_not_keep_an_idle_connection_open(
    make_server,
) -> None:
    """What was seen: a client that opened a turn (text.delta, or a Cartesia context with
    continue: true) and then went quiet held its session and a live-turn slot for as long
    as it stayed connected, idle timeout or not. Waiting for the client's text is idle:
    the server has nothing to do."""
    server = make_server(guard=GuardConfig(idle_timeout_s=0.6), playout=PlayoutConfig(lead_ms=200))
    admission = server.voice_server.admission
    cartesia = {
        "model_id": "sonic-3",
        "voice": {"mode": "id", "id": next(iter(server.voice_server.engine.model.voices))},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000},
        "context_id": "c",
        "transcript": "Let me check that for you, ",
        "continue": True,
    }

    async def go() -> None:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "text.delta", "text": "Hello there. Let me see"})
            await wait_until(lambda: admission.live_turns == 1)
            code, texts = await closed_after(ws)
        assert code == CloseCode.POLICY_VIOLATION
        assert json.loads(texts[-1])["code"] == "idle_timeout"
        assert any(json.loads(t)["type"] == "turn.first_audio" for t in texts)  # it spoke
        await wait_until(lambda: admission.live_turns == 0 and admission.sessions == 0)
        url = server.url.replace("/v1/ws", "/tts/websocket")
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps(cartesia))
            await wait_until(lambda: admission.live_turns == 1)
            code, texts = await closed_after(ws)
        assert json.loads(texts[-1])["error_code"] == "idle_timeout"
        await wait_until(lambda: admission.live_turns == 0 and admission.sessions == 0)

    run(go())


def test_a_webrtc_peer_that_never_starts_is_closed_and_frees_its_slot(make_server) -> None:
    # What was seen: a silent WebRTC peer held its session slot for as long as it stayed
    # connected (the server refused everyone else).
    server = make_server(max_sessions=1, guard=GuardConfig(start_timeout_s=0.5))

    async def go() -> None:
        peer = await open_peer(server.http)
        try:
            error = await peer.event(("error",), 15)
            closing = await peer.event(("session.closing",), 15)
        finally:
            await peer.close()
        assert error["code"] == "session_start_timeout"
        assert closing["code"] == CloseCode.POLICY_VIOLATION
        await wait_until(lambda: server.voice_server.admission.sessions == 0)
        async with connect(server.url) as ws:  # the slot is free for someone else
            await Client(ws).start()

    run(go())


def test_a_quiet_drop_in_socket_outlives_the_start_timeout_and_ends_at_its_quiet_limit(
    make_server, monkeypatch
) -> None:
    """Cartesia and ElevenLabs clients open their socket before there is text (Pipecat at
    the pipeline's start, LiveKit's prewarm). What was seen: closed with
    session_start_timeout 10 s after opening, so LiveKit's prewarmed socket was dead when
    first used and Pipecat reconnected every 10 s. A quiet socket stays until its API's
    own limit (Cartesia's 5 minutes; ElevenLabs' inactivity_timeout), then frees its slot."""
    from voiceagent.compat.cartesia import CartesiaSocket

    assert CartesiaSocket.quiet_limit_s == 300.0
    monkeypatch.setattr(CartesiaSocket, "quiet_limit_s", 2.0)  # 5 minutes, scaled down
    server = make_server(max_sessions=1, guard=GuardConfig(start_timeout_s=0.3))
    admission = server.voice_server.admission
    cartesia = server.url.replace("/v1/ws", "/tts/websocket")
    voice = next(iter(server.voice_server.engine.model.voices))
    elevenlabs = server.url.replace("/v1/ws", f"/v1/text-to-speech/{voice}/multi-stream-input")

    async def go() -> None:
        quiet = [
            (cartesia, 2.0, "error_code"),
            (elevenlabs + "?inactivity_timeout=1", 1.0, "error"),
        ]
        for url, limit_s, code_field in quiet:
            async with websockets.connect(url) as ws:
                opened = time.monotonic()
                code, texts = await closed_after(ws)
                assert time.monotonic() - opened >= limit_s - 0.1, url
            assert code == CloseCode.POLICY_VIOLATION
            assert json.loads(texts[-1])[code_field] == "idle_timeout"
            await wait_until(lambda: admission.sessions == 0)
        async with connect(server.url) as ws:  # the slot is free for someone else
            await Client(ws).start()

    run(go())


def test_a_flooding_connection_is_held_back_then_closed_while_others_speak(
    make_server,
) -> None:
    guard = GuardConfig(messages_per_s=50, message_burst=50, flood_close_s=1.5)
    server = make_server(guard=guard, playout=PlayoutConfig(lead_ms=200))

    async def flood() -> tuple[list[str], int, float]:
        """Send pings without pause while a reader keeps what arrives (the close frame
        itself may be lost: closing a socket with the flood unread resets it)."""
        async with connect(server.url) as ws:
            await Client(ws).start()
            texts: list[str] = []

            async def read() -> None:
                with contextlib.suppress(websockets.ConnectionClosed):
                    async for message in ws:
                        texts.append(str(message))

            reader = asyncio.create_task(read())
            t0, sent = time.monotonic(), 0
            with pytest.raises(websockets.ConnectionClosed):
                while time.monotonic() - t0 < 20:
                    await ws.send('{"type": "ping"}')
                    sent += 1
                    if sent % 100 == 0:
                        await asyncio.sleep(0)  # let the reader run; still ~10,000/s
            await reader
            return texts, sent, time.monotonic() - t0

    async def speak() -> dict:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            await asyncio.sleep(0.3)  # the flood is on
            return (await c.speak("Meanwhile, a normal answer.")).event("turn.done")

    async def go() -> None:
        (texts, sent, flooded_for), done = await asyncio.gather(flood(), speak())
        events = [json.loads(t) for t in texts]
        codes = {e["code"] for e in events if e["type"] == "error"}
        assert codes == {"rate_limited"}
        pongs = sum(e["type"] == "pong" for e in events)
        # held back to its rate: the burst, then 50/s, while the kernel held the rest
        assert pongs <= 50 + 50 * flooded_for + 10 and pongs < sent
        assert 1.0 < flooded_for < 15  # flood_close_s after it was first held back
        assert done["sent_ms"] > 0  # the other session spoke all along
        await wait_until(lambda: server.voice_server.admission.sessions == 0)

    run(go())
    assert server.voice_server.metrics.closed.labels("rate_limited")._value.get() == 1


def test_a_client_that_stops_reading_loses_its_session_and_nobody_waits(
    make_server,
) -> None:
    guard = GuardConfig(send_timeout_s=1.0)
    server = make_server(guard=guard, playout=PlayoutConfig(lead_ms=100_000))
    host, port = server.url.split("//")[1].split("/")[0].split(":")

    async def go() -> None:
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled = await websockets.connect(server.url, sock=sock, max_queue=1, max_size=None)
        try:
            await stalled.send(json.dumps({"type": "session.start", "format": {"codec": "pcm16"}}))
            await stalled.send(json.dumps({"type": "speak", "text": LONG_TEXT * 4}))
            # ... and never reads again
            await wait_until(lambda: server.voice_server.admission.sessions == 1)
            async with connect(server.url) as ws:
                c = Client(ws)
                await c.start()
                assert (await c.speak("I am still served.")).frames
            # the socket's buffers hold seconds of audio: made at the model's pace, which a
            # busy machine slows (20 s was not always enough beside the suite's other process)
            await wait_until(lambda: server.voice_server.admission.sessions == 0, 60)
            # the close is counted just after the session gives its slot back
            closed = server.voice_server.metrics.closed.labels("slow_consumer")._value
            await wait_until(lambda: closed.get() == 1)
        finally:
            stalled.transport.abort()

    run(go())
    assert server.voice_server.admission.live_turns == 0


SPEECH = {"model": "tts-1", "response_format": "pcm", "input": LONG_TEXT * 6}
CARTESIA_BYTES = {
    "model_id": "sonic-3",
    "output_format": {"container": "wav", "encoding": "pcm_s16le", "sample_rate": 24000},
    "transcript": LONG_TEXT * 6,
}


ELEVENLABS = {"text": LONG_TEXT * 6}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/audio/speech", SPEECH),
        ("/tts/bytes", CARTESIA_BYTES),
        ("/v1/text-to-speech/{voice}/stream/with-timestamps?output_format=pcm_24000", ELEVENLABS),
    ],
    ids=["openai", "cartesia", "elevenlabs-timestamps"],
)
def test_an_http_client_that_stops_reading_gives_back_its_live_turn(
    make_server, path: str, body: dict
) -> None:
    """What was seen: synthesis paused 10 s of audio ahead of a reader that stopped, and
    its live-turn slot stayed taken for as long as the connection stayed open: two
    such readers, and everyone else got server_busy."""
    server = make_server(max_live_turns=1, guard=GuardConfig(send_timeout_s=0.5))
    admission = server.voice_server.admission
    voice = next(iter(server.voice_server.engine.model.voices))
    host, port = server.http.split("//")[1].split(":")
    named = {"voice": voice} if body is SPEECH else {"voice": {"mode": "id", "id": voice}}
    payload = json.dumps(body | (named if body is not ELEVENLABS else {})).encode()
    path = path.format(voice=voice)

    async def go() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        try:
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            # ... and never reads
            await wait_until(lambda: admission.live_turns == 1)
            # its buffers fill at the model's pace, which a busy machine slows
            await wait_until(lambda: admission.live_turns == 0, 90)
            async with httpx.AsyncClient(timeout=30) as http:  # the slot serves another
                short = SPEECH | {"input": "Hi.", "voice": voice}
                assert (await http.post(f"{server.http}/v1/audio/speech", json=short)).content
        finally:
            sock.close()

    run(go())
    closed = server.voice_server.metrics.closed.labels("slow_consumer")._value
    assert closed.get() == 1


def test_an_address_opening_connections_too_fast_gets_429_before_the_upgrade(
    tiny_model, tmp_path
) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    from voiceagent.auth.gate import AuthConfig
    from voiceagent.server.app import ServerConfig
    from voiceagent.server.background import free_port

    config = ServerConfig(
        host="0.0.0.0",
        port=free_port(),
        guard=GuardConfig(connections_per_s=1, connection_burst=2),
        auth=AuthConfig(mode="off"),  # this test is about the connection rate alone
    )
    with BackgroundServer(tiny_model, config):
        url = f"ws://{address}:{config.port}/v1/ws"

        async def go() -> int:
            async with connect(url) as a, connect(url) as b:
                await Client(a).start()
                await Client(b).start()
                with pytest.raises(websockets.InvalidStatus) as refused:
                    await connect(url)
                return refused.value.response.status_code

        assert run(go()) == 429
        offer = httpx.post(f"http://{address}:{config.port}/v1/webrtc/offer", json={})
        assert offer.status_code == 429 and offer.json()["code"] == "rate_limited"
        assert offer.headers["retry-after"] == "1"

        async def cartesia() -> tuple[int, dict]:  # in the API's own error shape
            with pytest.raises(websockets.InvalidStatus) as refused:
                await connect(f"ws://{address}:{config.port}/tts/websocket")
            response = refused.value.response
            return response.status_code, json.loads(response.body)

        status, body = run(cartesia())
        assert status == 429 and body["error_code"] == "rate_limited"


def test_invalid_utf8_from_a_client_is_one_info_line_not_an_error_with_traceback(
    server: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="uvicorn.error")  # the server set WARNING

    async def go() -> int:
        async with connect(server.url) as ws:
            await ws.send(b"\xff\xfe not UTF-8", text=True)
            code, _ = await closed_after(ws)
            return code

    assert run(go()) == 1007
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    noted = [r for r in caplog.records if "Invalid UTF-8" in r.getMessage()]
    assert noted and all(r.levelno == logging.INFO and not r.exc_info for r in noted)


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_the_server_refuses_compressed_messages(server: BackgroundServer) -> None:
    # What was seen: permessage-deflate was on, so a 4 KB frame could expand to a 4 MiB
    # message on the server; one connection at 137 such messages a second (under the
    # message rate) held a core, and other sessions' pings took up to 656 ms.
    async def go() -> str | None:
        async with websockets.connect(server.url, compression="deflate") as ws:  # offered
            await Client(ws).start()
            return ws.response.headers.get("Sec-WebSocket-Extensions")

    assert run(go()) is None  # not taken up: every message arrives at its own size
