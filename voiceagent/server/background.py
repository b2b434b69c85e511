"""A server on its own thread and event loop, for benchmarks and tests in one process."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time
from typing import Any

import uvicorn

from ..engine.acoustic import AcousticBatching
from ..engine.embedded import EmbeddedEngine, LMBackend
from ..model.checkpoint import SpeechModel
from .app import ServerConfig, VoiceServer, uvicorn_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    def __init__(
        self,
        model: SpeechModel,
        config: ServerConfig,
        lm: LMBackend | None = None,
        acoustic_batching: AcousticBatching = "invariant",
        **engine: Any,
    ) -> None:
        """`engine`: more `EmbeddedEngine` options."""
        self.engine = EmbeddedEngine(model, lm=lm, acoustic_batching=acoustic_batching, **engine)
        self.voice_server = VoiceServer(self.engine, config)
        self._uvicorn = uvicorn.Server(uvicorn_config(self.voice_server, log_level="warning"))
        self._thread = threading.Thread(target=self._uvicorn.run, daemon=True)
        self.url = f"ws://{config.host}:{config.port}/v1/ws"
        self.http = f"http://{config.host}:{config.port}"

    def start(self, timeout: float = 20.0) -> BackgroundServer:
        self.engine.start()
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def drain(self, deadline_s: float) -> concurrent.futures.Future[None]:
        """Start draining as SIGTERM would (the server keeps running when it is done)."""
        assert self.voice_server.loop is not None, "start() first"
        return asyncio.run_coroutine_threadsafe(
            self.voice_server.admission.drain(deadline_s), self.voice_server.loop
        )

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)
        self.engine.stop()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
