"""Cartesia-compatible speech (compat/cartesia.py, docs/compat.md) with the real clients:
Cartesia's own SDK, Pipecat's CartesiaTTSService and CartesiaHttpTTSService, and
LiveKit's cartesia plugin, each against a real server on loopback with only its URL, key
and voice changed. The tiny model's audio is noise from random weights, but real audio in
shape and timing; the model is deterministic for a text and seed, so the same request
gives the same audio, whichever way it is asked for.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import struct
import time
from collections.abc import Callable
from typing import Any

import av
import httpx
import numpy as np
import pytest
import websockets
from cartesia import AsyncCartesia
from conftest import run
from test_voice_store import a_voice

from voiceagent.audio.codecs import alaw_decode, mulaw_decode
from voiceagent.auth import keys
from voiceagent.auth.gate import AuthConfig
from voiceagent.bench.clients import connect
from voiceagent.compat.utterance import Utterance
from voiceagent.model import checkpoint
from voiceagent.model.voice_store import save_voice
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.text.timing import words_of

VOICE = {"mode": "id", "id": "agent"}
TEXT = "Hello there, this is a test of the system. It has two sentences."
SHORT = "Good morning, and welcome."
LONG = " ".join(["This sentence is only here to make the audio long enough to cut."] * 12)
TIMEOUT = 30  # seconds any one wait may take on a busy machine


@pytest.fixture(scope="module")
def server(tiny_model: Any) -> Any:
    """One server for the module's tests (each waits for its own work to end)."""
    with BackgroundServer(tiny_model, ServerConfig(port=free_port())) as background:
        yield background


def raw(encoding: str = "pcm_s16le", rate: int = 16000) -> dict[str, Any]:
    return {"container": "raw", "encoding": encoding, "sample_rate": rate}


def sdk(server: Any, api_key: str = "any") -> AsyncCartesia:
    """Cartesia's client as its users make it, pointed here: the WebSocket base is set
    too (the SDK derives it by swapping the scheme to wss://, which loopback lacks)."""
    return AsyncCartesia(
        api_key=api_key,
        base_url=server.http,
        websocket_base_url=server.http.replace("http://", "ws://"),
    )


def ws_url(server: Any) -> str:
    return server.http.replace("http://", "ws://") + "/tts/websocket"


async def until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Wait for something the server does on its own thread (polled: it has no event to
    wait on from here)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def live_turns(server: Any) -> int:
    return int(server.voice_server.admission.live_turns)


def turns(server: Any, outcome: str) -> float:
    registry = server.engine.metrics.registry
    value = registry.get_sample_value(
        "voiceagent_turns_total", {"transport": "cartesia", "outcome": outcome}
    )
    return value or 0.0


class Heard:
    """One context's messages as the SDK parsed them."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.audio = bytearray()
        self.times: list[tuple[str, float, float]] = []

    def add(self, event: Any) -> None:
        self.events.append(event)
        if event.type == "chunk":
            self.audio += event.audio or b""
        elif event.type == "timestamps":
            wt = event.word_timestamps
            self.times += list(zip(wt.words, wt.start, wt.end, strict=True))

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.events]


async def receive(ctx: Any) -> Heard:
    heard = Heard()
    async with asyncio.timeout(TIMEOUT):
        async for event in ctx.receive():
            heard.add(event)
    return heard


async def say(server: Any, text: str, output: dict[str, Any], **fields: Any) -> Heard:
    """One context through the SDK's context helper: the text, then the end of input."""
    async with sdk(server) as client, client.tts.websocket_connect() as conn:
        ctx = conn.context(model_id="sonic-3", voice=VOICE, output_format=output, **fields)
        await ctx.push(text)
        await ctx.no_more_inputs()
        return await receive(ctx)


def check_words(heard: Heard, text: str, duration_s: float) -> None:
    """The words come back in the order they were sent, at times that only go forward
    and stay within the audio (they are approximate: docs/compat.md)."""
    assert [w for w, _, _ in heard.times] == words_of(text)
    starts = [s for _, s, _ in heard.times]
    assert starts == sorted(starts)
    assert all(0 <= s <= e <= duration_s + 0.02 for _, s, e in heard.times)
    assert heard.times[-1][2] > duration_s / 2


# -- Cartesia's SDK ---------------------------------------------------------------------


