"""Shared fixtures: a random-weight tiny checkpoint on disk, and real servers on loopback.

Servers run in their own thread and event loop (uvloop), like a separate process would;
tests talk to them with the real clients in voiceagent/bench/clients.py.
"""

from __future__ import annotations

import os

# One torch thread per test process, set before torch loads: the suite runs two worker
# processes on two cores, and each server's LM and acoustic threads would otherwise start
# two OpenMP threads apiece; oversubscribed, their spin-waits made small ops 3-20x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from onnx_fakes import write_fake_campplus, write_fake_speech_tokenizer
from web_browser import HAS_ESPEAK, Demo, launch, render_mic_wav

from voiceagent.bench import phone_speech
from voiceagent.model import checkpoint
from voiceagent.model.cosyvoice2.random_checkpoint import write_random_cosyvoice2
from voiceagent.model.speech_model import SpeechModel
from voiceagent.model.tiny import checkpoint as tiny
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port


@pytest.fixture(scope="session")
def train_device() -> Any:
    """Where the training tests train besides the CPU: VOICEAGENT_TRAIN_DEVICE (default
    auto: the first CUDA device where torch sees one). On a CPU-only machine that is the
    CPU again, so there these tests check the plumbing only; `deploy/gpu-bench.sh` runs
    them on a CUDA machine."""
    from voiceagent.train.update import train_device

    return train_device(os.environ.get("VOICEAGENT_TRAIN_DEVICE", "auto"))


@pytest.fixture
def learning_rates(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], list[float]]:
    """`watch(module)`: from now on, the learning rate of each optimizer update that a
    training module (`voiceagent.train.*_train`) makes, in order."""

    def watch(module: Any) -> list[float]:
        rates: list[float] = []
        real = module.update

        def recorded(opt: Any, *args: Any) -> Any:
            rates.append(opt.param_groups[0]["lr"])
            return real(opt, *args)

        monkeypatch.setattr(module, "update", recorded)
        return rates

    return watch


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


# -- the demo page in headless Chromium (tests/test_web_*.py) ------------------------------


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The fake microphone: espeak-ng speech after 3 s of silence (None without espeak-ng)."""
    if not HAS_ESPEAK:
        return None
    return render_mic_wav(tmp_path_factory.mktemp("mic") / "mic.wav")


@pytest.fixture(scope="module")
def browser(mic_wav: Path | None) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p, mic_wav)
        yield b
        b.close()


@pytest.fixture
def demo(browser: Any, server: BackgroundServer) -> Iterator[Demo]:
    """The page in a fresh browser context on the `server`; no uncaught page errors."""
    context = browser.new_context()
    d = Demo(context.new_page(), server)
    yield d
    context.close()
    assert not d.page_errors, f"uncaught errors in the page: {d.page_errors}"


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


@pytest.fixture(scope="module")
def piper() -> Any:
    """The real Piper teacher (.venv-piper: bash deploy/setup-piper.sh)."""
    from voiceagent.train import teacher

    try:
        return teacher.find_piper()
    except teacher.TeacherMissing as exc:
        pytest.skip(f"the teacher is not installed: {exc}")


# -- voices from real speech (test_voice_registry.py, test_compat_voices.py) ------------


@pytest.fixture(scope="module")
def phone() -> phone_speech.Prompt:
    """A real spoken sentence of 3-5 s with its transcript."""
    if not phone_speech.available():
        pytest.skip("asterisk-core-sounds-en-wav is not installed: no real speech")
    for p in phone_speech.prompts():
        if p.is_speech and 3.0 <= p.seconds <= 5.0 and p.text and len(p.text.split()) >= 5:
            return p
    pytest.skip("no transcribed Asterisk prompt of 3-5 s (asterisk-core-sounds-en missing?)")


@pytest.fixture(scope="module")
def clone_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random CosyVoice2 directory with FAKE prompt frontend files (tests/onnx_fakes.py:
    the released campplus.onnx and speech_tokenizer_v2.onnx cannot be downloaded here)."""
    d = write_random_cosyvoice2(tmp_path_factory.mktemp("cv2") / "CosyVoice2-small")
    write_fake_campplus(d / "campplus.onnx")
    write_fake_speech_tokenizer(d / "speech_tokenizer_v2.onnx")
    return d
