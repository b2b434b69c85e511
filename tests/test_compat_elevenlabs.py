"""The ElevenLabs-compatible API (voiceagent/compat/elevenlabs.py) with the real clients
against a real server on loopback: Pipecat's ElevenLabsTTSService (multi-stream-input) and
ElevenLabsHttpTTSService (stream/with-timestamps), LiveKit's elevenlabs plugin
(multi-stream-input and POST stream), and a raw websockets client for the protocol's
edges. The tiny model's audio is noise, but real audio in shape and timing."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import av
import httpx
import numpy as np
import pytest
import websockets
from conftest import run

from voiceagent.audio.codecs import mulaw_decode
from voiceagent.auth import keys
from voiceagent.auth.gate import AuthConfig
from voiceagent.server.background import BackgroundServer

TEXT = "Hello there, this is a test. How are you today?"
FRAME_MS = 20
TIMEOUT = 30.0  # generous: two busy cores


def voice_of(server: BackgroundServer) -> str:
    return next(iter(server.engine.model.voices))


def ws_base(server: BackgroundServer) -> str:
    return server.http.replace("http://", "ws://")


def multi_url(server: BackgroundServer, fmt: str = "pcm_16000", **query: Any) -> str:
    params = "&".join(f"{k}={v}" for k, v in {"output_format": fmt, **query}.items())
    return f"{ws_base(server)}/v1/text-to-speech/{voice_of(server)}/multi-stream-input?{params}"


async def until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Wait for a condition the server reaches on its own (no event to wait on)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


# -- a raw client -------------------------------------------------------------------------


@dataclass
class Heard:
    """What one context received."""

    audio: bytearray = field(default_factory=bytearray)
    alignments: list[dict[str, list[Any]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    final: bool = False


class Raw:
    """A websockets client that files each message under its context."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.contexts: dict[str | None, Heard] = {}
        self.order: list[tuple[str | None, str]] = []  # (context, kind) as they came

    async def send(self, **msg: Any) -> None:
        await self.ws.send(json.dumps(msg))

    async def next(self) -> dict[str, Any]:
        async with asyncio.timeout(TIMEOUT):
            msg: dict[str, Any] = json.loads(await self.ws.recv())
        cid = msg.get("contextId")
        assert cid == msg.get("context_id"), msg
        heard = self.contexts.setdefault(cid, Heard())
        if msg.get("audio"):
            heard.audio += base64.b64decode(msg["audio"])
            self.order.append((cid, "audio"))
        if msg.get("alignment"):
            assert msg["alignment"] == msg["normalizedAlignment"]
            heard.alignments.append(msg["alignment"])
        if msg.get("error"):
            heard.errors.append(msg["error"])
            self.order.append((cid, "error"))
        if msg.get("isFinal"):
            heard.final = True
            self.order.append((cid, "final"))
        return msg

    async def final(self, *contexts: str) -> None:
        while not all(self.contexts.get(c, Heard()).final for c in contexts):
            await self.next()

    async def speak(self, cid: str, text: str = TEXT, **init: Any) -> None:
        """Pipecat's way: open, text, a flush of its own, close."""
        await self.send(text=" ", context_id=cid, **init)
        await self.send(text=text, context_id=cid)
        await self.send(context_id=cid, flush=True)
        await self.send(context_id=cid, close_context=True)


def span_ms(alignment: dict[str, list[Any]]) -> int:
    return int(alignment["charStartTimesMs"][-1] + alignment["charDurationsMs"][-1])


async def spoken(url: str, text: str = TEXT, **init: Any) -> Heard:
    async with websockets.connect(url) as ws:
        raw = Raw(ws)
        await raw.speak("c", text, **init)
        await raw.final("c")
        return raw.contexts["c"]


# -- Pipecat ------------------------------------------------------------------------------


@pytest.fixture
def quiet_loguru() -> Any:
    from loguru import logger

    logger.remove()
    handler = logger.add(sys.stderr, level="WARNING")
    yield
    logger.remove(handler)