def test_the_sdk_streams_a_context_with_word_timestamps_and_bytes_gives_the_same_audio(server):
    async def go():
        heard = await say(server, TEXT, raw("pcm_s16le", 16000), add_timestamps=True)
        async with sdk(server) as client:
            response = await client.tts.generate(
                model_id="sonic-3", output_format=raw(), transcript=TEXT, voice=VOICE
            )
            whole = await response.read()
            async with client.tts.with_streaming_response.generate(
                model_id="sonic-2",
                output_format={"container": "wav", "encoding": "pcm_s16le", "sample_rate": 16000},
                transcript=TEXT,
                voice="agent",
            ) as streamed:
                assert streamed.headers["content-type"] == "audio/wav"
                wav = b"".join([part async for part in streamed.iter_bytes()])
            response = await client.tts.generate(
                model_id="sonic-3",
                output_format={"container": "mp3", "sample_rate": 44100, "bit_rate": 128000},
                transcript=TEXT,
                voice=VOICE,
            )
            mp3 = await response.read()
        return heard, whole, wav, mp3

    heard, whole, wav, mp3 = run(go())
    assert heard.types[-1] == "done" and "timestamps" in heard.types
    assert all(e.context_id == heard.events[0].context_id for e in heard.events)
    chunks = [e for e in heard.events if e.type == "chunk"]
    assert all(not c.done and c.status_code == 206 and c.step_time >= 0 for c in chunks)
    duration = len(heard.audio) / 2 / 16000
    assert 2.0 < duration < 15.0
    check_words(heard, TEXT, duration)
    assert bytes(heard.audio) == whole  # deterministic: same text and seed, same audio
    assert wav[:4] == b"RIFF" and wav[8:16] == b"WAVEfmt "
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", wav[20:36])
    assert (tag, channels, rate, bits) == (1, 1, 16000, 16)
    assert wav[36:40] == b"data" and wav[40:44] == b"\xff\xff\xff\xff"
    assert wav[44:] == whole
    with av.open(io.BytesIO(mp3)) as f:  # mp3, encoded as it streams
        stream = f.streams.audio[0]
        assert (stream.codec_context.name, stream.rate, stream.bit_rate) == (
            "mp3float",
            44100,
            128000,
        )
        mp3_s = sum(frame.samples for frame in f.decode(stream)) / 44100
    assert abs(mp3_s - len(whole) / 2 / 16000) < 0.1


def test_every_mp3_bit_rate_the_sdk_offers_works_at_every_sample_rate(server):
    # What was seen: 192 kbit/s at 24 kHz and below (the SDK allows it) was refused;
    # mp3 has no such rate there, so the nearest below it (160) is used.
    for rate, wanted, got in ((22050, 192000, 160000), (24000, 96000, 96000)):
        output = {"container": "mp3", "sample_rate": rate, "bit_rate": wanted}
        body = {"model_id": "sonic-3", "voice": VOICE, "output_format": output}
        r = httpx.post(server.http + "/tts/bytes", json={**body, "transcript": SHORT})
        assert r.status_code == 200, r.text
        with av.open(io.BytesIO(r.content)) as f:
            stream = f.streams.audio[0]
            assert (stream.rate, stream.bit_rate) == (rate, got)


def test_every_encoding_carries_the_same_audio_and_contexts_on_one_socket_interleave(server):
    encodings = ["pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"]

    async def go():
        async with sdk(server) as client, client.tts.websocket_connect() as conn:
            contexts = []
            for encoding in encodings:  # all four at once, on one socket
                ctx = conn.context(
                    model_id="sonic", voice=VOICE, output_format=raw(encoding, 24000)
                )
                await ctx.send(transcript=SHORT, voice=VOICE, continue_=False)
                contexts.append(ctx)
            return await asyncio.gather(*(receive(ctx) for ctx in contexts))

    heard = dict(zip(encodings, run(go()), strict=True))
    assert all(h.types[-1] == "done" for h in heard.values())
    s16 = np.frombuffer(bytes(heard["pcm_s16le"].audio), "<i2").astype(np.float64)
    f32 = np.frombuffer(bytes(heard["pcm_f32le"].audio), "<f4").astype(np.float64)
    mu = mulaw_decode(bytes(heard["pcm_mulaw"].audio)).astype(np.float64)
    a = alaw_decode(bytes(heard["pcm_alaw"].audio)).astype(np.float64)
    assert len(s16) == len(f32) == len(mu) == len(a) > 12000
    assert np.abs(f32 * 32767 - s16).max() <= 1
    scale = np.abs(s16).max()
    for decoded in (mu, a):  # G.711: a few percent of the peak at most
        assert np.abs(decoded - s16).max() < 0.05 * scale + 64


