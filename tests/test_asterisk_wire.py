"""Asterisk wire formats without sockets, then the simulated Asterisk peers against tiny
in-test servers on loopback (timing bounds are loose: a busy 2-core machine must pass)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import websockets

from voiceagent.audio.codecs import mulaw_encode
from voiceagent.bench.asterisk import SimulatedAsteriskWebSocketCall, SimulatedAudioSocketCall
from voiceagent.bench.asterisk_queue import MediaQueue
from voiceagent.telephony import asterisk_ws_control as ctl
from voiceagent.telephony import audiosocket_frames as af

# -- AudioSocket packets -----------------------------------------------------------------


def test_packet_layout() -> None:
    assert af.encode(af.Kind.SLIN, b"\x01\x02") == b"\x10\x00\x02\x01\x02"
    assert af.encode_hangup() == b"\x00\x00\x00"
    assert af.encode_dtmf("#") == b"\x03\x00\x01#"
    call_id = "40325ec2-5efd-4bd3-805f-53576e581d13"
    wire = af.encode_uuid(call_id)
    assert wire[:3] == b"\x01\x00\x10" and wire[3:] == uuid.UUID(call_id).bytes
    assert af.parse_uuid(wire[3:]) == call_id
    big = af.encode_audio(b"\0\1" * 400, 16000)  # length 800 = 0x0320, big-endian
    assert big[:3] == b"\x12\x03\x20"


def test_slin_kinds_and_rates() -> None:
    for kind, rate in af.SLIN_RATES.items():
        assert af.slin_kind(rate) is kind and af.slin_rate(kind) == rate
    assert af.slin_kind(44100) == 0x15 and af.slin_kind(192000) == 0x18
    assert af.frame_bytes(8000) == 320 and af.frame_bytes(16000) == 640
    with pytest.raises(ValueError):
        af.slin_kind(11025)
    with pytest.raises(ValueError):
        af.slin_rate(af.Kind.DTMF)
    assert af.Packet(af.Kind.SLIN24, b"\0\0").sample_rate == 24000


def _stream() -> tuple[bytes, list[af.Packet]]:
    call_id = str(uuid.uuid4())
    audio = np.arange(-160, 160, dtype=np.int16).astype("<i2").tobytes()
    packets = [
        af.Packet(af.Kind.UUID, uuid.UUID(call_id).bytes),
        af.Packet(af.Kind.SLIN, audio),
        af.Packet(af.Kind.DTMF, b"7"),
        af.Packet(af.Kind.SLIN16, audio * 2),
        af.Packet(af.Kind.ERROR, b"\x02"),
        af.Packet(af.Kind.HANGUP),
    ]
    return b"".join(af.encode(p.kind, p.payload) for p in packets), packets


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 7, 319, 100_000])
def test_decoder_any_split(chunk: int) -> None:
    wire, packets = _stream()
    decoder = af.AudioSocketDecoder()
    got: list[af.Packet] = []
    for i in range(0, len(wire), chunk):
        got += decoder.feed(wire[i : i + chunk])
    assert got == packets and decoder.pending == 0
    assert got[2].digit == "7" and got[0].uuid == str(uuid.UUID(bytes=packets[0].payload))


def test_decoder_partial_header_waits() -> None:
    decoder = af.AudioSocketDecoder()
    assert decoder.feed(b"\x10") == [] and decoder.pending == 1
    assert decoder.feed(b"\x00\x04\x01\x02") == [] and decoder.pending == 5
    assert decoder.feed(b"\x03\x04") == [af.Packet(af.Kind.SLIN, b"\x01\x02\x03\x04")]


def test_decoder_rejects_bad_streams() -> None:
    decoder = af.AudioSocketDecoder()
    with pytest.raises(af.UnknownKindError, match="0x02"):
        decoder.feed(b"\x02\x00\x00")
    with pytest.raises(af.AudioSocketError):  # stays failed
        decoder.feed(af.encode_hangup())
    # From the header alone: a too-long payload fails before it arrives.
    with pytest.raises(af.BadLengthError):
        af.AudioSocketDecoder(max_payload=640).feed(b"\x10\x02\x81")
    with pytest.raises(af.BadLengthError):
        af.AudioSocketDecoder().feed(b"\x01\x00\x0f")  # UUID of 15 bytes
    with pytest.raises(af.BadLengthError):
        af.AudioSocketDecoder().feed(b"\x10\x00\x00")  # empty audio: Asterisk hangs up
    # What Asterisk takes from a server: hangup and audio only.
    with pytest.raises(af.UnknownKindError, match="DTMF"):
        af.AudioSocketDecoder(af.TO_ASTERISK).feed(af.encode_dtmf("1"))
    assert issubclass(af.AudioSocketError, ValueError)
    with pytest.raises(ValueError):
        af.encode(0x42, b"")
    with pytest.raises(ValueError):
        af.encode(af.Kind.SLIN, b"\0" * 70_000)
    with pytest.raises(ValueError):
        af.encode_dtmf("x")


# -- chan_websocket control messages -----------------------------------------------------

PLAIN_START = (
    "MEDIA_START connection_id:voiceagent channel:WebSocket/voiceagent/0x7f1c2c001234 "
    "channel_id:1733920000.17 format:ulaw optimal_frame_size:160 ptime:20"
)


def test_media_start_plain() -> None:
    ev = ctl.parse_event(PLAIN_START)
    assert ev == ctl.MediaStart(
        "voiceagent", "WebSocket/voiceagent/0x7f1c2c001234", "ulaw", 160, 20, "1733920000.17"
    )
    assert isinstance(ev, ctl.MediaStart) and ev.media.codec == "mulaw"
    assert ctl.encode_event(ev) == PLAIN_START
    old = ctl.parse_event(
        "MEDIA_START connection_id:c1 channel:WebSocket/c1/0x1 format:slin16 "
        "optimal_frame_size:640 ptime:20"
    )  # before 20.17: no channel_id
    assert isinstance(old, ctl.MediaStart) and old.channel_id is None
    assert old.media == ctl.MediaFormat("slin16", "pcm16", 16000, 640)


def test_media_start_json() -> None:
    text = (
        '{"event":"MEDIA_START","connection_id":"c1","channel":"WebSocket/c1/0x1",'
        '"channel_id":"17.3","format":"ulaw","optimal_frame_size":160,"ptime":20,'
        '"channel_variables":{"CALLER":"100"}}'
    )
    ev = ctl.parse_event(text)
    assert ev == ctl.MediaStart(
        "c1", "WebSocket/c1/0x1", "ulaw", 160, 20, "17.3", {"CALLER": "100"}
    )
    assert ctl.encode_event(ev, "json") == text


EVENTS: list[tuple[str, str, ctl.Event]] = [
    ("DTMF_END digit:5 channel_id:17.3", '{"event":"DTMF_END","channel_id":"17.3","digit":"5"}',
     ctl.DtmfEnd("5", "17.3")),
    ("MEDIA_XOFF", '{"event":"MEDIA_XOFF","channel_id":"17.3"}', ctl.MediaXoff("17.3")),
    ("MEDIA_XON", '{"event":"MEDIA_XON","channel_id":"17.3"}', ctl.MediaXon("17.3")),
    ("QUEUE_DRAINED", '{"event":"QUEUE_DRAINED","channel_id":"17.3"}', ctl.QueueDrained("17.3")),
    ("MEDIA_BUFFERING_COMPLETED b1",
     '{"event":"MEDIA_BUFFERING_COMPLETED","channel_id":"17.3","correlation_id":"b1"}',
     ctl.MediaBufferingCompleted("b1", "17.3")),
    ("MEDIA_MARK_PROCESSED m-1",
     '{"event":"MEDIA_MARK_PROCESSED","channel_id":"17.3","correlation_id":"m-1"}',
     ctl.MediaMarkProcessed("m-1", "17.3")),
    ("STATUS channel_id:17.3 queue_length:12 xon_level:800 xoff_level:900 queue_full:false "
     "bulk_media:true media_paused:false",
     '{"event":"STATUS","channel_id":"17.3","queue_length":12,"xon_level":800,'
     '"xoff_level":900,"queue_full":false,"bulk_media":true,"media_paused":false}',
     ctl.Status(12, 800, 900, False, True, False, "17.3")),
    ("ERROR channel_id:17.3 error_text:FLUSH_MEDIA not supported in passthrough mode",
     '{"event":"ERROR","channel_id":"17.3","error_text":'
     '"FLUSH_MEDIA not supported in passthrough mode"}',
     ctl.Error("FLUSH_MEDIA not supported in passthrough mode", "17.3")),
]  # fmt: skip


@pytest.mark.parametrize(("plain", "as_json", "event"), EVENTS)
def test_every_event_both_formats(plain: str, as_json: str, event: ctl.Event) -> None:
    assert ctl.encode_event(event, "json") == as_json
    assert ctl.parse_event(as_json) == event
    assert ctl.encode_event(event, ctl.ControlFormat.PLAIN) == plain
    parsed = ctl.parse_event(plain)
    if isinstance(event, ctl.MediaXoff | ctl.MediaXon | ctl.QueueDrained):
        assert parsed == type(event)()  # plain-text carries no channel id for these
    elif isinstance(event, ctl.MediaBufferingCompleted | ctl.MediaMarkProcessed):
        assert parsed == type(event)(event.correlation_id)
    else:
        assert parsed == event


def test_events_odd_cases() -> None:
    assert ctl.parse_event("MEDIA_MARK_PROCESSED") == ctl.MediaMarkProcessed("")
    assert ctl.parse_event("DTMF_END digit:#") == ctl.DtmfEnd("#")  # before 20.17
    assert ctl.parse_event("SOMETHING_NEW a:1 b:x:y") == ctl.Unknown(
        "SOMETHING_NEW", {"a": "1", "b": "x:y"}
    )
    assert ctl.parse_event('{"event":"LATER","x":1}') == ctl.Unknown("LATER", {"x": 1})
    with pytest.raises(ValueError):
        ctl.parse_event("MEDIA_START connection_id:c1")


def test_commands() -> None:
    for name in sorted(ctl.COMMANDS - {ctl.SET_MEDIA_DIRECTION}):
        assert ctl.command(name) == name
        assert ctl.command(name, "json") == f'{{"command":"{name}"}}'
        assert ctl.parse_command(ctl.command(name)) == ctl.Command(name)
    assert ctl.command(ctl.MARK_MEDIA, correlation_id="m1") == "MARK_MEDIA m1"
    text = ctl.command(ctl.MARK_MEDIA, "json", correlation_id="m1")
    assert text == '{"command":"MARK_MEDIA","correlation_id":"m1"}'
    assert ctl.parse_command(text, "json") == ctl.Command("MARK_MEDIA", "m1")
    assert ctl.parse_command("  STOP_MEDIA_BUFFERING b 2 \n") == ctl.Command(
        "STOP_MEDIA_BUFFERING", "b 2"
    )
    direction = ctl.command(ctl.SET_MEDIA_DIRECTION, "json", direction="out")
    assert ctl.parse_command(direction, "json").direction == "out"
    with pytest.raises(ValueError):
        ctl.command(ctl.SET_MEDIA_DIRECTION, direction="out")  # JSON only
    with pytest.raises(ValueError):
        ctl.command("PLAY_NOW")
    with pytest.raises(ValueError):
        ctl.command(ctl.MARK_MEDIA, correlation_id="x" * 200)  # Asterisk ignores > 128 bytes


def test_media_formats() -> None:
    sizes = {name: f.optimal_frame_size for name, f in ctl.MEDIA_FORMATS.items()}
    assert sizes["ulaw"] == sizes["alaw"] == 160 and sizes["slin"] == 320
    assert sizes["slin16"] == 640 and sizes["slin44"] == 1764 and sizes["slin48"] == 1920
    assert ctl.media_format("opus").passthrough and not ctl.media_format("g722").passthrough
    with pytest.raises(ValueError):
        ctl.media_format("sln16")


# -- chan_websocket's queue, as the simulator models it ----------------------------------


def _drain(q: MediaQueue, ticks: int) -> tuple[list[bytes], list[ctl.Event]]:
    frames: list[bytes] = []
    events: list[ctl.Event] = []
    for _ in range(ticks):
        frame, out = q.tick()
        events += out
        if frame is not None:
            frames.append(frame)
    return frames, events


def test_queue_flow_control_and_limits() -> None:
    q = MediaQueue(4, "c", xoff_level=5, xon_level=3, queue_max=8)
    assert q.media(b"a" * 16) == []  # 4 frames
    assert q.media(b"b" * 10) == [ctl.MediaXoff("c")]  # 2 more frames; 2-byte tail dropped
    assert q.dropped_partial_bytes == 2 and q.length == 6 and q.full
    q.media(b"c" * 8)  # ignores XOFF: counted
    assert q.media_while_xoff == 1 and q.length == 8
    assert q.media(b"d" * 4) == [] and q.dropped_messages == 1  # at queue_max: dropped whole
    frames, events = _drain(q, 6)
    # each of these ticks began with 3 or more queued: no XON yet
    assert frames == [b"aaaa"] * 4 + [b"bbbb"] * 2 and events == []
    frames, events = _drain(q, 1)  # XON is checked before the tick's frame leaves
    assert frames == [b"cccc"] and events == [ctl.MediaXon("c")]
    assert q.command(ctl.Command(ctl.GET_STATUS)) == [ctl.Status(1, 3, 5, False, False, False, "c")]
    q.command(ctl.Command(ctl.FLUSH_MEDIA))
    assert q.length == 0 and _drain(q, 3) == ([], [])


def test_queue_marks_buffering_pause_and_drained() -> None:
    q = MediaQueue(4)
    q.media(b"x" * 8)
    q.command(ctl.Command(ctl.MARK_MEDIA, "m1"))
    q.command(ctl.Command(ctl.REPORT_QUEUE_DRAINED))
    frames, events = _drain(q, 4)  # the mark goes when the playout reaches it
    assert frames == [b"xxxx"] * 2
    assert events == [ctl.MediaMarkProcessed("m1"), ctl.QueueDrained()]
    q.command(ctl.Command(ctl.START_MEDIA_BUFFERING))
    q.media(b"y" * 6)
    q.media(b"z" * 5)  # buffering joins messages: yyyy yyzz zzz
    q.command(ctl.Command(ctl.STOP_MEDIA_BUFFERING, "b1"))
    frames, events = _drain(q, 4)
    assert frames == [b"yyyy", b"yyzz", b"zzz"] and events == [ctl.MediaBufferingCompleted("b1")]
    q.command(ctl.Command(ctl.PAUSE_MEDIA))
    q.media(b"p" * 4)
    assert _drain(q, 3) == ([], []) and q.length == 1
    q.command(ctl.Command(ctl.CONTINUE_MEDIA))
    assert _drain(q, 1)[0] == [b"pppp"]
    q.command(ctl.Command(ctl.MARK_MEDIA, "gone"))
    q.command(ctl.Command(ctl.FLUSH_MEDIA))  # drops the mark unsent
    assert _drain(q, 2) == ([], [])
    with pytest.raises(ValueError):
        q.command(ctl.Command(ctl.ANSWER))


# -- the simulated AudioSocket call against a tiny TCP server ----------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _tcp_server(handler: Handler) -> tuple[asyncio.Server, int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _read_packets(
    reader: asyncio.StreamReader, until: Callable[[list[tuple[float, af.Packet]]], bool]
) -> list[tuple[float, af.Packet]]:
    decoder = af.AudioSocketDecoder()
    got: list[tuple[float, af.Packet]] = []
    while not until(got):
        data = await asyncio.wait_for(reader.read(4096), 10)
        if not data:
            break
        got += [(time.monotonic(), p) for p in decoder.feed(data)]
    return got


def test_audiosocket_call_paces_speaks_and_hears() -> None:
    seen: dict[str, Any] = {}
    clip = np.full(1600, 1000, np.int16)  # 200 ms of the caller
    reply = np.full(160 * 10, 500, np.int16)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = await _read_packets(reader, lambda g: sum(p.is_audio for _, p in g) >= 60)
        seen["packets"] = got
        for k in range(10):  # 10 frames back, paced like a good server
            writer.write(af.encode_audio(reply[k * 160 : (k + 1) * 160].tobytes()))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(af.encode_hangup())
        await writer.drain()
        seen["eof"] = await asyncio.wait_for(reader.read(), 10) is not None

    async def main() -> None:
        server, port = await _tcp_server(handler)
        async with server:
            async with SimulatedAudioSocketCall("127.0.0.1", port, caller_pcm=clip) as call:
                await asyncio.sleep(0.1)
                await call.send_dtmf("5")
                assert await call.wait_ended(15)
            assert call.server_hung_up and not call.protocol_errors
            got = seen["packets"]
            assert got[0][1].kind is af.Kind.UUID and got[0][1].uuid == call.call_id
            audio = [(t, p) for t, p in got if p.is_audio]
            assert all(p.kind is af.Kind.SLIN and len(p.payload) == 320 for _, p in audio)
            # Paced by the receiver's clock: ~20 ms a frame on average, no burst.
            span = audio[-1][0] - audio[0][0]
            assert 0.015 < span / (len(audio) - 1) < 0.04
            heard = np.concatenate([np.frombuffer(p.payload, "<i2") for _, p in audio])
            assert (heard == 1000).sum() == clip.size  # the clip, then silence
            assert any(p.kind is af.Kind.DTMF and p.digit == "5" for _, p in got)
            assert np.array_equal(call.played_pcm(), reply)
            assert call.first_audio_at is not None and not call.playback.gaps(0.1)
            assert call.times("say_start") and call.times("say_end")
            await asyncio.sleep(0.05)
        assert seen["eof"]

    asyncio.run(main())


def test_audiosocket_call_hangs_up_like_asterisk() -> None:
    seen: dict[str, Any] = {}

    async def bad_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_packets(reader, lambda g: len(g) >= 2)
        writer.write(af.encode_dtmf("1"))  # Asterisk does not take DTMF from a server
        await writer.drain()
        seen["rest"] = await asyncio.wait_for(reader.read(), 10)

    async def quiet_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = await _read_packets(reader, lambda g: False)  # until EOF
        seen["kinds"] = {p.kind for _, p in got}

    async def main() -> None:
        server, port = await _tcp_server(bad_server)
        async with server, SimulatedAudioSocketCall("127.0.0.1", port) as call:
            assert await call.wait_ended(10)
            assert not call.server_hung_up and len(call.protocol_errors) == 1
        server, port = await _tcp_server(quiet_server)
        async with server:
            call = await SimulatedAudioSocketCall("127.0.0.1", port, sample_rate=16000).start()
            await asyncio.sleep(0.2)
            await call.hangup()  # a socket close, no HANGUP packet
            await asyncio.sleep(0.2)
        assert seen["kinds"] == {af.Kind.UUID, af.Kind.SLIN16}

    asyncio.run(main())


# -- the simulated chan_websocket call against a tiny websockets server ------------------

WsHandler = Callable[[Any], Awaitable[None]]


async def _next_text(ws: Any, timeout: float = 10) -> str:
    """The next text message, skipping the caller's binary media."""
    deadline = time.monotonic() + timeout
    while True:
        msg = await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
        if isinstance(msg, str):
            return str(msg)


