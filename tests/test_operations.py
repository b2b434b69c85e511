"""Operating the server: liveness and readiness, Prometheus metrics that move as turns
run, cancel and fail, admission of turns, structured logs, and the drain on SIGTERM.

Everything runs against real servers on loopback with real websockets clients; the
scrape is parsed with prometheus-client's own parser (a real Prometheus server scrapes
it in test_prometheus.py). SIGTERM goes to a real `voiceagent serve` process.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import websockets
from conftest import run
from prometheus_client.parser import text_string_to_metric_families

from voiceagent.bench.clients import Client, connect
from voiceagent.engine.embedded import EmbeddedEngine
from voiceagent.model.speech_model import SpeechModel
from voiceagent.ops.logs import configure_logging
from voiceagent.protocol.actions import SendAudio
from voiceagent.protocol.errors import CloseCode
from voiceagent.protocol.session import Catalog, Limits, SessionCore
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.session.playout import PlayoutConfig
from voiceagent.session.port import Transport
from voiceagent.session.runner import SessionRunner
from voiceagent.transport.guard import GuardConfig

UNPACED = PlayoutConfig(lead_ms=100_000)  # audio leaves as soon as it exists
LONG_TEXT = "This answer runs on for a while, so that it is still playing. " * 3
# Label names that stay low-cardinality; a session or turn id would be a bug.
ALLOWED_LABELS = {"transport", "outcome", "code", "reason", "stage", "phase", "le", "device"}
ALLOWED_LABELS |= {"kind", "model", "engine"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: BackgroundServer) -> Samples:
    response = httpx.get(f"{server.http}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# -- health and readiness ------------------------------------------------------------


def test_the_ready_gauge_is_current_at_each_scrape(make_server) -> None:
    # What was seen: voiceagent_ready changed only when /readyz was asked; after one
    # /readyz at the session limit, every scrape said 0 with no session open.
    server = make_server(max_sessions=1)

    async def go() -> None:
        async with connect(server.url) as ws:
            await Client(ws).start()
            assert httpx.get(server.http + "/readyz").status_code == 503
            assert value(scrape(server), "voiceagent_ready") == 0

    run(go())
    run(wait_until(lambda: server.voice_server.admission.sessions == 0))
    assert value(scrape(server), "voiceagent_ready") == 1  # no /readyz asked since


def test_healthz_says_alive_and_readyz_says_ready_with_no_reasons(server) -> None:
    assert httpx.get(f"{server.http}/healthz").json() == {"status": "alive"}
    ready = httpx.get(f"{server.http}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "reasons": []}


def test_readyz_is_unready_at_the_session_limit_and_says_why(make_server) -> None:
    server = make_server(max_sessions=1)

    async def go() -> None:
        async with connect(server.url) as ws:
            await Client(ws).start()
            full = httpx.get(f"{server.http}/readyz")
            assert full.status_code == 503
            assert full.json()["reasons"] == ["at the session limit (1)"]
        await wait_until(lambda: server.voice_server.admission.sessions == 0)
        assert httpx.get(f"{server.http}/readyz").status_code == 200

    run(go())


# -- metrics ---------------------------------------------------------------------------


def test_metrics_move_as_turns_finish_cancel_and_meet_errors(make_server) -> None:
    server = make_server(playout=PlayoutConfig(lead_ms=200))
    before = scrape(server)

    async def go() -> None:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            assert (await c.speak("Hello there.")).frames
            during = scrape(server)
            assert value(during, "voiceagent_sessions_active", transport="websocket") == 1
            await c.send({"type": "speak", "text": LONG_TEXT, "turn_id": "long"})
            while not isinstance(await ws.recv(), bytes):  # the turn is playing
                pass
            await c.send({"type": "cancel", "turn_id": "long"})
            cancelled = await c.turn(until=("turn.cancelled",))
            assert cancelled.event("turn.cancelled")["reason"] == "cancel"
            await c.send("{not json")
            assert (await c.event())["code"] == "invalid_json"
        await wait_until(lambda: server.voice_server.admission.sessions == 0)

    run(go())
    after = scrape(server)

    def grew(name: str, by: float | None = None, **labels: str) -> float:
        delta = value(after, name, **labels) - value(before, name, **labels)
        if by is None:
            assert delta > 0, f"{name}{labels} did not grow"
        else:
            assert delta == by, f"{name}{labels} grew by {delta}, not {by}"
        return delta

    ws = {"transport": "websocket"}
    grew("voiceagent_turns_total", 1, outcome="done", **ws)
    grew("voiceagent_turns_total", 1, outcome="cancelled", **ws)
    grew("voiceagent_ttfa_seconds_count", 2, **ws)  # both turns sent audio
    grew("voiceagent_turn_rtf_count", 1)  # only a finished turn has an RTF
    grew("voiceagent_errors_total", 1, code="invalid_json")
    grew("voiceagent_sessions_total", 1, **ws)
    assert value(after, "voiceagent_sessions_active", **ws) == 0
    assert value(after, "voiceagent_turns_active") == 0
    grew("voiceagent_audio_sent_seconds_total", **ws)
    grew("voiceagent_lm_tokens_total")
    grew("voiceagent_lm_batch_size_count")
    grew("voiceagent_lm_queue_wait_seconds_count")
    grew("voiceagent_acoustic_chunk_seconds_count", stage="flow")
    grew("voiceagent_acoustic_chunk_seconds_count", stage="vocoder")
    grew("voiceagent_acoustic_queue_wait_seconds_count")
    assert value(after, "process_resident_memory_bytes") > 10e6
    assert value(after, "voiceagent_info", model="tiny", engine="embedded") == 1
    labels = {name for (_, pairs) in after for name, _ in pairs}
    assert labels <= ALLOWED_LABELS, f"unexpected labels: {labels - ALLOWED_LABELS}"


class HangUpOnDone(Transport):
    """A listener that hangs up the moment it hears `turn.done`, before anything else of
    the server's runs (a real socket can't be made to hit that moment every time): the
    close is the next thing the event loop runs after the event is sent."""

    name = "websocket"

    def __init__(self) -> None:
        self.runner: SessionRunner | None = None
        self.closing: asyncio.Task[None] | None = None

    async def send_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "turn.done" and self.runner is not None:
            self.closing = asyncio.get_running_loop().create_task(self.runner.close())

    async def send_audio(self, frame: SendAudio) -> None:
        pass

    async def drop_turn(self, num: int) -> None:
        pass

    async def close(self, code: int, reason: str) -> None:
        pass


def test_a_session_closed_the_moment_its_turn_is_done_counts_the_turn_once(
    tiny_model: SpeechModel,
) -> None:
    """The turn is done, not also closed: one `turn.end` line, one count (the suite once
    logged two `turn.end` lines for one turn of a client that hung up at `turn.done`)."""
    engine = EmbeddedEngine(tiny_model)
    engine.start()
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    catalog = Catalog(tuple(tiny_model.voices), {}, next(iter(tiny_model.voices)))

    async def go() -> None:
        transport = HangUpOnDone()
        runner = SessionRunner(SessionCore("s", catalog, Limits()), engine, transport)
        transport.runner = runner
        await runner.on_text(json.dumps({"type": "session.start"}))
        await runner.on_text(json.dumps({"type": "speak", "text": "Hi."}))
        await wait_until(lambda: transport.closing is not None and transport.closing.done(), 30)

    try:
        run(go())
    finally:
        configure_logging("warning", "text")
        engine.stop()
    ends = [e for e in map(json.loads, out.getvalue().splitlines()) if e["event"] == "turn.end"]
    assert [e["outcome"] for e in ends] == ["done"]
    turns = engine.metrics.turns
    assert turns.labels("websocket", "done")._value.get() == 1
    assert turns.labels("websocket", "closed")._value.get() == 0


def test_a_turn_cut_by_its_client_hanging_up_counts_the_audio_it_sent(make_server) -> None:
    # What was seen: a caller who hangs up mid-sentence (common on phones) left the turn
    # counted as closed but its audio out of audio_sent_seconds_total, so the underruns
    # per minute of audio read too high.
    server = make_server()

    async def go() -> int:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "speak", "text": "A first and longer sentence to say."})
            frames = 0
            while frames < 25:  # half a second heard
                frames += isinstance(await ws.recv(), bytes)
        return frames

    received = run(go())
    run(wait_until(lambda: server.voice_server.admission.sessions == 0))
    s = scrape(server)
    assert value(s, "voiceagent_turns_total", transport="websocket", outcome="closed") == 1
    sent_s = value(s, "voiceagent_audio_sent_seconds_total", transport="websocket")
    assert sent_s >= received * 0.02, sent_s


def test_a_cancelled_turn_whose_client_leaves_before_its_report_is_still_counted(
    make_server,
) -> None:
    # What was seen: with playback reports on, a cancel waits for the client's report;
    # a client that hung up first left the turn counted nowhere and logged nowhere.
    server = make_server()

    async def go() -> None:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(playback={"reports": True, "timeout_ms": 5000})
            await c.send({"type": "speak", "text": "A long enough answer. " * 6, "turn_id": "a"})
            while not isinstance(await ws.recv(), bytes):
                pass
            await c.send({"type": "cancel", "turn_id": "a"})
        await wait_until(lambda: server.voice_server.admission.sessions == 0)

    run(go())
    samples = scrape(server)
    assert value(samples, "voiceagent_turns_total", transport="websocket", outcome="cancelled") == 1


def test_every_error_a_client_is_told_is_counted(make_server) -> None:
    # What was seen: the rate limit's warnings and the drop-in sockets' errors reached
    # their clients but not voiceagent_errors_total.
    server = make_server(guard=GuardConfig(messages_per_s=5, message_burst=2))

    async def go() -> int:
        told = 0
        async with connect(server.url) as ws:
            await Client(ws).start()
            for _ in range(8):
                await ws.send(json.dumps({"type": "ping"}))
            with contextlib.suppress(TimeoutError):
                while True:
                    event = json.loads(await asyncio.wait_for(ws.recv(), 2.5))
                    told += event.get("code") == "rate_limited"
        async with websockets.connect(server.url.replace("/v1/ws", "/tts/websocket")) as ws:
            await ws.send("{not json")
            assert json.loads(await ws.recv())["error_code"] == "invalid_json"
        return told

    told = run(go())
    samples = scrape(server)
    assert told >= 1 and value(samples, "voiceagent_errors_total", code="rate_limited") == told
    assert value(samples, "voiceagent_errors_total", code="invalid_json") == 1


OPENING_S = 0.25  # generous: from a turn's opening to its text, on a busy machine


def test_ttfa_histogram_matches_what_the_client_was_told(make_server) -> None:
    server = make_server()

    async def go() -> list[float]:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            told = []
            for text in ("One.", "Two words.", "Three small words."):
                done = (await c.speak(text)).event("turn.done")
                told.append(done["timings"]["ttfa_ms"] / 1000)
            return told

    told = run(go())
    s = scrape(server)
    assert value(s, "voiceagent_ttfa_seconds_count", transport="websocket") == 3
    # The metric counts from the turn's first text (a few ms after the turn opened, where
    # `turn.done` counts from); never more than the client was told.
    counted = value(s, "voiceagent_ttfa_seconds_sum", transport="websocket")
    assert sum(told) - 3 * OPENING_S <= counted <= sum(told) + 0.003, (told, counted)


def test_ttfa_histogram_does_not_count_a_queued_turns_wait(make_server) -> None:
    # What was seen: two speaks back to back, and the second one's TTFA in the metric was
    # the first one's whole playout (3.5 s): the documented p95 alert fired on a healthy
    # server. The metric counts from when a turn could be heard: its first text, or when
    # the turn before it finished, whichever is later. (`turn.done` still tells the client
    # the time from its text.)
    server = make_server()

    async def go() -> tuple[float, float, float]:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "speak", "text": "A first and longer sentence to say."})
            await c.send({"type": "speak", "text": "Two."})
            first, second = await c.turn(), await c.turn()
            t1, t2 = (t.event("turn.done")["timings"] for t in (first, second))
            return t1["ttfa_ms"] / 1000, t2["ttfa_ms"] / 1000, t1["audio_ms"] / 1000

    told1, told2, played1 = run(go())
    assert played1 > 1.0 and told2 > played1 * 0.8  # the second turn waited for the first
    s = scrape(server)
    assert value(s, "voiceagent_ttfa_seconds_count", transport="websocket") == 2
    counted2 = value(s, "voiceagent_ttfa_seconds_sum", transport="websocket") - told1
    assert counted2 < told2 - played1 * 0.5, (told1, told2, counted2)


def test_a_drop_in_request_refused_for_its_text_is_a_failed_turn_with_its_code(
    make_server,
) -> None:
    # What was seen: POST /v1/tts with too long a text answered 400 text_too_long, and was
    # counted as a turn the client cancelled; errors_total did not move.
    server = make_server()
    body = {"text": "x" * 20001, "voice": "agent"}
    r = httpx.post(f"{server.http}/v1/tts", json=body, timeout=30)
    assert (r.status_code, r.json()["code"]) == (400, "text_too_long")
    s = scrape(server)
    assert value(s, "voiceagent_turns_total", transport="tts", outcome="failed") == 1
    assert value(s, "voiceagent_turns_total", transport="tts", outcome="cancelled") == 0
    assert value(s, "voiceagent_errors_total", code="text_too_long") == 1

    async def on_a_socket() -> dict[str, Any]:  # counted once there too, not twice
        async with connect(server.url.replace("/v1/ws", "/tts/websocket")) as ws:
            output = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
            await ws.send(
                json.dumps(
                    {"model_id": "sonic-3", "voice": {"mode": "id", "id": "agent"},
                     "output_format": output, "context_id": "c", "transcript": "x" * 20001}
                )
            )  # fmt: skip
            return dict(json.loads(await ws.recv()))

    assert run(on_a_socket())["error_code"] == "text_too_long"
    s = scrape(server)
    assert value(s, "voiceagent_turns_total", transport="cartesia", outcome="failed") == 1
    assert value(s, "voiceagent_errors_total", code="text_too_long") == 2


# -- admission of turns ----------------------------------------------------------------


def test_a_turn_beyond_the_live_turn_limit_fails_at_once_with_server_busy(make_server) -> None:
    server = make_server(max_live_turns=1, playout=PlayoutConfig(lead_ms=200))

    async def go() -> None:
        async with connect(server.url) as a_ws, connect(server.url) as b_ws:
            a, b = Client(a_ws), Client(b_ws)
            await a.start()
            await b.start()
            await a.send({"type": "speak", "text": LONG_TEXT})
            while not isinstance(await a_ws.recv(), bytes):  # a's turn holds the one slot
                pass
            refused = await b.speak("Me too.")
            error = refused.event("error")
            assert error["code"] == "server_busy" and "turn_id" in error
            # the turn's events in the protocol's order (what was seen: the error came
            # first, and a client that tracks turns by turn.started kept one open)
            assert [e["type"] for e in refused.events] == ["turn.started", "error"]
            assert not refused.frames
            assert server.voice_server.admission.live_turns == 1  # a's turn plays on
            assert (await a.turn()).event("turn.done")
            await wait_until(lambda: server.voice_server.admission.live_turns == 0)
            assert (await b.speak("Me now.")).frames  # the slot is free again

    run(go())
    s = scrape(server)
    assert value(s, "voiceagent_errors_total", code="server_busy") == 1
    assert value(s, "voiceagent_admission_refused_total", reason="server_busy") == 1
    assert value(s, "voiceagent_turns_total", transport="websocket", outcome="failed") == 1


# -- logs --------------------------------------------------------------------------------


def test_json_logs_have_one_summary_line_per_turn_with_ids_and_never_the_text(
    server,
) -> None:
    secret = "Zanzibar marmalade"
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    try:

        async def go() -> str:
            async with connect(server.url) as ws:
                c = Client(ws)
                created = await c.start()
                await c.speak(f"{secret} is on the menu.")
                return str(created["session_id"])

        async def context() -> None:  # a Cartesia socket's
            async with connect(server.url.replace("/v1/ws", "/tts/websocket")) as ws:
                output = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
                request = {"model_id": "sonic-3", "transcript": f"{secret}.", "context_id": "c1"}
                voice = {"mode": "id", "id": "agent"}
                await ws.send(json.dumps({**request, "voice": voice, "output_format": output}))
                while json.loads(await ws.recv())["type"] != "done":
                    pass

        session_id = run(go())
        # a drop-in API's turn has its line too (it had none)
        body = {"model": "tts-1", "voice": "agent", "input": secret, "response_format": "pcm"}
        assert httpx.post(f"{server.http}/v1/audio/speech", json=body).status_code == 200
        run(context())
    finally:
        configure_logging("warning", "text")  # back to a quiet default for later tests
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    [openai] = [e for e in lines if e["event"] == "turn.end" and e["transport"] == "openai"]
    assert openai["outcome"] == "done" and openai["ttfa_ms"] > 0 and openai["audio_s"] > 0
    # a socket's lines name it, as a session's do (what was seen: no id at all; the
    # turn_id is the client's own context id)
    [cartesia] = [e for e in lines if e["event"] == "turn.end" and e["transport"] == "cartesia"]
    assert re.fullmatch(r"[0-9a-f]{16}", cartesia.get("session_id", "")), cartesia
    # (the log is the process's: a turn of an earlier test's server may end meanwhile)
    ends = [e for e in lines if e["event"] == "turn.end" and e.get("session_id") == session_id]
    assert len(ends) == 1
    end = ends[0]
    assert end["turn_id"].startswith("t")
    assert end["outcome"] == "done" and end["transport"] == "websocket"
    assert end["ttfa_ms"] > 0 and end["audio_s"] > 0 and end["rtf"] > 0
    assert end["level"] == "info" and "timestamp" in end
    assert secret not in out.getvalue()


# -- drain -----------------------------------------------------------------------------


def test_logs_without_a_stream_follow_stderr_when_it_is_swapped(monkeypatch) -> None:
    """`configure_logging()` writes to stderr as it is at each record: a stderr that was
    replaced and closed meanwhile (a test's capture; the suite's server threads once
    logged into one) is not written to; the new one is."""
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("info", "text")
    try:
        logging.getLogger("voiceagent.test").info("one")
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        errors: list[str] = []
        monkeypatch.setattr(logging.Handler, "handleError", lambda h, r: errors.append("!"))
        logging.getLogger("voiceagent.test").info("two")
    finally:
        configure_logging("warning", "text")
    assert "two" in second.getvalue() and errors == []


def test_drain_closes_an_idle_session_at_once_and_a_busy_one_at_the_deadline(
    make_server,
) -> None:
    server = make_server(playout=PlayoutConfig(lead_ms=200))

    async def go() -> None:
        async with connect(server.url) as idle_ws, connect(server.url) as busy_ws:
            idle, busy = Client(idle_ws), Client(busy_ws)
            await idle.start()
            await busy.start()
            await busy.send({"type": "speak", "text": LONG_TEXT * 4})
            while not isinstance(await busy_ws.recv(), bytes):
                pass
            t0 = time.monotonic()
            drained = asyncio.wrap_future(server.drain(deadline_s=1.0))
            with pytest.raises(websockets.ConnectionClosed) as idle_closed:
                await idle.event()
            assert idle_closed.value.rcvd.code == CloseCode.GOING_AWAY
            assert time.monotonic() - t0 < 0.9  # before the deadline: it had nothing live
            with pytest.raises(websockets.ConnectionClosed) as busy_closed:
                await busy.turn(until=("turn.done",))
            assert busy_closed.value.rcvd.code == CloseCode.GOING_AWAY
            assert busy_closed.value.rcvd.reason == "server draining"
            assert time.monotonic() - t0 >= 0.9  # the deadline cut it
            await asyncio.wait_for(drained, 5)
            async with connect(server.url) as late:
                await late.recv()  # the refusal
                with pytest.raises(websockets.ConnectionClosed) as refused:
                    await late.recv()
                assert refused.value.rcvd.code == CloseCode.TRY_AGAIN_LATER

    run(go())
    ready = httpx.get(f"{server.http}/readyz")
    assert ready.status_code == 503 and ready.json()["reasons"] == ["draining"]
    assert value(scrape(server), "voiceagent_draining") == 1


def test_sigterm_lets_the_live_turn_finish_refuses_newcomers_and_exits_0(
    tiny_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    serve = ["serve", "--model", str(tiny_dir), "--port", str(port), "--web", str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "voiceagent.cli", *serve],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    base = f"http://127.0.0.1:{port}"
    url = f"ws://127.0.0.1:{port}/v1/ws"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)

        async def go() -> None:
            async with connect(url) as ws:
                c = Client(ws)
                await c.start()
                await c.send({"type": "speak", "text": LONG_TEXT})
                while not isinstance(await ws.recv(), bytes):
                    pass
                proc.send_signal(signal.SIGTERM)
                async with httpx.AsyncClient() as http:
                    for _ in range(100):
                        ready = await http.get(f"{base}/readyz")
                        if ready.status_code == 503:
                            break
                        await asyncio.sleep(0.05)
                assert ready.json()["reasons"] == ["draining"]
                # what was seen: /health said 200 "ok", ready, to a balancer that checks it
                health = httpx.get(f"{base}/health")
                assert health.status_code == 503 and health.json()["status"] == "draining"
                metrics = httpx.get(f"{base}/metrics").text  # current at each scrape
                assert "\nvoiceagent_ready 0.0\n" in metrics
                async with connect(url) as newcomer:
                    refusal = json.loads(await newcomer.recv())
                    assert refusal["code"] == "server_draining"
                    with pytest.raises(websockets.ConnectionClosed) as refused:
                        await newcomer.recv()
                    assert refused.value.rcvd.code == CloseCode.TRY_AGAIN_LATER
                finished = await c.turn()  # every frame of the sentence, then turn.done
                done = finished.event("turn.done")
                assert (1 + len(finished.frames)) * 20 == done["sent_ms"]
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await c.event()
                assert closed.value.rcvd.code == CloseCode.GOING_AWAY

        run(go())
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "draining" in log.read_text()


def test_the_drain_logs_carry_no_sessions_ids_whatever_the_signal_interrupted() -> None:
    """What was seen: `SIGTERM: draining ...` and the drain's lines with the session_id
    of whichever session's task the signal happened to interrupt."""
    from types import SimpleNamespace

    import structlog

    from voiceagent.ops.logs import bind
    from voiceagent.server.app import DrainingServer

    seen: dict[str, Any] = {}

    async def drain(timeout_s: float) -> None:
        seen["ids"] = structlog.contextvars.get_contextvars()

    voice = SimpleNamespace(
        config=SimpleNamespace(drain_timeout_s=1.0), admission=SimpleNamespace(drain=drain)
    )

    async def go() -> None:
        server = DrainingServer(uvicorn.Config(app=None), voice)  # type: ignore[arg-type]

        async def a_session() -> None:
            bind(session_id="s1")
            server.handle_exit(signal.SIGTERM, None)

        await asyncio.get_running_loop().create_task(a_session())
        await asyncio.sleep(0.05)

    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    try:
        run(go())
    finally:
        configure_logging("warning", "text")
    assert seen["ids"] == {}  # the drain's own lines
    (line,) = [json.loads(x) for x in out.getvalue().splitlines() if "SIGTERM" in x]
    assert "session_id" not in line, line