def test_two_contexts_stream_side_by_side_and_both_finish(server):
    async def go():
        async with sdk(server) as client, client.tts.websocket_connect() as conn:
            first = conn.context("first", model_id="sonic-3", voice=VOICE, output_format=raw())
            second = conn.context("second", model_id="sonic-3", voice=VOICE, output_format=raw())
            await first.send(transcript=LONG[:160], voice=VOICE, continue_=False)
            await second.send(transcript=SHORT, voice=VOICE, continue_=False)
            timed: dict[str, list[tuple[str, float]]] = {"first": [], "second": []}

            async def watch(ctx: Any, name: str) -> None:
                async with asyncio.timeout(TIMEOUT):
                    async for event in ctx.receive():
                        timed[name].append((event.type, time.monotonic()))

            await asyncio.gather(watch(first, "first"), watch(second, "second"))
            return timed

    timed = run(go())
    assert timed["first"][-1][0] == timed["second"][-1][0] == "done"
    # the short one finished while the long one was still streaming: they interleaved
    assert timed["second"][-1][1] < timed["first"][-1][1]
    assert timed["first"][0][1] < timed["second"][-1][1]


def test_cancel_stops_a_context_at_once_and_the_socket_goes_on(server):
    async def go():
        async with sdk(server) as client, client.tts.websocket_connect() as conn:
            request = {"model_id": "sonic-3", "voice": VOICE, "output_format": raw()}
            await conn.send({**request, "context_id": "long", "transcript": LONG, "continue": True})
            first = await conn.recv()
            assert (first.type, first.context_id) == ("chunk", "long")
            await conn.send({"context_id": "long", "cancel": True})
            await conn.send({**request, "context_id": "next", "transcript": SHORT})
            after: list[Any] = []
            async with asyncio.timeout(TIMEOUT):
                while not after or (after[-1].type, after[-1].context_id) != ("done", "next"):
                    after.append(await conn.recv())
            await until(lambda: live_turns(server) == 0)
            return after

    cancelled = turns(server, "cancelled")
    after = run(go())
    stale = [e for e in after if e.context_id == "long"]
    assert all(e.type == "chunk" for e in stale)  # no done, no error for it
    assert len(stale) <= 10  # only what was already on its way
    assert any(e.type == "chunk" and e.context_id == "next" for e in after)
    assert turns(server, "cancelled") == cancelled + 1


def test_continue_holds_text_and_a_flush_speaks_it_as_a_group_of_its_own(server):
    async def go():
        async with sdk(server) as client, client.tts.websocket_connect() as conn:
            ctx = conn.context(
                model_id="sonic-3", voice=VOICE, output_format=raw(), add_timestamps=True
            )
            await ctx.push("Hello there")
            await ctx.push(" my friend", flush=True)  # group 1: "Hello there my friend"
            await ctx.push(" How are you")
            await ctx.push(" today?")
            await ctx.no_more_inputs()  # group 2
            return await receive(ctx)

    heard = run(go())
    assert heard.types[-1] == "done"
    flush_done = next(i for i, e in enumerate(heard.events) if e.type == "flush_done")
    assert heard.events[flush_done].flush_id == 1
    before = [e for e in heard.events[:flush_done] if e.type in ("chunk", "timestamps")]
    later = [e for e in heard.events[flush_done:] if e.type in ("chunk", "timestamps")]
    assert before and later
    assert {e.flush_id for e in before} == {1} and {e.flush_id for e in later} == {2}
    group_1 = sum(len(e.audio) for e in before if e.type == "chunk") / 2 / 16000
    check_words(heard, "Hello there my friend How are you today?", len(heard.audio) / 32000)
    second_start = next(s for w, s, _ in heard.times if w == "How")
    assert second_start >= group_1 - 0.001  # group 2's words follow group 1's audio


