"""Shared fixtures: a random-weight tiny checkpoint on disk, and real servers on loopback.

Servers run in their own thread and event loop (uvloop), like a separate process would;
tests talk to them with the real clients in voiceagent/bench/clients.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from voiceagent.model import checkpoint
from voiceagent.model.speech_model import SpeechModel
from voiceagent.model.tiny import checkpoint as tiny
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny")
    tiny.save(tiny.build_random(seed=0), directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> SpeechModel:
    return checkpoint.load(tiny_dir)


@pytest.fixture
def make_server(tiny_model: SpeechModel) -> Iterator[Callable[..., BackgroundServer]]:
    started: list[BackgroundServer] = []

    def make(model: SpeechModel | None = None, **overrides: Any) -> BackgroundServer:
        """A server on the shared tiny model, or on `model` (for a test that changes it)."""
        config = ServerConfig(port=free_port(), **overrides)
        server = BackgroundServer(model or tiny_model, config).start()
        started.append(server)
        return server

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def server(make_server: Callable[..., BackgroundServer]) -> BackgroundServer:
    return make_server()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """With VOICEAGENT_NO_SKIPS=1 (CI sets it) a skip is a failure: a real part that is
    missing (chromium, espeak-ng, the SGLang venv) must not pass silently there."""
    outcome = yield
    report = outcome.get_result()
    if (
        os.environ.get("VOICEAGENT_NO_SKIPS") == "1"
        and report.skipped
        and not hasattr(report, "wasxfail")
    ):
        report.outcome = "failed"
        report.longrepr = f"skipped, but this run needs every test: {report.longrepr}"


@pytest.fixture(scope="session")
def spoken() -> Any:
    """Real speech for a microphone: espeak-ng at 48 kHz (float32 mono)."""
    from voiceagent.bench.clips import espeak_pcm, have_espeak

    if not have_espeak():
        pytest.skip("espeak-ng is not installed: no real speech to send")
    return espeak_pcm("Hello, I would like to change my delivery address please", 48000)[0]
