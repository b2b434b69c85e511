"""A socket-level fuzz of a running server: MESSAGES malformed messages over CONNECTIONS
real WebSocket connections on loopback, each paced to PER_SECOND messages a second
(below the per-session rate limit) and read concurrently.

The messages: valid ones mutated (bytes flipped, cut, repeated, spliced), random JSON
shapes from hostile_json.py (huge numbers, NaN, lone surrogates, nesting past the
recursion limit), random text, random bytes as binary (invalid UTF-8 among them),
truncated audio frames, nesting up to and past `max_message_bytes`, and huge numbers in
every setting.

Each connection keeps a mirror of its session: a local SessionCore with the server's
catalog and limits, fed the same messages. A candidate is sent only if the mirror answers
it with exactly one event (so no turn ever opens, and every message has one answer),
and the server's answer must be that event: same type, same error code. A `rate_limited`
error counts as an answer (and ends the comparison on that connection, whose session may
then differ from its mirror); a close must carry a code from docs/protocol.md.

Afterwards the server is alive (/healthz), a new session speaks a turn with audio, and no
server log record at ERROR carries a traceback. The totals are printed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import struct
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import run
from hostile_json import Reader, message

from voiceagent.bench.clients import Client, connect
from voiceagent.protocol.errors import CloseCode
from voiceagent.protocol.session import Catalog, Limits, SendEvent, SessionCore
from voiceagent.server.background import BackgroundServer
from voiceagent.session.playout import PlayoutConfig
from voiceagent.telephony.events import Invalid
from voiceagent.telephony.media_streams import TWILIO, JsonStream
from voiceagent.transport.guard import GuardConfig

MESSAGES = int(os.environ.get("VOICEAGENT_SOCKET_FUZZ_MESSAGES", "50000"))
CONNECTIONS = 48
PER_SECOND = 50  # per connection: the whole run takes MESSAGES / 2400 s at best
SEED = 13
HARD_CAP = 256 * 1024  # the server's transport cap for this test (4 MiB by default)
MESSAGE_TOO_BIG = 1009
DOCS = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"

VALID: list[dict[str, Any]] = [
    {"type": "session.start"},
    {"type": "session.start", "voice": "agent", "speed": 1.2, "sampling": {"seed": 3}},
    {"type": "session.update", "format": {"codec": "pcm16", "sample_rate": 16000}},
    {"type": "session.update", "barge_in": {"mode": "duck", "guard_ms": 200}},
    {"type": "session.update", "input": {"sample_rate": 16000, "vad_aggressiveness": 1}},
    {"type": "session.update", "playback": {"reports": True, "timeout_ms": 300}},
    {
        "type": "session.update",
        "format": {"codec": "mulaw", "framing": "twilio", "stream_sid": "MZ"},
    },
    {"type": "speak", "text": "Hello there.", "turn_id": "a1", "voice": "agent"},
    {"type": "text.delta", "text": "Hello, ", "turn_id": "d1"},
    {"type": "text.flush"},
    {"type": "text.end", "turn_id": "d1"},
    {"type": "cancel", "turn_id": "a1"},
    {"type": "playback", "turn_id": "a1", "played_ms": 120, "stopped": True},
    {"type": "ping"},
    {"event": "mark", "streamSid": "MZ", "mark": {"name": "m1"}},
    {"event": "media", "streamSid": "MZ", "media": {"payload": "//79/A=="}},
]
START_SETTINGS: list[dict[str, Any]] = [
    {},
    {"voice": "narrator", "playback": {"reports": True}},
    {"input": {"sample_rate": 16000}, "barge_in": {"mode": "cancel"}},  # binary is audio
    {"format": {"codec": "mulaw", "framing": "twilio", "stream_sid": "MZ"}},  # forwarded
    {"format": {"codec": "pcm16", "sample_rate": 24000, "framing": "raw"}},
]
TOKENS = ['"', "{", "}", "[", "]", ",", ":", "\\", "\\u", "\\ud800", "null", "1e400", "-", "\x00"]


def documented_close_codes() -> set[int]:
    """The close codes in docs/protocol.md's "Close codes" table."""
    text = DOCS.read_text()
    section = text[text.index("## Close codes") :]
    section = section[: section.index("\n## ", 3)]
    return {int(code) for code in re.findall(r"^\| `(\d{4})`", section, re.M)}