def test_a_break_tag_split_across_pushes_is_a_pause_not_words(server):
    """Cartesia's `<break time="1s"/>`, cut in two by the sender: the words around it
    come back, the tag does not, and the words after it start a second later."""

    async def go():
        async with sdk(server) as client, client.tts.websocket_connect() as conn:
            ctx = conn.context(
                model_id="sonic-3", voice=VOICE, output_format=raw(), add_timestamps=True
            )
            await ctx.push("Hello there my friend. <break ti")
            await ctx.push('me="1s"/> Bye now.')
            await ctx.no_more_inputs()
            return await receive(ctx)

    heard = run(go())
    assert heard.types[-1] == "done"
    check_words(heard, "Hello there my friend. Bye now.", len(heard.audio) / 32000)
    ends = {w: (s, e) for w, s, e in heard.times}
    assert ends["Bye"][0] - ends["friend."][1] >= 1.0, heard.times


async def next_message(ws: Any) -> dict[str, Any]:
    return dict(json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT)))


def test_a_long_lived_context_keeps_only_the_groups_it_has_not_sent(server):
    # What was seen: a context kept every flush group it ever made (each with its turn
    # and acoustic state) until it ended: 2,000 empty flushes, 141 MB more.
    groups = 200
    request = {"model_id": "sonic-3", "voice": VOICE, "output_format": raw(),
               "context_id": "long", "continue": True}  # fmt: skip

    async def go() -> int:
        async with connect(ws_url(server)) as ws:
            for _ in range(groups):
                await ws.send(json.dumps({**request, "transcript": "", "flush": True}))
                while (await next_message(ws))["type"] != "flush_done":
                    pass  # its audio (none), then flush_done
            gc.collect()  # (the server runs in this process)
            alive = sum(isinstance(o, Utterance) for o in gc.get_objects())
            await ws.send(json.dumps({**request, "transcript": "", "continue": False}))
            return alive

    assert run(go()) < 10


def test_held_text_is_spoken_after_max_buffer_delay_or_on_an_empty_continue(server):
    async def first_chunk(ctx: Any) -> float:
        async for event in ctx.receive():
            if event.type == "chunk":
                return time.monotonic()
        raise AssertionError("no audio")

    async def go():
        async with sdk(server) as client, client.tts.websocket_connect() as conn:
            timed = conn.context(
                model_id="sonic-3", voice=VOICE, output_format=raw(), max_buffer_delay_ms=100
            )
            await timed.push("Text without an end")  # no sentence end: held, then spoken
            async with asyncio.timeout(TIMEOUT):
                await first_chunk(timed)
            held = conn.context(
                model_id="sonic-3", voice=VOICE, output_format=raw(), max_buffer_delay_ms=5000
            )
            await held.push("More text without an end")
            sent = time.monotonic()
            await held.push("")  # speak what is held now
            async with asyncio.timeout(TIMEOUT):
                return await first_chunk(held) - sent

    assert run(go()) < 4.5  # well before the 5 s buffer delay


def test_the_buffer_delay_counts_from_when_the_held_text_began(server):
    """What was seen: the timer started at the context's first text and was never reset
    when a sentence end took all that was held, so it fired just after the next
    sentence's first words came and spoke them alone, a break mid-sentence about every
    max_buffer_delay_ms of an LLM's stream."""

    async def go():
        async with sdk(server) as client, client.tts.websocket_connect() as conn:
            ctx = conn.context(
                model_id="sonic-3",
                voice=VOICE,
                output_format=raw(),
                add_timestamps=True,
                max_buffer_delay_ms=2000,
            )
            await ctx.push("Hello there. ")  # a whole sentence: nothing is held
            await asyncio.sleep(1.5)
            await ctx.push("How are")  # held from here: spoken 2 s later at the earliest
            await asyncio.sleep(1.0)
            await ctx.push(" you today?")
            await ctx.no_more_inputs()
            return await receive(ctx)

    heard = run(go())
    groups = [e.word_timestamps.words for e in heard.events if e.type == "timestamps"]
    assert groups == [["Hello", "there."], ["How", "are", "you", "today?"]], groups


def test_speed_and_volume_shape_the_audio(server):
    async def go():
        async with sdk(server) as client:
            out = []
            for controls in (
                {},
                {"speed": "fast"},
                {"generation_config": {"speed": 2.0}},
                {"generation_config": {"volume": 0.5}},
            ):
                response = await client.tts.generate(
                    model_id="sonic-3",
                    output_format=raw(),
                    transcript=SHORT,
                    voice=VOICE,
                    **controls,
                )
                out.append(np.frombuffer(await response.read(), "<i2").astype(np.int32))
            return out

    normal, fast, double, quiet = run(go())
    assert len(fast) / len(normal) == pytest.approx(1 / 1.25, abs=0.05)
    assert len(double) / len(normal) == pytest.approx(1 / 2.0, abs=0.05)
    assert len(quiet) == len(normal) and np.abs(quiet - normal / 2).max() <= 1


