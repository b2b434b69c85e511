"""Shared fixtures: a random-weight tiny checkpoint on disk, and real servers on loopback.

Servers run in their own thread and event loop (uvloop), like a separate process would;
tests talk to them with the real `websockets` client.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets

from voiceagent.model import checkpoint
from voiceagent.model.checkpoint import SpeechModel
from voiceagent.protocol import frames
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny")
    checkpoint.save(checkpoint.build_random(seed=0), directory)
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


@dataclass
class TurnResult:
    events: list[dict[str, Any]] = field(default_factory=list)
    frames: list[frames.AudioFrame] = field(default_factory=list)
    levels: list[dict[str, Any]] = field(default_factory=list)  # audio.levels events

    def event(self, kind: str) -> dict[str, Any]:
        matches = [e for e in self.events if e["type"] == kind]
        assert matches, f"no {kind} event in {[e['type'] for e in self.events]}"
        return matches[0]


class Client:
    """A thin test client over a real websockets connection."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(json.dumps(message) if isinstance(message, dict) else message)

    async def event(self, timeout: float = 10.0) -> dict[str, Any]:
        """Next JSON event other than audio.levels (fails on a binary frame)."""
        while True:
            msg = await asyncio.wait_for(self.ws.recv(), timeout)
            assert isinstance(msg, str), "expected a JSON event, got a binary frame"
            event = dict(json.loads(msg))
            if event["type"] != "audio.levels":
                return event

    async def start(self, **settings: Any) -> dict[str, Any]:
        await self.send({"type": "session.start", **settings})
        event = await self.event()
        assert event["type"] == "session.created", event
        return event

    async def turn(
        self, until: tuple[str, ...] = ("turn.done",), timeout: float = 60
    ) -> TurnResult:
        """Collect events and frames until an event of a type in `until` (or an error
        for a turn) arrives."""
        result = TurnResult()
        deadline = time.monotonic() + timeout
        while True:
            msg = await asyncio.wait_for(self.ws.recv(), max(0.1, deadline - time.monotonic()))
            if isinstance(msg, bytes):
                result.frames.append(frames.unpack(msg))
                continue
            event = json.loads(msg)
            if event["type"] == "audio.levels":  # lip-sync data: kept apart from events
                result.levels.append(event)
                continue
            result.events.append(event)
            if event["type"] in until or (event["type"] == "error" and "turn_id" in event):
                return result

    async def speak(self, text: str, **extra: Any) -> TurnResult:
        await self.send({"type": "speak", "text": text, **extra})
        return await self.turn()


def connect(url: str) -> Any:
    return websockets.connect(url, max_size=None)


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