class PipecatRun:
    """A minimal Pipecat pipeline: the TTS service and a sink that records frames."""

    def __init__(self, service: Any, sample_rate: int) -> None:
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineParams, PipelineWorker
        from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
        from pipecat.workers.runner import WorkerRunner

        frames: list[Any] = []
        changed = asyncio.Event()

        class Sink(FrameProcessor):
            async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
                await super().process_frame(frame, direction)
                if direction == FrameDirection.DOWNSTREAM:
                    frames.append(frame)
                    changed.set()
                await self.push_frame(frame, direction)

        self.frames, self.changed = frames, changed
        params = PipelineParams(audio_out_sample_rate=sample_rate)
        self.worker = PipelineWorker(
            Pipeline([service, Sink()]), params=params, cancel_on_idle_timeout=False
        )
        self.runner = WorkerRunner()

    async def __aenter__(self) -> PipecatRun:
        await self.runner.add_workers(self.worker)
        self.task = asyncio.get_running_loop().create_task(self.runner.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        from pipecat.frames.frames import EndFrame

        await self.worker.queue_frame(EndFrame())
        async with asyncio.timeout(TIMEOUT):
            await self.task

    async def wait(self, predicate: Callable[[list[Any]], bool]) -> None:
        async with asyncio.timeout(TIMEOUT):
            while not predicate(self.frames):
                self.changed.clear()
                await self.changed.wait()


def of_type(frames: list[Any], kind: type) -> list[Any]:
    return [f for f in frames if isinstance(f, kind)]


def check_words(frames: list[Any], text: str, sample_rate: int) -> None:
    """The words come back in order, on a rising clock within the audio's length."""
    from pipecat.frames.frames import TTSAudioRawFrame, TTSTextFrame

    words = of_type(frames, TTSTextFrame)
    assert [w.text for w in words] == text.split()
    pts = [w.pts for w in words]
    assert pts == sorted(pts) and len(set(pts)) == len(pts)
    audio = b"".join(f.audio for f in of_type(frames, TTSAudioRawFrame))
    assert len(audio) % 2 == 0
    seconds = len(audio) / 2 / sample_rate
    assert 0 < (pts[-1] - pts[0]) / 1e9 < seconds


def test_pipecat_speaks_with_word_timestamps(server: BackgroundServer, quiet_loguru: Any) -> None:
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    async def main() -> None:
        service = ElevenLabsTTSService(
            api_key="unused-on-loopback",
            url=ws_base(server),
            settings=ElevenLabsTTSService.Settings(voice=voice_of(server)),
        )
        async with PipecatRun(service, 16000) as pc:
            await pc.worker.queue_frame(TTSSpeakFrame(TEXT))
            await pc.wait(lambda fs: bool(of_type(fs, TTSStoppedFrame)))
            audio = of_type(pc.frames, TTSAudioRawFrame)
            assert audio and all(f.sample_rate == 16000 for f in audio)
            check_words(pc.frames, TEXT, 16000)

    run(main())
    assert server.voice_server.admission.live_turns == 0


def test_pipecat_interruption_stops_audio_and_the_next_reply_works(
    server: BackgroundServer, quiet_loguru: Any
) -> None:
    from pipecat.frames.frames import (
        InterruptionFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
        TTSStoppedFrame,
    )
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    admission = server.voice_server.admission
    metrics = server.engine.metrics

    async def main() -> None:
        service = ElevenLabsTTSService(
            api_key="k",
            url=ws_base(server),
            settings=ElevenLabsTTSService.Settings(voice=voice_of(server)),
        )
        async with PipecatRun(service, 24000) as pc:
            # an LLM reply, still streaming (its end never comes): the bot is mid-reply
            await pc.worker.queue_frame(LLMFullResponseStartFrame())
            for i in range(12):
                await pc.worker.queue_frame(LLMTextFrame(f"Sentence {i} goes on for a while. "))
            await pc.wait(lambda fs: bool(of_type(fs, TTSAudioRawFrame)))
            assert admission.live_turns == 1
            await pc.worker.queue_frame(InterruptionFrame())
            await until(lambda: admission.live_turns == 0, timeout=5)  # synthesis stopped
            cancelled = metrics.turns.labels("elevenlabs", "cancelled")._value.get()
            assert cancelled == 1

            before = len(pc.frames)
            await pc.worker.queue_frame(TTSSpeakFrame(TEXT))
            await pc.wait(lambda fs: bool(of_type(fs[before:], TTSStoppedFrame)))
            check_words(pc.frames[before:], TEXT, 24000)

    run(main())
    assert metrics.turns.labels("elevenlabs", "done")._value.get() == 1


def test_pipecat_http_service_with_timestamps(server: BackgroundServer, quiet_loguru: Any) -> None:
    from pipecat.frames.frames import TTSSpeakFrame, TTSStoppedFrame
    from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            service = ElevenLabsHttpTTSService(
                api_key="k",
                aiohttp_session=http,
                base_url=server.http,
                settings=ElevenLabsHttpTTSService.Settings(voice=voice_of(server)),
            )
            async with PipecatRun(service, 22050) as pc:
                await pc.worker.queue_frame(TTSSpeakFrame(TEXT))
                await pc.wait(lambda fs: bool(of_type(fs, TTSStoppedFrame)))
                check_words(pc.frames, TEXT, 22050)

    run(main())


# -- LiveKit ------------------------------------------------------------------------------


def livekit_tts(server: BackgroundServer, http: aiohttp.ClientSession, **kw: Any) -> Any:
    from livekit.plugins import elevenlabs

    kw.setdefault("api_key", "unused-on-loopback")
    return elevenlabs.TTS(
        base_url=f"{server.http}/v1",
        voice_id=voice_of(server),
        encoding="pcm_24000",
        http_session=http,
        **kw,
    )


def test_livekit_stream_and_synthesize(server: BackgroundServer) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            tts = livekit_tts(server, http)
            stream = tts.stream()
            stream.push_text("Hello there, this is a test. ")
            stream.push_text("How are you today?")
            stream.end_input()
            samples, words = 0, []
            async for ev in stream:
                assert ev.frame.sample_rate == 24000
                samples += ev.frame.samples_per_channel
                words += ev.frame.userdata.get("lk.timed_transcripts") or []
            seconds = samples / 24000
            assert [str(w).strip() for w in words] == TEXT.split()
            starts = [w.start_time for w in words]
            assert starts == sorted(starts) and starts[0] == 0  # the context's own clock
            assert abs(words[-1].end_time - seconds) <= FRAME_MS / 1000

            said = 0
            async for ev in tts.synthesize("One more thing to say."):  # POST .../stream
                said += ev.frame.samples_per_channel
            assert said > 0
            await tts.aclose()

    run(main())
    assert server.voice_server.admission.live_turns == 0


def test_livekit_aclose_mid_stream_stops_synthesis(server: BackgroundServer) -> None:
    admission = server.voice_server.admission

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            tts = livekit_tts(server, http)
            stream = tts.stream()
            stream.push_text("This sentence is long enough to take a while to say. " * 10)
            async for _ in stream:
                break  # the first audio: the agent is interrupted
            assert admission.live_turns == 1
            await stream.aclose()
            await until(lambda: admission.live_turns == 0, timeout=5)

            again = tts.stream()  # the same connection goes on
            again.push_text("And now the next one.")
            again.end_input()
            frames = [ev async for ev in again]
            assert frames
            await tts.aclose()

    run(main())


def test_livekit_with_auth_on(make_server: Callable[..., BackgroundServer], tmp_path: Any) -> None:
    from livekit.agents import APIConnectOptions, APIStatusError

    keys_file = tmp_path / "keys.toml"
    keys_file.write_text("")
    key, _ = keys.add_key(keys_file, "acme")
    server = make_server(auth=AuthConfig("on", keys_file, "secret"))

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            tts = livekit_tts(server, http, api_key=key)
            stream = tts.stream()
            stream.push_text(TEXT)
            stream.end_input()
            assert [ev async for ev in stream]
            await tts.aclose()

            wrong = livekit_tts(server, http, api_key="not-a-key")
            once = APIConnectOptions(max_retry=0)
            with pytest.raises(APIStatusError) as refused:
                async for _ in wrong.synthesize("Hi.", conn_options=once):
                    pass
            assert refused.value.status_code == 401
            await wrong.aclose()

    run(main())


# -- the protocol's edges, with a raw client ----------------------------------------------


def test_two_contexts_interleaved_on_one_socket_both_complete(server: BackgroundServer) -> None:
    async def main() -> None:
        async with websockets.connect(multi_url(server, sync_alignment="true")) as ws:
            raw = Raw(ws)
            await raw.send(text=" ", context_id="a")
            await raw.send(text=" ", context_id="b", voice_settings={"speed": 1.2})
            await raw.send(text="First words for a, ", context_id="a")
            await raw.send(text="and the other one speaks here, ", context_id="b")
            await raw.send(text="and then a ends.", context_id="a")
            await raw.send(text="and then b ends too.", context_id="b")
            for cid in ("b", "a"):
                await raw.send(context_id=cid, flush=True)
                await raw.send(context_id=cid, close_context=True)
            await raw.final("a", "b")
            for cid, text in (
                ("a", "First words for a, and then a ends."),
                ("b", "and the other one speaks here, and then b ends too."),
            ):
                heard = raw.contexts[cid]
                assert heard.audio and not heard.errors
                chars = "".join(c for al in heard.alignments for c in al["chars"])
                assert chars.split() == text.split()
                # sync_alignment: the context's own clock, rising from 0 to its audio's end
                starts = [t for al in heard.alignments for t in al["charStartTimesMs"]]
                assert starts[0] == 0 and starts == sorted(starts)
                audio_ms = len(heard.audio) / 2 / 16
                assert abs(span_ms(heard.alignments[-1]) - audio_ms) <= FRAME_MS
            assert server.voice_server.admission.live_turns == 0

    run(main())


def test_close_context_stops_a_context(server: BackgroundServer) -> None:
    admission = server.voice_server.admission

    async def main() -> None:
        async with websockets.connect(multi_url(server)) as ws:
            raw = Raw(ws)
            # a barge-in: close_context after text (no flush of its own before it)
            await raw.send(text="This goes on and on. " * 20, context_id="x", flush=True)
            while not raw.contexts.get("x", Heard()).audio:
                await raw.next()
            await raw.send(context_id="x", close_context=True)
            await raw.final("x")
            assert admission.live_turns == 0  # stopped at once, not at the end
            assert len(raw.contexts["x"].audio) / 2 / 16000 < 20

            # a context that ended (flush, close) stops too when closed a second time
            await raw.speak("y", "This goes on and on. " * 20)
            while not raw.contexts.get("y", Heard()).audio:
                await raw.next()
            await raw.send(context_id="y", close_context=True)
            await raw.final("y")
            assert admission.live_turns == 0
            assert raw.order[-1] == ("y", "final")

            # after isFinal nothing more of it comes; the socket goes on
            await raw.speak("z", "Short.")
            await raw.final("z")
            assert raw.order[-1] == ("z", "final")
            assert all(c == "z" for c, _ in raw.order[raw.order.index(("y", "final")) + 1 :])

    run(main())


def test_keep_alives_and_stray_messages_make_no_audio(server: BackgroundServer) -> None:
    async def main() -> None:
        async with websockets.connect(multi_url(server)) as ws:
            raw = Raw(ws)
            await raw.send(text="")  # Pipecat's keep-alive before any context
            await raw.send(text="", context_id="never-opened")  # opens nothing
            await raw.send(text=" ", context_id="k")  # opens k, nothing to say yet
            await raw.send(text="", context_id="k")  # Pipecat's keep-alive of k
            await raw.send(context_id="gone", flush=True)  # a context already over:
            await raw.send(context_id="gone", close_context=True)  # a harmless race
            await ws.send("{not json")
            # replies come in order: had anything above answered, it would come first
            first = await raw.next()
            assert first.get("error") == "invalid_json" and "contextId" not in first
            await ws.send("[" * 100_000 + "]" * 100_000)  # seen: the socket died
            assert (await raw.next()).get("error") == "invalid_json"
            assert "never-opened" not in raw.contexts and "k" not in raw.contexts

            await raw.send(context_id="k", close_context=True)  # nothing flushed: stop
            await raw.final("k")
            assert raw.contexts["k"].audio == b""
            assert server.voice_server.admission.live_turns == 0

    run(main())


def test_bad_messages_get_coded_errors_and_the_socket_stays_up(server: BackgroundServer) -> None:
    async def main() -> None:
        async with websockets.connect(multi_url(server)) as ws:
            raw = Raw(ws)
            await ws.send("[1, 2]")
            assert (await raw.next())["error"] == "invalid_message"
            await raw.send(text=5, context_id="a")
            msg = await raw.next()
            assert msg["error"] == "invalid_parameter" and msg["contextId"] == "a"
            await raw.send(text="Hi.", context_id=7)
            assert (await raw.next())["error"] == "invalid_message"
            await raw.send(text="Hi.", context_id="a", flush="yes")
            assert (await raw.next())["error"] == "invalid_parameter"
            await raw.send(text=" ", context_id="s", voice_settings={"speed": 9})
            await raw.final("s")  # refused: the error, then its isFinal
            assert raw.contexts["s"].errors == ["invalid_parameter"]

            for cid in "12345":  # ElevenLabs' limit: five contexts a socket
                await raw.send(text=" ", context_id=cid)
            await raw.send(text=" ", context_id="6")
            await raw.final("6")
            assert raw.contexts["6"].errors == ["too_many_contexts"]

            for cid in "12345":
                await raw.send(context_id=cid, close_context=True)
            await raw.final(*"12345")
            await raw.speak("ok", "Still here.")  # the socket is still usable
            await raw.final("ok")
            assert raw.contexts["ok"].audio
            await raw.send(close_socket=True)
            async with asyncio.timeout(TIMEOUT):
                await ws.wait_closed()
            assert ws.close_code == 1000
        await until(lambda: server.voice_server.admission.live_turns == 0)

    run(main())


async def refusal(url: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, **kw):
            pass
    response = refused.value.response
    return response.status_code, json.loads(response.body or b"{}")


def test_unknown_voice_and_unsupported_formats_are_refused_before_the_upgrade(
    server: BackgroundServer,
) -> None:
    async def main() -> None:
        base = f"{ws_base(server)}/v1/text-to-speech"
        status, body = await refusal(f"{base}/nobody/multi-stream-input?output_format=pcm_16000")
        assert (status, body["code"], body["detail"]["status"]) == (
            400,
            "unknown_voice",
            "unknown_voice",
        )
        status, body = await refusal(multi_url(server, "mp3_44100_7"))  # no such mp3 bitrate
        assert (status, body["code"]) == (400, "unsupported_format")
        status, body = await refusal(multi_url(server, "opus_16000_64"))  # Opus: 48 kHz here
        assert (status, body["code"]) == (400, "unsupported_format")
        status, body = await refusal(multi_url(server, "pcm_12345"))
        assert (status, body["code"]) == (400, "invalid_parameter")
        status, body = await refusal(multi_url(server, inactivity_timeout=999))
        assert (status, body["code"]) == (400, "invalid_parameter")

    run(main())


def test_audio_formats_lengths_alignment_and_determinism(server: BackgroundServer) -> None:
    async def main() -> None:
        pcm16 = await spoken(multi_url(server, "pcm_16000"))
        again = await spoken(multi_url(server, "pcm_16000"))
        assert pcm16.audio == again.audio  # the same text and seed: the same audio
        other = await spoken(multi_url(server, "pcm_16000", seed=7))
        assert other.audio != pcm16.audio  # the seed is honoured

        # without sync_alignment (Pipecat): each alignment counts from 0 and the spans
        # add up to the audio's length
        assert all(al["charStartTimesMs"][0] == 0 for al in pcm16.alignments)
        total_ms = sum(span_ms(al) for al in pcm16.alignments)
        for fmt, rate, width in (
            ("pcm_22050", 22050, 2),
            ("pcm_44100", 44100, 2),
            ("ulaw_8000", 8000, 1),
            ("alaw_8000", 8000, 1),
        ):
            heard = await spoken(multi_url(server, fmt))
            assert len(heard.audio) % width == 0
            audio_ms = len(heard.audio) / width / rate * 1000
            assert abs(audio_ms - total_ms) <= FRAME_MS, fmt
            assert sum(span_ms(al) for al in heard.alignments) == total_ms
            if fmt == "ulaw_8000":
                pcm8 = await spoken(multi_url(server, "pcm_8000"))
                linear = np.frombuffer(bytes(pcm8.audio), "<i2").astype(np.float32)
                decoded = mulaw_decode(bytes(heard.audio)).astype(np.float32)
                assert decoded.shape == linear.shape
                assert np.abs(decoded - linear).max() <= 0.04 * 32768  # μ-law's steps
        for fmt, container in (("mp3_22050_32", "mp3"), ("opus_48000_64", "ogg")):
            heard = await spoken(multi_url(server, fmt))  # encoded as it streams
            with av.open(io.BytesIO(bytes(heard.audio))) as f:
                assert container in f.format.name.split(",")
                stream = f.streams.audio[0]
                decoded_ms = sum(fr.samples for fr in f.decode(stream)) / stream.rate * 1000
            assert abs(decoded_ms - total_ms) <= 120, fmt  # + the codec's priming
            assert sum(span_ms(al) for al in heard.alignments) == total_ms

    run(main())


def test_inactivity_timeout_closes_idle_contexts_and_the_socket(server: BackgroundServer) -> None:
    async def main() -> None:
        async with websockets.connect(multi_url(server, inactivity_timeout=0.5)) as ws:
            raw = Raw(ws)
            await raw.send(text="Words with no end and no flush", context_id="idle")
            await raw.final("idle")
            assert raw.contexts["idle"].errors == ["idle_timeout"]
            msg = await raw.next()  # then, nothing left and nothing heard: the socket
            assert msg["error"] == "idle_timeout" and "contextId" not in msg
            async with asyncio.timeout(TIMEOUT):
                await ws.wait_closed()
            assert ws.close_code == 1008
        assert server.voice_server.admission.live_turns == 0

    run(main())


def test_stream_input_speaks_one_utterance_then_closes(server: BackgroundServer) -> None:
    async def main() -> None:
        url = multi_url(server, "pcm_24000").replace("multi-stream-input", "stream-input")
        async with websockets.connect(url) as ws:
            raw = Raw(ws)
            await raw.send(text=" ", voice_settings={"stability": 0.5}, xi_api_key="x")
            await raw.send(text="Hello there, this is a test. ")
            await raw.send(text="How are you today?", flush=True)
            await raw.send(text="")  # end of input
            while not raw.contexts.get(None, Heard()).final:
                await raw.next()
            heard = raw.contexts[None]
            assert heard.audio and not heard.errors
            assert (
                "".join(c for al in heard.alignments for c in al["chars"]).split() == TEXT.split()
            )
            async with asyncio.timeout(TIMEOUT):
                await ws.wait_closed()
            assert ws.close_code == 1000

    run(main())


def test_http_stream_and_errors(server: BackgroundServer) -> None:
    url = f"{server.http}/v1/text-to-speech/{voice_of(server)}/stream"
    with httpx.Client(timeout=TIMEOUT) as http:
        ok = http.post(url, params={"output_format": "pcm_16000"}, json={"text": TEXT})
        assert ok.status_code == 200 and ok.headers["content-type"].startswith("audio/pcm")
        assert len(ok.content) % 2 == 0 and len(ok.content) > 16000
        timed = http.post(
            f"{url}/with-timestamps",
            params={"output_format": "pcm_16000"},
            json={"text": TEXT, "model_id": "eleven_flash_v2_5", "previous_text": "x"},
        )
        assert timed.status_code == 200
        lines = [json.loads(line) for line in timed.text.splitlines()]
        audio = b"".join(base64.b64decode(line.get("audio_base64", "")) for line in lines)
        assert audio == ok.content  # the same audio, with its alignment beside it
        aligned = [line["alignment"] for line in lines if line["alignment"]]
        assert "".join(c for al in aligned for c in al["characters"]).split() == TEXT.split()
        end_s = aligned[-1]["character_end_times_seconds"][-1]  # seconds from the start
        assert abs(end_s * 1000 - len(audio) / 2 / 16) <= FRAME_MS
        for body, status, code in (
            (b"{nope", 400, "invalid_json"),
            (b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
            (b'{"text": "' + b"a" * (2 << 20) + b'"}', 413, "message_too_large"),
        ):
            bad = http.post(url, params={"output_format": "pcm_16000"}, content=body)
            assert (bad.status_code, bad.json()["detail"]["status"]) == (status, code)
        mp3 = http.post(url, json={"text": TEXT})  # ElevenLabs' default format: mp3_44100_128
        assert mp3.headers["content-type"] == "audio/mpeg"
        with av.open(io.BytesIO(mp3.content)) as f:
            stream = f.streams.audio[0]
            assert (stream.codec_context.name, stream.rate) == ("mp3float", 44100)
            decoded_s = sum(frame.samples for frame in f.decode(stream)) / 44100
        assert abs(decoded_s - len(ok.content) / 2 / 16000) < 0.1  # the same speech
        nobody = http.post(
            url.replace(voice_of(server), "nobody"),
            params={"output_format": "pcm_16000"},
            json={"text": TEXT},
        )
        assert (nobody.status_code, nobody.json()["code"]) == (400, "unknown_voice")


def test_auth_on(make_server: Callable[..., BackgroundServer], tmp_path: Any) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text("")
    key, _ = keys.add_key(keys_file, "acme")
    server = make_server(auth=AuthConfig("on", keys_file, "secret"))

    async def main() -> None:
        status, body = await refusal(multi_url(server))
        assert (status, body["code"]) == (401, "unauthorized")
        status, _ = await refusal(multi_url(server), additional_headers={"xi-api-key": "wrong"})
        assert status == 401
        async with websockets.connect(
            multi_url(server), additional_headers={"xi-api-key": key}
        ) as ws:
            raw = Raw(ws)
            await raw.speak("h", "By header.")
            await raw.final("h")
        async with websockets.connect(multi_url(server, xi_api_key=key)) as ws:
            raw = Raw(ws)
            await raw.speak("q", "By query.")
            await raw.final("q")
            assert raw.contexts["q"].audio

    run(main())
    url = f"{server.http}/v1/text-to-speech/{voice_of(server)}/stream?output_format=pcm_16000"
    assert httpx.post(url, json={"text": "Hi."}).status_code == 401
    assert httpx.post(url, json={"text": "Hi."}, headers={"xi-api-key": key}).status_code == 200


def test_a_break_tag_is_a_pause_not_words_and_the_alignment_shows_the_words(
    server: BackgroundServer,
) -> None:
    """What was seen: ElevenLabs' `<break time="1s"/>` (which its API takes in plain
    text) was read out as "break time equals one s" and came back in the alignment."""

    async def main() -> None:
        heard = await spoken(multi_url(server), 'Hello there. <break time="1s" /> How are you?')
        assert heard.audio and not heard.errors
        chars = "".join(c for al in heard.alignments for c in al["chars"])
        assert chars.split() == ["Hello", "there.", "How", "are", "you?"], chars

    run(main())