# -- what a client gets wrong ---------------------------------------------------------


def test_bad_messages_get_coded_errors_and_the_socket_stays_up(server):
    good = {"model_id": "sonic-3", "voice": VOICE, "output_format": raw(), "transcript": SHORT}
    bad: list[tuple[str | bytes, str, str | None]] = [
        ("{not json", "invalid_json", None),
        ("[" * 100_000 + "]" * 100_000, "invalid_json", None),  # seen: the socket died
        ("[1, 2]", "invalid_message", None),
        (json.dumps({**good, "context_id": ""}), "invalid_message", None),
        (b"\x00\x01", "unexpected_binary", None),
        (
            json.dumps({**good, "context_id": "v", "voice": {"mode": "id", "id": "nobody"}}),
            "unknown_voice",
            "v",
        ),
        (
            json.dumps(
                {**good, "context_id": "e", "voice": {"mode": "embedding", "embedding": [0.1]}}
            ),
            "invalid_parameter",
            "e",
        ),
        (json.dumps({**good, "context_id": "m", "model_id": "tts-1"}), "unknown_model", "m"),
        (
            json.dumps({**good, "context_id": "f", "output_format": raw("mp3", 16000)}),
            "invalid_parameter",
            "f",
        ),
        (
            json.dumps({**good, "context_id": "r", "output_format": raw("pcm_s16le", 11025)}),
            "invalid_parameter",
            "r",
        ),
        (
            json.dumps({**good, "context_id": "c", "output_format": {**raw(), "container": "wav"}}),
            "invalid_parameter",
            "c",
        ),
        (json.dumps({**good, "context_id": "s", "speed": 9}), "invalid_parameter", "s"),
        (
            json.dumps({k: v for k, v in good.items() if k != "transcript"} | {"context_id": "t"}),
            "invalid_message",
            "t",
        ),
        (json.dumps({"context_id": "ghost", "cancel": True}), "unknown_context", "ghost"),
    ]

    async def go():
        errors = []
        async with websockets.connect(ws_url(server)) as ws:
            for message, _, _ in bad:
                await ws.send(message)
                errors.append(json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT)))
            await ws.send(json.dumps({**good, "context_id": "ok"}))
            replies = []
            while not replies or replies[-1]["type"] not in ("done", "error"):
                replies.append(json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT)))
            return errors, replies

    errors, replies = run(go())
    for error, (_, code, context_id) in zip(errors, bad, strict=True):
        assert error["type"] == "error" and error["error_code"] == code, error
        assert error["context_id"] == context_id and error["done"] is False
        assert error["status_code"] >= 400 and error["message"]
    assert replies[-1] == {"type": "done", "context_id": "ok", "done": True, "status_code": 206}
    assert live_turns(server) == 0


def test_a_context_s_flush_groups_share_its_one_live_turn_slot(make_server):
    # What was seen: each flush group took a slot of its own, so with three slots a
    # context of four flushed sentences was refused (server_busy) and cancelled whole.
    server = make_server(max_live_turns=3)
    good = {"model_id": "sonic-3", "voice": VOICE, "output_format": raw(), "context_id": "c"}

    async def go() -> tuple[list[dict[str, Any]], set[int]]:
        async with websockets.connect(ws_url(server)) as ws:
            for i in range(4):
                await ws.send(
                    json.dumps(
                        {**good, "transcript": f"Sentence {i}.", "continue": True, "flush": True}
                    )
                )
            await ws.send(json.dumps({**good, "transcript": "", "continue": False}))
            replies, slots = [], set()
            while not replies or replies[-1]["type"] not in ("done", "error"):
                reply = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
                if reply["type"] == "chunk":
                    slots.add(live_turns(server))  # while its audio comes
                else:
                    replies.append(reply)
            return replies, slots

    replies, slots = run(go())
    assert max(slots) == 1  # (0 too, for chunks read after the context has ended)
    assert [r["type"] for r in replies] == ["flush_done"] * 4 + ["done"], replies
    assert [r["flush_id"] for r in replies[:4]] == [1, 2, 3, 4]
    assert live_turns(server) == 0


