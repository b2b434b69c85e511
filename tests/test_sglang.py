"""The LM exported for SGLang, served by a real, stock SGLang server on this CPU.

SGLang lives in its own venv (`bash deploy/setup-sglang.sh` -> .venv-sglang, or
VOICEAGENT_SGLANG_PYTHON). Without it the SGLang tests skip and say so; CI installs it.
The only test-environment aid is tests/sglang_shim (a stand-in for a vllm import that
SGLang makes on non-CUDA platforms; see the file).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from conftest import run
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from voiceagent.bench.clients import Client, TurnResult, connect
from voiceagent.engine.embedded import EmbeddedEngine
from voiceagent.engine.lm_engine import EngineError, EngineUnavailable
from voiceagent.engine.sglang.client import SGLangLM
from voiceagent.engine.sglang.export import META, export_sglang
from voiceagent.model.sampling import SamplingParams
from voiceagent.model.speech_model import SpeechModel
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.session.playout import PlayoutConfig

ROOT = Path(__file__).resolve().parents[1]
SGLANG_PYTHON = Path(os.environ.get("VOICEAGENT_SGLANG_PYTHON", ROOT / ".venv-sglang/bin/python"))
needs_sglang = pytest.mark.skipif(
    not SGLANG_PYTHON.exists(),
    reason=f"SGLang is not installed at {SGLANG_PYTHON} (run: bash deploy/setup-sglang.sh)",
)


def test_export_merges_the_vocabularies(tmp_path, tiny_model):
    meta = export_sglang(tiny_model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    state = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    lm = tiny_model.lm
    t, s = meta["text_vocab"], meta["speech_vocab"]
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["vocab_size"] % 64 == 0
    embed, head = state["model.embed_tokens.weight"], state["lm_head.weight"]
    assert torch.equal(embed[:t], lm.llm.model.model.embed_tokens.weight)
    assert torch.equal(embed[t : t + s], lm.speech_embedding.weight)
    assert torch.equal(embed[meta["sos_id"]], lm.llm_embedding.weight[0])
    assert torch.equal(head[t : t + s], lm.llm_decoder.weight)
    assert not head[:t].any() and not head[t + s :].any()  # only speech ids can win
    assert meta["decoder_bias"] == lm.llm_decoder.bias.tolist()  # travels in logit_bias
    assert json.loads((tmp_path / META).read_text())["stop_ids"] == [t + 6561, t + 6562, t + 6563]


class SGLangServer:
    def __init__(self, model_dir: Path, log: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "sglang_shim")}
        cmd = [
            str(SGLANG_PYTHON), "-m", "sglang.launch_server", "--model-path", str(model_dir),
            "--device", "cpu", "--attention-backend", "torch_native",
            "--sampling-backend", "pytorch", "--skip-tokenizer-init",
            "--incremental-streaming-output", "--host", "127.0.0.1", "--port", str(self.port),
            # A KV pool sized for the tests: by default SGLang zeroes ~70 % of the RAM for
            # it on a CPU, half a minute of every start on a 2-core machine.
            "--max-total-tokens", "20000",
        ]  # fmt: skip
        self.log = log
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"SGLang did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def sglang(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: SpeechModel
) -> Iterator[tuple[SGLangServer, Path]]:
    if not SGLANG_PYTHON.exists():
        pytest.skip(
            f"SGLang is not installed at {SGLANG_PYTHON} (run: bash deploy/setup-sglang.sh)"
        )
    out = tmp_path_factory.mktemp("sglang-export")
    export_sglang(tiny_model, out)
    server = SGLangServer(out, out / "sglang.log")
    yield server, out
    server.kill()


async def _tokens(lm, model: SpeechModel, temperature: float, min_len: int, max_len: int):
    voice = model.voices["agent"]
    text = model.tokenizer.encode("Hello there, how are you?")
    stream = lm.generate(
        text, voice, SamplingParams(temperature=temperature), torch.Generator(), min_len, max_len
    )
    tokens: list[int] = []
    async for new in stream:
        tokens += new
    return tokens, stream


@needs_sglang
def test_sglang_greedy_tokens_equal_the_embedded_engine(sglang, tiny_model):
    server, export = sglang
    sg = SGLangLM(tiny_model, server.url, export)
    embedded = EmbeddedEngine(tiny_model)
    embedded.start()
    try:
        theirs, stream = run(_tokens(sg, tiny_model, 0.0, 12, 40))
        ours, _ = run(_tokens(embedded.lm, tiny_model, 0.0, 12, 40))
    finally:
        embedded.stop()
    assert len(ours) == 40 and theirs == ours  # decoder bias and min length carried over
    assert stream.cached_tokens > 0  # the second phase reused the first one's prefix


@needs_sglang
def test_sglang_decodes_a_voice_without_transcript_as_the_embedded_engine(sglang, tiny_model):
    """Greedy, the same tokens from the same prompt, which holds neither the prompt's text
    nor its speech tokens (a voice made without a transcript: docs/voices.md)."""
    server, export = sglang
    voice = dataclasses.replace(tiny_model.voices["agent"], lm_prompt=False)
    text = tiny_model.tokenizer.encode("Hello there, how are you?")

    async def tokens(lm):
        gen = torch.Generator().manual_seed(0)
        stream = lm.generate(text, voice, SamplingParams(temperature=0.0), gen, 12, 40)
        return [t async for new in stream for t in new], stream.prompt_tokens

    embedded = EmbeddedEngine(tiny_model)
    embedded.start()
    try:
        theirs, their_prompt = run(tokens(SGLangLM(tiny_model, server.url, export)))
        ours, our_prompt = run(tokens(embedded.lm))
    finally:
        embedded.stop()
    assert their_prompt == our_prompt == len(text) + 2
    assert len(ours) == 40 and theirs == ours


@needs_sglang
def test_eight_sessions_stream_through_sglang_and_report_cached_tokens(sglang, tiny_model, caplog):
    server, export = sglang
    config = ServerConfig(port=free_port(), playout=PlayoutConfig(lead_ms=100_000))
    voices = ["agent", "narrator", "supervisor"]
    lm = SGLangLM(tiny_model, server.url, export)
    caplog.set_level(logging.DEBUG, logger="voiceagent")
    progress: dict[int, str] = {}  # where each session is, for a failure's message
    with BackgroundServer(tiny_model, config, lm) as vs:

        async def session(i: int):
            async with connect(vs.url) as ws:
                c = Client(ws)
                await c.start(voice=voices[i % 3], sampling={"seed": i})
                got = TurnResult()
                try:
                    progress[i] = f"first turn from {time.monotonic():.1f}"
                    await c.send({"type": "speak", "text": f"Caller {i} is on the line."})
                    first = await c.turn(into=got)
                    progress[i] = f"second turn from {time.monotonic():.1f}"
                    got = TurnResult()
                    await c.send({"type": "speak", "text": f"Caller {i} is on the line."})
                    again = await c.turn(into=got)
                except TimeoutError:
                    acoustic = vs.engine.acoustic
                    progress[i] += (
                        f", with {len(got.frames)} frames and events "
                        f"{[e['type'] for e in got.events]}; then SGLang requests open: "
                        f"{sorted(lm._active)}, acoustic chunks queued "
                        f"{acoustic._jobs.qsize()}, in work {acoustic.working}, rounds "
                        f"{acoustic.rounds}"
                    )
                    raise
                progress[i] = "done"
                return first, again

        async def together():
            return await asyncio.gather(*(session(i) for i in range(8)))

        try:
            results = run(together())
        except TimeoutError as exc:
            raise AssertionError(
                f"a turn stalled at {time.monotonic():.1f}: {progress}\n"
                f"SGLang log:\n{server.log.read_text()[-8000:]}"
            ) from exc
    for first, again in results:
        assert first.frames and first.event("turn.done")["timings"]["tokens"] > 0
        # The repeated voice prompt is a shared prefix: SGLang reports it cached.
        assert again.event("turn.done")["timings"]["cached_tokens"] > 0


@needs_sglang
def test_cancel_aborts_the_request_on_sglang(sglang, tiny_model):
    server, export = sglang
    lm = SGLangLM(tiny_model, server.url, export)
    config = ServerConfig(port=free_port(), playout=PlayoutConfig(lead_ms=100_000))
    with BackgroundServer(tiny_model, config, lm) as vs:

        async def go():
            async with connect(vs.url) as ws:
                c = Client(ws)
                await c.start()
                # One long segment (no sentence marks, 120 words: two phases of about half a
                # second each on SGLang here), cancelled while its request runs. Not at the
                # first frame: on a busy machine the audio came after the request had ended.
                await c.send({"type": "speak", "text": "and then " * 60, "turn_id": "x"})
                deadline = time.monotonic() + 60
                while lm.load == 0:
                    assert time.monotonic() < deadline, "the request never reached SGLang"
                    await asyncio.sleep(0.005)
                await c.send({"type": "cancel"})
                cancelled = await c.turn(until=("turn.cancelled",))
                await asyncio.sleep(0.5)
                return cancelled

        cancelled = run(go())
    assert cancelled.event("turn.cancelled")["turn_id"] == "x"
    assert lm.load == 0
    assert "/abort_request" in server.log.read_text()


def test_sglang_down_is_reported_not_hung(tiny_model, tmp_path, caplog):
    export_sglang(tiny_model, tmp_path)
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = ServerConfig(port=free_port())
    with BackgroundServer(tiny_model, config, SGLangLM(tiny_model, nowhere, tmp_path)) as vs:
        try:
            urllib.request.urlopen(vs.http + "/health", timeout=5)
            raise AssertionError("health must not be 200 while SGLang is down")
        except urllib.error.HTTPError as err:
            assert err.code == 503 and json.loads(err.read())["ready"] is False

        async def go():
            async with connect(vs.url) as ws:
                c = Client(ws)
                await c.start()
                t0 = time.monotonic()
                r = await c.speak("Anyone there?")
                return r, time.monotonic() - t0

        r, waited = run(go())
    error = r.event("error")
    assert error["code"] == "engine_unavailable" and error["turn_id"] == "t1"
    assert waited < 5
    assert any("not reachable yet" in rec.getMessage() for rec in caplog.records)


# SGLang's answers to a request it cannot serve. A stock SGLang gives them under overload
# or misconfiguration only, so here they come from httpx's MockTransport in their
# documented shapes (the rejection of an over-long prompt and sglang-router without
# workers are real, below). What was seen: the error chunk and the abort ended the turn
# as a success, with no audio or cut short, and no error.
def sglang_answer(status: int, *chunks: dict[str, Any] | str) -> httpx.MockTransport:
    body = "".join(
        f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks
    ).encode()
    return httpx.MockTransport(lambda request: httpx.Response(status, content=body))


def tokens_chunk(ids: list[int], reason: Any = None) -> dict[str, Any]:
    return {
        "output_ids": ids,
        "meta_info": {"completion_tokens": len(ids), "finish_reason": reason},
    }


@pytest.mark.parametrize(
    ("answer", "failure"),
    [
        (sglang_answer(200, {"error": {"message": "input too long", "code": 400}}, "[DONE]"),
         EngineError),
        (sglang_answer(200, tokens_chunk([5, 6]),
                       tokens_chunk([5, 6, 7], {"type": "abort", "status_code": 503}), "[DONE]"),
         EngineUnavailable),
        (sglang_answer(200, tokens_chunk([5, 6])), EngineUnavailable),  # cut off
        (sglang_answer(503, "no available workers"), EngineUnavailable),
        (sglang_answer(400, "bad request"), EngineError),
    ],
    ids=["error-chunk", "abort-503", "cut-off", "http-503", "http-400"],
)  # fmt: skip
def test_a_request_sglang_cannot_serve_fails_its_stream_with_the_right_error(
    tiny_model, tmp_path, answer, failure
):
    export_sglang(tiny_model, tmp_path)
    lm = SGLangLM(tiny_model, "http://sglang.invalid", tmp_path)
    lm._client = httpx.AsyncClient(transport=answer)

    async def go():
        async with lm._client:
            text = tiny_model.tokenizer.encode("Hello.")
            stream = lm.generate(
                text, tiny_model.voices["agent"], SamplingParams(), torch.Generator(), 0, 40
            )
            async for _ in stream:
                pass

    with pytest.raises(failure) as raised:
        run(go())
    assert type(raised.value) is failure
    assert "sglang.invalid" not in str(raised.value)  # its address stays in the log
    reason = "unavailable" if failure is EngineUnavailable else "error"
    assert lm.metrics.sglang_failures.labels(reason)._value.get() == 1


class HoldingLMServer:
    """A stand-in for a busy SGLang (a real one cannot hold a hundred streams open on this
    CPU): /generate streams one token, then holds the stream open until released."""

    def __init__(self, offset: int) -> None:
        self.release = threading.Event()

        async def generate(request: Request) -> StreamingResponse:
            async def body() -> AsyncIterator[str]:
                info = {"completion_tokens": 1, "finish_reason": None}
                yield f"data: {json.dumps({'output_ids': [offset + 5], 'meta_info': info})}\n\n"
                while not self.release.is_set():
                    await asyncio.sleep(0.05)

            return StreamingResponse(body(), media_type="text/event-stream")

        async def health(request: Request) -> PlainTextResponse:
            return PlainTextResponse("ok")

        app = Starlette(
            routes=[Route("/generate", generate, methods=["POST"]), Route("/health", health)]
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_more_live_requests_than_httpx_s_default_pool_all_stream_and_readiness_holds(
    tiny_model, tmp_path
):
    """What was seen: with 100 requests streaming (under the 128 live turns a server
    takes), the readiness probe timed out and the 101st request failed after 30 s with
    engine_unavailable, while the LM server was fine."""
    meta = export_sglang(tiny_model, tmp_path)
    busy = HoldingLMServer(int(meta["speech_offset"]))
    lm = SGLangLM(tiny_model, busy.url, tmp_path, timeout_s=60)
    text = tiny_model.tokenizer.encode("Hello.")

    async def go() -> bool:
        voice = tiny_model.voices["agent"]
        streams = [
            lm.generate(text, voice, SamplingParams(), torch.Generator(), 0, 100)
            for _ in range(110)
        ]
        try:
            async with asyncio.timeout(30):
                for stream in streams:  # each one's first token: every request streams
                    assert await anext(stream)
                return await lm.healthy()
        finally:
            for stream in streams:
                stream.cancel()

    try:
        assert run(go())
    finally:
        busy.stop()


@needs_sglang
def test_a_prompt_longer_than_sglang_takes_fails_with_its_reason(sglang, tiny_model):
    """Its context (32,768 positions here) is more than a session's text limit allows;
    an LM server configured with less refuses such a prompt in an error chunk."""
    server, export = sglang
    lm = SGLangLM(tiny_model, server.url, export)
    text = tiny_model.tokenizer.encode("and then ") * 4000

    async def go(ids):
        stream = lm.generate(
            ids, tiny_model.voices["agent"], SamplingParams(), torch.Generator(), 0, 20
        )
        return [t async for new in stream for t in new]

    assert len(text) > 33_000
    with pytest.raises(EngineError) as refused:
        run(go(text))
    assert type(refused.value) is EngineError and "longer" in str(refused.value)
    assert run(go(text[:20]))  # and it serves on


class Router:
    """sglang-router (the SGLang project's load balancer) in front of `workers`."""

    def __init__(self, workers: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(SGLANG_PYTHON), "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--policy", "cache_aware", "--worker-urls", *workers]
        cmd += ["--prometheus-port", str(free_port())]  # its own metrics port (default 29000)
        self.proc = subprocess.Popen(
            cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while True:  # up: its /health answers (with or without workers)
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except urllib.error.HTTPError:
                return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"sglang-router did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@needs_sglang
def test_turns_run_through_sglang_router_and_readiness_follows_its_workers(
    sglang, tiny_model, tmp_path
):
    """Several LM servers behind sglang-router (here one): voiceagent only knows the
    router. Its /health says 200 even without workers, so readiness must not trust it."""
    server, export = sglang
    with contextlib.ExitStack() as routers:
        routed = Router([server.url], tmp_path / "router.log")
        routers.callback(routed.kill)
        empty = Router([], tmp_path / "router-empty.log")
        routers.callback(empty.kill)
        config = ServerConfig(port=free_port(), playout=PlayoutConfig(lead_ms=100_000))
        with BackgroundServer(tiny_model, config, SGLangLM(tiny_model, routed.url, export)) as vs:
            ready = httpx.get(f"{vs.http}/readyz")
            for _ in range(60):  # the router admits its worker after a health check
                if ready.status_code == 200:
                    break
                time.sleep(0.5)
                ready = httpx.get(f"{vs.http}/readyz")

            async def go():
                async with connect(vs.url) as ws:
                    c = Client(ws)
                    await c.start()
                    return await c.speak("Through the router.")

            spoken = run(go())
        config = ServerConfig(port=free_port())
        with BackgroundServer(tiny_model, config, SGLangLM(tiny_model, empty.url, export)) as vs:
            lonely = httpx.get(f"{vs.http}/readyz")
            refused = run(go())  # (what was seen: synthesis_failed, with the router's words)
    assert ready.status_code == 200, ready.text
    assert spoken.frames and spoken.event("turn.done")["timings"]["tokens"] > 0
    assert lonely.status_code == 503
    assert lonely.json()["reasons"] == ["LM engine 'sglang' is not reachable"]
    assert refused.event("error")["code"] == "engine_unavailable", refused.events


@needs_sglang
def test_sglang_killed_mid_turn_fails_the_turn_within_a_second_then_recovers(sglang, tiny_model):
    """Runs last in this module: it kills the shared SGLang server, then starts a new one
    on the same port, and the same session speaks again. Meanwhile /readyz says why it
    is not ready, and turns ready again by itself; the metrics count the failure."""
    server, export = sglang
    config = ServerConfig(port=free_port(), playout=PlayoutConfig(lead_ms=100_000))
    with BackgroundServer(tiny_model, config, SGLangLM(tiny_model, server.url, export)) as vs:

        async def go():
            async with connect(vs.url) as ws:
                c = Client(ws)
                await c.start()
                await c.send({"type": "speak", "text": "A long answer. " * 20})
                while not isinstance(await ws.recv(), bytes):
                    pass
                server.kill()
                t0 = time.monotonic()
                r = await c.turn(until=("turn.done",))
                waited = time.monotonic() - t0
                async with httpx.AsyncClient() as http:
                    down = await http.get(f"{vs.http}/readyz")
                    revived = await asyncio.to_thread(
                        SGLangServer, export, export / "sglang2.log", server.port
                    )
                    try:
                        for _ in range(120):  # SGLang answers the probe once it is warm
                            up = await http.get(f"{vs.http}/readyz")
                            if up.status_code == 200:
                                break
                            await asyncio.sleep(0.5)
                        again = await c.speak("Back again.")
                    finally:
                        revived.kill()
                    metrics = (await http.get(f"{vs.http}/metrics")).text
                return r, waited, again, down, up, metrics

        r, waited, again, down, up, metrics = run(go())
    assert down.status_code == 503
    assert down.json()["reasons"] == ["LM engine 'sglang' is not reachable"]
    assert up.status_code == 200 and up.json()["ready"]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    assert samples[("voiceagent_sglang_failures_total", (("reason", "unavailable"),))] == 1
    assert samples[("voiceagent_errors_total", (("code", "engine_unavailable"),))] == 1
    failed = (("outcome", "failed"), ("transport", "websocket"))
    assert samples[("voiceagent_turns_total", failed)] == 1
    assert samples[("voiceagent_sglang_request_seconds_count", (("phase", "first_token"),))] >= 2
    assert r.event("error")["code"] == "engine_unavailable"
    assert waited < 1.0
    assert again.frames and again.event("turn.done")["timings"]["tokens"] > 0