def mutate(rng: random.Random, text: str) -> str:
    """A valid message, broken one to four ways."""
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(text) + 1)
        j = min(len(text), i + rng.randint(1, 12))
        how = rng.randrange(7)
        if how == 0:
            text = text[:i] + chr(rng.randrange(0x20, 0x3000)) + text[i + 1 :]
        elif how == 1:
            text = text[:i] + text[j:]
        elif how == 2:
            text = text[:i] + text[i:j] * rng.randint(2, 50) + text[j:]
        elif how == 3:
            text = text[:i] + rng.choice(TOKENS) + text[i:]
        elif how == 4:
            text = text[:i]
        elif how == 5:
            other = json.dumps(rng.choice(VALID))
            text = text[:i] + other[rng.randrange(len(other)) :]
        else:
            text = text[:i] + str(rng.choice([10**400, -(10**309), 2**63, 1e308])) + text[j:]
    return text


def candidate(rng: random.Random, max_bytes: int) -> str | bytes:
    """One message to try (the mirror decides whether it is sent)."""
    roll = rng.random()
    if roll < 0.40:
        return mutate(rng, json.dumps(rng.choice(VALID)))
    if roll < 0.65:
        return message(Reader(rng.randbytes(rng.randint(4, 96))))
    if roll < 0.72:
        return "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randint(0, 40)))
    if roll < 0.82:
        data = rng.randbytes(rng.randint(0, 64))  # mostly invalid UTF-8, odd lengths
        return data if rng.random() < 0.5 else b"\xff\xfe" + data
    if roll < 0.87:  # an audio frame cut short, or a frame where microphone audio goes
        frame = struct.pack("!BBHIII", 1, rng.randint(0, 5), 0, 1, 2, 40) + rng.randbytes(10)
        return frame[: rng.randrange(len(frame) + 1)]
    if roll < 0.94:  # huge numbers where every setting wants a small one
        group, key = rng.choice(
            [(None, "speed"), ("sampling", "temperature"), ("sampling", "seed"),
             ("format", "bitrate"), ("barge_in", "duck_gain"), ("playback", "timeout_ms"),
             ("input", "sample_rate"), (None, "played_ms")]
        )  # fmt: skip
        number = rng.choice(
            ["9" * rng.randint(19, 4300), "1e400", "-1e999", "NaN", "1" + "0" * 400]
        )
        body = f'"{key}":{number}' if group is None else f'"{group}":{{"{key}":{number}}}'
        if rng.random() < 0.2:
            return f'{{"type":"playback","turn_id":"a1",{body}}}'
        return f'{{"type":"{rng.choice(["session.update", "session.start"])}",{body}}}'
    # nesting up to and past the message size limit
    n = rng.choice([500, 1000, 5000, max_bytes // 2 - 20, max_bytes // 2 + 1])
    inner = "[" * n + "]" * n if rng.random() < 0.5 else '{"a":' * (n // 5) + "1" + "}" * (n // 5)
    if rng.random() < 0.3:  # shaped as a Twilio message a bot forwards
        return '{"event":"media","media":' + inner + "}"
    return '{"type":"ping","x":' + inner + "}"


@dataclass
class Tally:
    sent: int = 0  # fuzz messages
    setup: int = 0  # a valid session.start first, a ping last
    kinds: Counter[str] = field(default_factory=Counter)  # what was sent
    answers: Counter[str] = field(default_factory=Counter)  # what came back
    closes: Counter[int] = field(default_factory=Counter)
    skipped: int = 0  # candidates the mirror said would open a turn or get no answer
    mismatches: list[str] = field(default_factory=list)
    unanswered: int = 0
    cut_off: int = 0  # messages whose answer a close replaced
    connections: int = 0


class Mirror:
    """What the server's session for this connection will answer, or None to skip."""

    def __init__(self, catalog: Catalog, limits: Limits) -> None:
        self.catalog, self.limits = catalog, limits
        self.core = SessionCore("mirror", catalog, limits)
        self.twilio = JsonStream(TWILIO)
        self.raised: list[str] = []

    def predict(self, msg: str | bytes) -> dict[str, Any] | None:
        size = len(msg.encode() if isinstance(msg, str) else msg)
        if size > HARD_CAP:
            return {"type": "close", "code": MESSAGE_TOO_BIG}
        settings = self.core.settings
        fmt = settings.format if settings else None
        forwarded = isinstance(msg, str) and '"event"' in msg and '"type"' not in msg
        if forwarded and fmt and fmt.framing == "twilio":  # as WebSocketTransport.forwarded
            assert isinstance(msg, str)
            self.twilio.info = None
            self.twilio.parse_text(
                '{"event":"start","streamSid":"MZ","start":{"mediaFormat":'
                '{"encoding":"audio/x-mulaw","sampleRate":8000}}}'
            )
            try:
                event: Any = self.twilio.parse_text(msg)
            except Exception as exc:  # a parser bug: send it, and see what the server does
                event = Invalid(repr(exc))
            if isinstance(event, Invalid):
                return {"type": "error", "code": "invalid_carrier_message"}
            return None  # marks, media, ...: nothing is answered
        try:
            actions = (
                self.core.receive_text(msg)
                if isinstance(msg, str)
                else self.core.receive_bytes(msg)
            )
        except Exception as exc:  # a bug in the core: send it, and see what the server does
            self.raised.append(f"the mirror raised {exc!r} on {msg[:200]!r}")
            self.core = SessionCore("mirror", self.catalog, self.limits, settings=settings)
            return {"type": "error", "code": "(the core raised)"}
        if len(actions) == 1 and isinstance(actions[0], SendEvent):
            return actions[0].event
        # a turn (or microphone audio) would start: forget it, as the server never sees it
        self.core = SessionCore("mirror", self.catalog, self.limits, settings=settings)
        return None


async def read_answers(
    ws: Any, expected: deque[dict[str, Any]], state: dict[str, bool], tally: Tally
) -> None:
    """Match each answer with the mirror's prediction for the oldest unanswered message."""
    try:
        async for reply in ws:
            if not isinstance(reply, str):
                tally.mismatches.append(f"binary frame {reply[:32]!r}")
                continue
            event = json.loads(reply)
            code = event.get("code")
            tally.answers[f"error:{code}" if code else event["type"]] += 1
            want = expected.popleft() if expected else None
            if code == "rate_limited":
                state["compare"] = False
            elif want is None:
                tally.mismatches.append(f"unasked answer {reply[:200]}")
            elif state["compare"] and (event["type"], code) != (want["type"], want.get("code")):
                tally.mismatches.append(f"wanted {want}, got {reply[:200]}")
    except websockets.ConnectionClosed:
        pass


async def fuzz_connection(
    url: str, mirror_of: Callable[[], Mirror], count: int, rng: random.Random, tally: Tally
) -> None:
    """Send `count` messages at PER_SECOND, over as many connections as the server's
    closes make it take."""
    close_codes = documented_close_codes()
    while count > 0:
        tally.connections += 1
        mirror = mirror_of()
        expected: deque[dict[str, Any]] = deque()
        state = {"compare": True}
        async with websockets.connect(url, max_size=None, compression=None) as ws:
            reader = asyncio.create_task(read_answers(ws, expected, state, tally))
            next_at = time.monotonic()
            try:
                if rng.random() < 0.9:  # most sessions start first; the rest stay unstarted
                    settings = rng.choice(START_SETTINGS)
                    start = json.dumps({"type": "session.start", **settings})
                    want = mirror.predict(start)
                    assert want is not None and want["type"] == "session.created"
                    expected.append(want)
                    await ws.send(start)
                    tally.setup += 1
                while count > 0 and not reader.done():
                    msg = candidate(rng, mirror.limits.max_message_bytes)
                    want = mirror.predict(msg)
                    if want is None:
                        tally.skipped += 1
                        continue
                    next_at += 1 / PER_SECOND
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    expected.append(want)
                    await ws.send(msg)
                    tally.sent += 1
                    tally.kinds["binary" if isinstance(msg, bytes) else "text"] += 1
                    count -= 1
                    if want["type"] == "close":
                        # over the transport cap: the server closes. (Sending on would
                        # race the close: data arriving after the server closed its socket
                        # resets the connection, and the client may see 1006, not 1009.)
                        await asyncio.wait_for(asyncio.shield(reader), 10)
                deadline = time.monotonic() + 60
                while expected and not reader.done() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if not reader.done():  # still answering: the session works
                    expected.append({"type": "pong"})
                    await ws.send('{"type": "ping"}')
                    tally.setup += 1
                    while expected and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
            except websockets.ConnectionClosed:
                pass
            finally:
                if not reader.done():
                    await ws.close()
                await reader
            tally.mismatches += mirror.raised
            code = ws.close_code
            if code is not None and code != CloseCode.NORMAL:
                tally.closes[code] += 1
                if code not in close_codes:
                    tally.mismatches.append(f"undocumented close {code} {ws.close_reason!r}")
                elif expected and expected[-1] == {"type": "close", "code": code}:
                    # the close answers what it cut off too (the server was still on the
                    # messages before the one over the cap when its transport closed)
                    tally.cut_off += len(expected) - 1
                elif state["compare"]:  # not rate limited, yet closed: why?
                    tally.mismatches.append(f"closed with {code}, expecting {list(expected)}")
            elif expected and state["compare"]:
                tally.unanswered += len(expected)


def rss_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status)[1])  # type: ignore[index]


async def closes_with(url: str, send: Callable[[Any], Any]) -> int | None:
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await send(ws)
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        return ws.close_code


def test_a_server_survives_a_socket_fuzz_and_answers_every_message(
    make_server: Callable[..., BackgroundServer],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.WARNING)
    server = make_server(
        max_sessions=CONNECTIONS + 8,
        hard_max_message_bytes=HARD_CAP,
        playout=PlayoutConfig(lead_ms=100_000),
        # A connection that fuzzes before its session.start (one in ten) is started by a
        # fuzzed session.start some seconds in; a busy machine must not turn that into a
        # session_start_timeout the mirror cannot predict (CI saw one).
        guard=GuardConfig(start_timeout_s=600),
    )
    voice = server.voice_server
    tally = Tally()
    rss_before = rss_kib()
    start = time.monotonic()

    async def go() -> dict[str, int | None]:
        per = -(-MESSAGES // CONNECTIONS)
        seeds = random.Random(SEED)
        await asyncio.gather(
            *(
                fuzz_connection(
                    server.url,
                    lambda: Mirror(voice.catalog, voice.limits),
                    min(per, MESSAGES - i * per),
                    random.Random(seeds.getrandbits(64)),
                    tally,
                )
                for i in range(CONNECTIONS)
            )
        )
        # what closes a connection, on purpose: invalid UTF-8 in a text frame, a message
        # over the transport cap
        return {
            "invalid utf-8 text": await closes_with(
                server.url, lambda ws: ws.send(b'{"type": "\xff\xfe"}', text=True)
            ),
            "over the cap": await closes_with(
                server.url, lambda ws: ws.send(b"\x00" * (HARD_CAP + 1))
            ),
        }

    deliberate = run(go())
    took = time.monotonic() - start
    rss_fuzzed = rss_kib()

    async def afterwards() -> int:
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{server.http}/healthz", timeout=10)
            assert health.status_code == 200 and health.json() == {"status": "alive"}
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            result = await c.speak("Still here after all that.")
            assert result.event("turn.done") and result.frames, "no audio after the fuzz"
            return len(result.frames)

    frames = run(afterwards())
    rss_after = rss_kib()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    tracebacks = [r for r in errors if r.exc_info]
    with capsys.disabled():
        print(
            f"\nsocket fuzz: {tally.sent} messages ({dict(tally.kinds)}, and {tally.setup} valid "
            f"session.start and ping messages) over "
            f"{tally.connections} connections in {took:.0f} s; {tally.skipped} candidates "
            f"skipped (they would open a turn or get no answer)\n"
            f"  answers: {dict(tally.answers.most_common())}\n"
            f"  closes by code: {dict(tally.closes)} (cutting off {tally.cut_off} answers to "
            f"earlier messages); deliberate closes: {deliberate}\n"
            f"  unanswered: {tally.unanswered}; mismatches: {len(tally.mismatches)}; "
            f"server ERROR records: {len(errors)}\n"
            f"  RSS before {rss_before // 1024} MiB, after the fuzz {rss_fuzzed // 1024} MiB, "
            f"after a turn {rss_after // 1024} MiB; "
            f"afterwards a turn of {frames} frames"
        )
    assert tally.sent >= MESSAGES
    assert not tally.mismatches, tally.mismatches[:20]
    assert tally.unanswered == 0
    answered = sum(tally.answers.values()) + sum(tally.closes.values()) + tally.cut_off
    assert answered >= tally.sent + tally.setup
    assert deliberate == {"invalid utf-8 text": 1007, "over the cap": 1009}
    assert not tracebacks, [r.getMessage() for r in tracebacks]
    # the invalid UTF-8 frame sent on purpose is one INFO line (transport/guard.py), not this
    assert not errors, [r.getMessage() for r in errors]


# -- WebRTC offers -----------------------------------------------------------------------

OFFERS = 400
OFFER_SEEDS = [
    (Path(__file__).parent / "data" / "fuzz" / "webrtc_offer" / name).read_bytes().decode()
    for name in ("aiortc_sdp", "browser_sdp")
]
SDP_LINES = [
    "a=rtpmap:111 opus/48000/2", "a=rtpmap:96 opus/48000", "a=rtpmap:0 PCMU/8000",
    "a=rtpmap:111 opus/8000/1", "a=rtpmap:126 telephone-event/8000", "a=fmtp:111 x",
    "a=rtcp-fb:111 nack", "a=ssrc:1 cname:x", "a=ssrc-group:FID 1 2", "a=mid:0", "a=mid:",
    "a=setup:active", "a=setup:passive", "a=setup:holdconn", "a=sendonly", "a=recvonly",
    "a=inactive", "a=sctp-port:0", "a=sctp-port:x", "a=max-message-size:-1",
    "a=candidate:1 1 udp 1 1.2.3.4 9 typ host", "a=fingerprint:sha-1 00",
    "a=fingerprint:md5 AA", "a=ice-lite", "a=group:BUNDLE 0", "a=group:BUNDLE 5 6",
    "a=extmap:1 x", "a=rtcp-mux", "c=IN IP6 ::1", "m=audio 9 UDP/TLS/RTP/SAVPF 111",
    "m=audio 0 UDP/TLS/RTP/SAVPF 0", "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
    "a=msid:- -", "a=ice-ufrag:", "a=ice-pwd:", "a=rtcp:9 IN IP4 0.0.0.0",
]  # fmt: skip
# Offers that parsed but broke aiortc after the answer (its connect task raised, or
# closing the peer connection failed half way): each is now refused up front.


def _without_app_ice(sdp: str) -> str:
    audio, app = sdp.split("m=application", 1)
    app = re.sub(r"a=ice-(ufrag|pwd):[^\r]*\r\n", "", app)
    return audio + "m=application" + app


BROKEN_OFFERS: dict[str, Callable[[str], str]] = {
    "an empty a=mid": lambda sdp: sdp.replace("a=mid:0\r\n", "a=mid:0\r\na=mid:\r\n", 1),
    "a data channel without ICE credentials": _without_app_ice,
    "two BUNDLE groups": lambda sdp: sdp.replace(
        "a=group:BUNDLE 0 1\r\n", "a=group:BUNDLE 0 1\r\na=group:BUNDLE 0\r\n", 1
    ),
}


def mutate_sdp(rng: random.Random, sdp: str) -> str:
    """An offer with one to four lines dropped, cut, repeated, added or replaced."""
    lines = sdp.strip("\r\n").split("\r\n")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(1, len(lines))
        how = rng.randrange(5)
        if how == 0:
            del lines[i]
        elif how == 1:
            lines.insert(i, rng.choice(SDP_LINES))
        elif how == 2:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
        elif how == 3:
            lines.insert(i, lines[rng.randrange(len(lines))])
        else:
            lines[i] = rng.choice(SDP_LINES)
    return "\r\n".join(lines) + "\r\n"


def open_fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


def test_mutated_webrtc_offers_get_an_answer_or_invalid_sdp_and_leave_nothing_behind(
    make_server: Callable[..., BackgroundServer],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """OFFERS mutated SDP offers to POST /v1/webrtc/offer: each gets an answer (200) or
    a 4xx with a code, never a 500; the peers never connect, so each session closes at
    the connect deadline; then no session, socket or file is left, and no ERROR was
    logged (aiortc's background tasks included)."""
    from voiceagent.transport.webrtc import WebRtcConfig

    caplog.set_level(logging.WARNING)
    server = make_server(max_sessions=OFFERS + 8, webrtc=WebRtcConfig(connect_timeout_s=0.3))
    gateway = server.voice_server.webrtc
    rng = random.Random(SEED)
    fds_before = open_fds()

    async def go() -> Counter[tuple[int, str]]:
        statuses: Counter[tuple[int, str]] = Counter()
        async with httpx.AsyncClient(timeout=30) as http:
            url = f"{server.http}/v1/webrtc/offer"
            for why, broken in BROKEN_OFFERS.items():
                sdp = broken(OFFER_SEEDS[0])
                assert sdp != OFFER_SEEDS[0]
                reply = await http.post(url, json={"type": "offer", "sdp": sdp})
                assert reply.status_code == 400, (why, reply.text)
                assert reply.json()["code"] == "invalid_sdp", why
            for n in range(OFFERS):
                sdp = rng.choice(OFFER_SEEDS)
                sdp = sdp if n % 20 == 0 else mutate_sdp(rng, sdp)
                reply = await http.post(url, json={"type": "offer", "sdp": sdp})
                body = reply.json()
                statuses[reply.status_code, body.get("code", body.get("type", "?"))] += 1
                assert reply.status_code == 200 or 400 <= reply.status_code < 500, (
                    reply.status_code,
                    body,
                    sdp,
                )
        deadline = time.monotonic() + 30
        while gateway.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return statuses

    statuses = run(go())
    time.sleep(0.5)  # the closed peers' transports let go of their sockets
    fds_after = open_fds()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    with capsys.disabled():
        print(
            f"\nwebrtc offers: {OFFERS} ({dict(statuses)}); sessions left {len(gateway.sessions)}, "
            f"open files {fds_before} before, {fds_after} after; ERROR records {len(errors)}"
        )
    assert statuses[200, "answer"] >= OFFERS // 20  # the unmutated ones at least
    assert not gateway.sessions and server.voice_server.admission.sessions == 0
    assert fds_after <= fds_before + 4, "sockets or files left behind"
    assert not errors, [(r.getMessage(), r.exc_text) for r in errors]
    assert httpx.get(f"{server.http}/healthz", timeout=10).status_code == 200