def test_a_draining_server_refuses_a_new_context_and_finishes_the_live_one(make_server):
    server = make_server()
    good = {"model_id": "sonic-3", "voice": VOICE, "output_format": raw()}

    async def go() -> tuple[list[dict[str, Any]], Any]:
        async with websockets.connect(ws_url(server)) as ws:
            live = {**good, "context_id": "a", "transcript": "Hello there,", "continue": True}
            await ws.send(json.dumps(live))
            while live_turns(server) == 0:  # (context a is open)
                await asyncio.sleep(0.01)
            drained = asyncio.wrap_future(server.drain(deadline_s=30))
            while not server.voice_server.admission.draining:
                await asyncio.sleep(0.01)
            await ws.send(json.dumps({**good, "context_id": "b", "transcript": SHORT}))
            await ws.send(json.dumps({**live, "transcript": " goodbye.", "continue": False}))
            replies = []
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    reply = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
                    if reply["type"] != "chunk":
                        replies.append(reply)
            await asyncio.wait_for(drained, TIMEOUT)
            return replies, closed.value.rcvd

    replies, close = run(go())
    assert [(r["context_id"], r["type"]) for r in replies] == [("b", "error"), ("a", "done")]
    assert replies[0]["error_code"] == "server_draining"
    assert close.code == 1001


def test_bytes_refuses_bad_requests_with_an_http_status_and_a_code(server):
    good = {"model_id": "sonic-3", "voice": VOICE, "output_format": raw(), "transcript": SHORT}
    cases = [
        (b"{oops", 400, "invalid_json"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
        (json.dumps({**good, "transcript": "a" * (2 << 20)}).encode(), 413, "message_too_large"),
        (json.dumps({**good, "voice": "nobody"}).encode(), 400, "unknown_voice"),
        (json.dumps({**good, "transcript": "  "}).encode(), 400, "invalid_parameter"),
        (json.dumps({**good, "model_id": "eleven_v3"}).encode(), 400, "unknown_model"),
        (
            json.dumps({**good, "output_format": raw("pcm_u8", 16000)}).encode(),
            400,
            "invalid_parameter",
        ),
        (
            json.dumps(
                {
                    **good,
                    "output_format": {"container": "mp3", "sample_rate": 8000, "bit_rate": 320000},
                }
            ).encode(),
            400,
            "invalid_parameter",
        ),
    ]
    for body, status, code in cases:
        r = httpx.post(server.http + "/tts/bytes", content=body, timeout=TIMEOUT)
        assert (r.status_code, r.json()["error_code"], r.json()["type"]) == (status, code, "error")


def test_with_auth_on_a_key_is_needed_and_a_tenant_speaks_with_its_own_voices(
    make_server, tiny_dir, tmp_path
):
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text("")
    acme, _ = keys.add_key(keys_file, "acme")
    globex, _ = keys.add_key(keys_file, "globex")
    voices = tmp_path / "voices"
    save_voice(voices / "acme", a_voice("anna"), "anna speaking")  # acme's alone
    server = make_server(
        checkpoint.load(tiny_dir),  # its own copy: the server adds the voice to it
        auth=AuthConfig("on", keys_file, "secret"),
        voices_dir=voices,
    )
    url = ws_url(server)

    async def handshake(target: str, headers: dict[str, str] | None = None) -> int:
        try:
            async with websockets.connect(target, additional_headers=headers):
                return 101
        except websockets.InvalidStatus as refused:
            return refused.response.status_code

    async def anna(key: str) -> Heard:
        async with sdk(server, api_key=key) as client, client.tts.websocket_connect() as conn:
            ctx = conn.context(
                model_id="sonic-3", voice={"mode": "id", "id": "anna"}, output_format=raw()
            )
            await ctx.send(transcript=SHORT, voice={"mode": "id", "id": "anna"}, continue_=False)
            return await receive(ctx)

    async def go():
        statuses = [
            await handshake(url),
            await handshake(url, {"X-API-Key": "wrong"}),
            await handshake(url, {"X-API-Key": acme, "Cartesia-Version": "2026-03-01"}),
            await handshake(f"{url}?api_key={acme}&cartesia_version=2025-04-16"),
        ]
        async with sdk(server, api_key=acme) as client:  # Authorization: Bearer
            audio = await (
                await client.tts.generate(
                    model_id="sonic-3", output_format=raw(), transcript=SHORT, voice="anna"
                )
            ).read()
        return statuses, audio, await anna(acme), await anna(globex)

    statuses, audio, by_acme, by_globex = run(go())
    assert statuses == [401, 401, 101, 101]
    assert len(audio) > 16000 and bytes(by_acme.audio) == audio
    assert by_acme.types[-1] == "done"
    assert by_globex.types == ["error"] and by_globex.events[0].error_code == "unknown_voice"
    r = httpx.post(server.http + "/tts/bytes", json={"transcript": SHORT})
    assert (r.status_code, r.json()["error_code"]) == (401, "unauthorized")


# -- Pipecat ----------------------------------------------------------------------------


class Tap:
    """A Pipecat processor that keeps every frame passing it (but the start)."""

    def __init__(self) -> None:
        from pipecat.frames.frames import StartFrame
        from pipecat.processors.frame_processor import FrameProcessor

        tap = self

        class Processor(FrameProcessor):
            async def process_frame(self, frame: Any, direction: Any) -> None:
                await super().process_frame(frame, direction)
                if not isinstance(frame, StartFrame):
                    tap.frames.append(frame)
                    tap.changed.set()
                await self.push_frame(frame, direction)

        self.frames: list[Any] = []
        self.changed = asyncio.Event()
        self.processor = Processor()

    async def wait_for(self, found: Callable[[Any], bool]) -> Any:
        async with asyncio.timeout(TIMEOUT):
            while True:
                for frame in self.frames:
                    if found(frame):
                        return frame
                self.changed.clear()
                await self.changed.wait()


async def pipecat_pipeline(service: Any, drive: Callable[[Any, Tap, Tap], Any]) -> None:
    """`service` between two taps in a pipeline, run until `drive(worker, up, down)` is
    done (then an EndFrame ends it)."""
    from pipecat.frames.frames import EndFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.workers.runner import WorkerRunner

    up, down = Tap(), Tap()
    pipeline = Pipeline([up.processor, service, down.processor])
    worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False, params=PipelineParams())
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: Any, frame: Any) -> None:
        started.set()

    async def run_drive() -> None:
        async with asyncio.timeout(TIMEOUT):
            await started.wait()
        try:
            await drive(worker, up, down)
        finally:
            await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    async with asyncio.timeout(2 * TIMEOUT):
        await asyncio.gather(runner.run(), run_drive())