async def _ws_call(handler: WsHandler, **kwargs: Any) -> SimulatedAsteriskWebSocketCall:
    """Serve `handler` on loopback and run one call to it until it ends."""
    async with websockets.serve(handler, "127.0.0.1", 0, subprotocols=["media"]) as server:
        port = server.sockets[0].getsockname()[1]
        url = f"ws://127.0.0.1:{port}/call"
        async with SimulatedAsteriskWebSocketCall(url, **kwargs) as call:
            assert await call.wait_ended(20)
        return call


def test_ws_call_start_caller_media_and_flow_control() -> None:
    seen: dict[str, Any] = {}
    frame = mulaw_encode(np.full(160, 800, np.int16)).tobytes()

    async def handler(ws: Any) -> None:
        seen["subprotocol"] = ws.subprotocol
        seen["path"] = ws.request.path
        seen["start"] = ctl.parse_event(await ws.recv())
        caller = [await ws.recv() for _ in range(3)]
        seen["caller"] = caller
        await ws.send(frame * 30)  # floods past xoff_level=10 at once
        assert await _next_text(ws) == "MEDIA_XOFF"
        await ws.send(frame)  # a server that ignores XOFF
        assert await _next_text(ws) == "MEDIA_XON"  # after draining below 5
        await ws.send(ctl.command(ctl.GET_STATUS))
        seen["status"] = ctl.parse_event(await _next_text(ws))
        await ws.send(ctl.command(ctl.REPORT_QUEUE_DRAINED))
        assert await _next_text(ws) == "QUEUE_DRAINED"
        await ws.send(ctl.command(ctl.HANGUP))
        await ws.wait_closed()

    async def main() -> None:
        call = await _ws_call(handler, xoff_level=10, xon_level=5, queue_max=40,
                              uri_params={"caller": "100 1"})  # fmt: skip
        assert seen["subprotocol"] == "media" and seen["path"] == "/call?caller=100+1"
        start = seen["start"]
        assert isinstance(start, ctl.MediaStart) and start.format == "ulaw"
        assert start.optimal_frame_size == 160 and start.ptime == 20
        assert all(isinstance(m, bytes) and len(m) == 160 for m in seen["caller"])
        assert call.media_while_xoff == 1 and call.queue.dropped_messages == 0
        (xoff,), (xon,) = call.times("xoff"), call.times("xon")
        assert 0.1 < xon - xoff < 5  # 26+ frames had to play out at 20 ms each
        status = seen["status"]
        assert isinstance(status, ctl.Status) and status.xoff_level == 10 and not status.queue_full
        played = call.played_pcm()
        assert played.size == 31 * 160 and abs(int(played[0]) - 800) < 40
        assert call.server_hung_up and call.close_code == 1000

    asyncio.run(main())