def bytes_of(server: Any, text: str, rate: int = 16000) -> bytes:
    body = {"model_id": "sonic-3", "voice": VOICE, "output_format": raw(rate=rate)}
    r = httpx.post(server.http + "/tts/bytes", json={**body, "transcript": text}, timeout=TIMEOUT)
    assert r.status_code == 200
    return r.content


def test_pipecat_speaks_is_interrupted_mid_utterance_and_speaks_again(server):
    from pipecat.frames.frames import (
        ErrorFrame,
        InterruptionFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
        TTSStoppedFrame,
        TTSTextFrame,
    )
    from pipecat.services.cartesia.tts import CartesiaTTSService

    service = CartesiaTTSService(
        api_key="any",
        url=ws_url(server),
        sample_rate=16000,
        settings=CartesiaTTSService.Settings(voice="agent", model="sonic-3"),
    )
    cancelled = turns(server, "cancelled")
    seen: dict[str, Any] = {}

    def audio_of(down: Tap, context_id: str) -> list[Any]:
        return [
            f for f in down.frames if isinstance(f, TTSAudioRawFrame) and f.context_id == context_id
        ]

    async def drive(worker: Any, up: Tap, down: Tap) -> None:
        def stopped(n: int) -> Callable[[Any], bool]:
            return lambda f: sum(isinstance(g, TTSStoppedFrame) for g in down.frames) >= n

        await worker.queue_frame(TTSSpeakFrame(SHORT))
        first = (await down.wait_for(stopped(1))).context_id
        seen["first"] = (
            audio_of(down, first),
            [f for f in down.frames if isinstance(f, TTSTextFrame)],
        )

        await worker.queue_frame(TTSSpeakFrame(LONG))
        long_audio = await down.wait_for(
            lambda f: isinstance(f, TTSAudioRawFrame) and f.context_id != first
        )
        await worker.queue_frame(InterruptionFrame())
        await down.wait_for(lambda f: isinstance(f, InterruptionFrame))
        heard = len(audio_of(down, long_audio.context_id))
        await until(lambda: live_turns(server) == 0)  # the server dropped the context

        await worker.queue_frame(TTSSpeakFrame(SHORT))
        last = await down.wait_for(
            lambda f: (
                isinstance(f, TTSStoppedFrame)
                and f.context_id not in (first, long_audio.context_id)
            )
        )
        seen["cut"] = (heard, len(audio_of(down, long_audio.context_id)))
        seen["last"] = audio_of(down, last.context_id)
        seen["errors"] = [f for f in up.frames if isinstance(f, ErrorFrame)]

    run(pipecat_pipeline(service, drive))
    first_audio, words = seen["first"]
    expected = bytes_of(server, SHORT)
    assert b"".join(f.audio for f in first_audio) == expected
    assert all(f.sample_rate == 16000 and f.num_channels == 1 for f in first_audio)
    assert " ".join(f.text for f in words).split() == words_of(SHORT)
    heard, in_the_end = seen["cut"]
    assert heard == in_the_end  # not a frame of the cut utterance after the interruption
    assert turns(server, "cancelled") == cancelled + 1  # and the server stopped making it
    assert b"".join(f.audio for f in seen["last"]) == expected
    assert seen["errors"] == []