def test_ws_call_flush_marks_drained_and_pause() -> None:
    seen: dict[str, Any] = {}
    frame = bytes([0x10]) * 160

    async def handler(ws: Any) -> None:
        await ws.recv()  # MEDIA_START
        await ws.send(frame * 50)  # one second
        await asyncio.sleep(0.15)
        await ws.send(ctl.command(ctl.FLUSH_MEDIA))
        await ws.send(ctl.command(ctl.GET_STATUS))
        seen["after_flush"] = ctl.parse_event(await _next_text(ws))
        await ws.send(frame * 4 + frame[:100])  # the 100-byte tail is dropped
        await ws.send(ctl.command(ctl.MARK_MEDIA, correlation_id="m1"))
        await ws.send(ctl.command(ctl.REPORT_QUEUE_DRAINED))
        seen["mark"] = ctl.parse_event(await _next_text(ws))
        seen["drained"] = ctl.parse_event(await _next_text(ws))
        await ws.send(ctl.command(ctl.PAUSE_MEDIA))
        await ws.send(frame * 5)
        await asyncio.sleep(0.2)
        await ws.send(ctl.command(ctl.GET_STATUS))
        seen["paused"] = ctl.parse_event(await _next_text(ws))
        await ws.send(ctl.command(ctl.CONTINUE_MEDIA))
        await ws.send(ctl.command(ctl.REPORT_QUEUE_DRAINED))
        assert isinstance(ctl.parse_event(await _next_text(ws)), ctl.QueueDrained)
        await ws.close()

    async def main() -> None:
        call = await _ws_call(handler)
        after = seen["after_flush"]
        assert isinstance(after, ctl.Status) and after.queue_length == 0
        (flush,) = [e for e in call.events if e.kind == "flush"]
        assert 10 <= flush.detail <= 48  # most of the second was still queued
        assert seen["mark"] == ctl.MediaMarkProcessed("m1", None)
        assert isinstance(seen["drained"], ctl.QueueDrained)
        paused = seen["paused"]
        assert isinstance(paused, ctl.Status) and paused.media_paused and paused.queue_length == 5
        assert call.queue.dropped_partial_bytes == 100
        frames = len(call.playback.frames)
        assert 4 + 5 <= frames <= 50 - 10 + 4 + 5
        assert not call.server_hung_up and call.close_code == 1000  # the server closed

    asyncio.run(main())


def test_ws_call_json_dtmf_and_caller_hangup() -> None:
    seen: dict[str, Any] = {}

    async def handler(ws: Any) -> None:
        seen["start"] = ctl.parse_event(await ws.recv())
        seen["dtmf"] = ctl.parse_event(await _next_text(ws))
        with pytest.raises(websockets.ConnectionClosed):
            await _next_text(ws)
        seen["code"] = ws.close_code

    async def main() -> None:
        async with websockets.serve(handler, "127.0.0.1", 0, subprotocols=["media"]) as server:
            port = server.sockets[0].getsockname()[1]
            call = SimulatedAsteriskWebSocketCall(
                f"ws://127.0.0.1:{port}", format="slin16", control_format="json",
                channel_variables={"CALLERID": "100"},
            )  # fmt: skip
            async with call:
                await call.send_dtmf("9")
                await asyncio.sleep(0.1)
                await call.hangup()
            await asyncio.sleep(0.1)
        start = seen["start"]
        assert isinstance(start, ctl.MediaStart) and start.optimal_frame_size == 640
        assert start.channel_variables == {"CALLERID": "100"}
        assert seen["dtmf"] == ctl.DtmfEnd("9", call.channel_id)
        assert seen["code"] == 1000

    asyncio.run(main())