def test_pipecat_over_http_gets_the_whole_utterance(server):
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame
    from pipecat.services.cartesia.tts import CartesiaHttpTTSService

    service = CartesiaHttpTTSService(
        api_key="any",
        base_url=server.http,
        sample_rate=16000,
        settings=CartesiaHttpTTSService.Settings(voice="agent", model="sonic-3"),
    )
    seen: dict[str, list[Any]] = {}

    async def drive(worker: Any, up: Tap, down: Tap) -> None:
        await worker.queue_frame(TTSSpeakFrame(SHORT))
        await down.wait_for(lambda f: isinstance(f, TTSStoppedFrame))
        seen["audio"] = [f for f in down.frames if isinstance(f, TTSAudioRawFrame)]
        seen["errors"] = [f for f in up.frames if isinstance(f, ErrorFrame)]

    run(pipecat_pipeline(service, drive))
    assert b"".join(f.audio for f in seen["audio"]) == bytes_of(server, SHORT)
    assert seen["errors"] == []


# -- LiveKit ----------------------------------------------------------------------------


def test_livekit_streams_and_synthesizes_and_survives_a_stream_closed_midway(server):
    import aiohttp
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
    from livekit.plugins import cartesia

    sentences = ["Hello there, this is a test. ", "It has two sentences."]
    cancelled = turns(server, "cancelled")

    async def go():
        async with aiohttp.ClientSession() as session:
            tts = cartesia.TTS(
                api_key="any", base_url=server.http, voice="agent", http_session=session
            )
            try:
                stream = tts.stream()
                for sentence in sentences:
                    stream.push_text(sentence)
                stream.flush()
                stream.end_input()
                frames, words = [], []
                async with asyncio.timeout(TIMEOUT):
                    async for ev in stream:
                        frames.append(ev.frame)
                        words += ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
                whole = [ev.frame async for ev in tts.synthesize(SHORT)]

                cut = tts.stream()
                cut.push_text(LONG)
                cut.end_input()
                async with asyncio.timeout(TIMEOUT):
                    await anext(cut)  # audio is coming: close it there
                await cut.aclose()  # LiveKit sends no cancel: it drops the pooled socket
                again_stream = tts.stream()  # on a new socket (the old one closes now)
                again_stream.push_text(SHORT)
                again_stream.end_input()
                async with asyncio.timeout(TIMEOUT):
                    again = [ev.frame async for ev in again_stream]
                await until(lambda: turns(server, "cancelled") == cancelled + 1)
            finally:
                await tts.aclose()
            await until(lambda: live_turns(server) == 0)
            return frames, words, whole, again

    frames, words, whole, again = run(go())
    samples = np.concatenate([np.frombuffer(f.data, "<i2") for f in frames])
    assert all(f.sample_rate == 24000 and f.num_channels == 1 for f in frames)
    assert 2.0 < len(samples) / 24000 < 15.0
    assert "".join(words).split() == words_of("".join(sentences))
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and words[-1].end_time <= len(samples) / 24000 + 0.02
    pcm = b"".join(bytes(f.data) for f in whole)
    expected = bytes_of(server, SHORT, 24000)
    assert pcm[: len(expected)] == expected  # LiveKit pads its last frame with silence
    assert len(pcm) - len(expected) < 2 * 2400 and not any(pcm[len(expected) :])
    assert b"".join(bytes(f.data) for f in again)[: len(expected)] == expected
