"""Headless Chromium for the demo page (web/): launch flags, a fake microphone made of real
espeak-ng speech, small helpers to read the page's debug handle
(`window.voiceagentDemo.state()`), and `Demo`, one page under test (the fixtures `browser`,
`demo` and `mic_wav` are in conftest.py). Used by tests/test_web_*.py and
tests/web_screenshot.py. No browser is downloaded: the system's `chromium` is used."""

from __future__ import annotations

import shutil
import wave
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from voiceagent.bench.clips import espeak_pcm

# Flags for a quiet, hermetic headless Chromium that plays audio without a user gesture
# and answers getUserMedia with a fake device reading a WAV file (looped).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]

MIC_SENTENCE = "Wait, stop, I have a question about my order."
AUDIBLE = 0.005  # analyser RMS; digital silence reads 0, the tiny model's noise ~0.05
HAS_ESPEAK = shutil.which("espeak-ng") is not None


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def render_mic_wav(path: Path, text: str = MIC_SENTENCE, lead_silence_s: float = 3.0) -> Path:
    """Real speech from espeak-ng after `lead_silence_s` of silence, as a WAV for
    Chromium's fake capture device (which loops it): the bot gets to speak first."""
    speech, rate = espeak_pcm(text)
    pcm = np.round(speech * 32768).astype("<i2")  # exactly espeak-ng's samples
    silence = np.zeros(int(rate * lead_silence_s), "<i2")
    tail = np.zeros(int(rate * 1.0), "<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.concatenate([silence, pcm, tail]).tobytes())
    return path


def launch_args(mic_wav: Path | None) -> list[str]:
    args = list(CHROMIUM_ARGS)
    if mic_wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={mic_wav}")
    return args


def launch(playwright: Any, mic_wav: Path | None = None) -> Any:
    exe = chromium_path()
    if exe is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    return playwright.chromium.launch(
        executable_path=exe,
        headless=True,
        # Playwright adds --mute-audio: nothing reaches the speakers, but the page still
        # renders its audio, and its analysers read it.
        args=launch_args(mic_wav),
    )


def state(page: Any) -> dict[str, Any]:
    return dict(page.evaluate("window.voiceagentDemo.state()"))


def open_demo(
    page: Any,
    base_url: str,
    transport: str | None = None,
    timeout_ms: int = 20000,
    token: str | None = None,
    **params: str | int,
) -> None:
    """Load the page (with a session `token` in its URL, as a demo link has it, and any
    other query `params`) and wait until its session has started."""
    query = {"transport": transport, "token": token, **params}
    pairs = "&".join(f"{k}={v}" for k, v in query.items() if v)
    url = base_url + "/" + (f"?{pairs}" if pairs else "")
    page.goto(url)
    page.wait_for_function(
        "() => window.voiceagentDemo && window.voiceagentDemo.state().sessionStarted",
        timeout=timeout_ms,
    )


# Samples the debug handle on every animation frame (about 60 per second) into
# window.__samples: time, mouth opening, output level and what plays. It reads the light
# `sample()` (state() is too heavy to take 60 times a second on a busy machine).
START_SAMPLER = """() => {
  window.__samples = [];
  const loop = (now) => {
    const s = window.voiceagentDemo.sample();
    window.__samples.push({t: now, mouth: s.mouthOpen, out: s.outputLevel,
                           turn: s.playing ? s.playing.turn : null});
    window.__sampler = requestAnimationFrame(loop);
  };
  window.__sampler = requestAnimationFrame(loop);
}"""

STOP_SAMPLER = """() => { cancelAnimationFrame(window.__sampler); return window.__samples; }"""


def open_settings(page: Any) -> None:
    """Open the page's Settings disclosure (voice pieces, barge-in mode, devices...)."""
    if not page.evaluate("document.querySelector('#settings').open"):
        page.click("#settings summary")


def speak(page: Any, text: str) -> int:
    """Type `text` and press Speak; return the new turn's index in `state().turns`."""
    index = len(state(page)["turns"])
    page.fill("#text", text)
    page.click("#speak")
    return index


def wait_turn(
    page: Any, index: int, status: tuple[str, ...], timeout_ms: int = 30000
) -> dict[str, Any]:
    """Wait until turn number `index` (0-based, in the order the page sent them) has one
    of `status` (e.g. done, cancelled); return it."""
    page.wait_for_function(
        "([i, want]) => { const t = window.voiceagentDemo.state().turns[i];"
        " return t && want.includes(t.status); }",
        arg=[index, list(status)],
        timeout=timeout_ms,
    )
    return dict(state(page)["turns"][index])


def audible(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in samples if s["out"] > AUDIBLE]


def late_frame_ms(samples: list[dict[str, Any]], t: float) -> float:
    """How long before the sample at `t` the page's previous animation frame ran: a busy
    machine skips frames, and what changed in between shows only at `t`."""
    before = [x["t"] for x in samples if x["t"] < t]
    return t - before[-1] if before else 0.0


class HasHttp(Protocol):
    @property
    def http(self) -> str: ...


class Demo:
    """One page in a fresh browser context, with the page's uncaught errors collected."""

    def __init__(self, page: Any, server: HasHttp) -> None:
        self.page = page
        self.server = server
        self.page_errors: list[str] = []
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))

    def open(self, transport: str | None = None, **params: str | int) -> dict[str, Any]:
        open_demo(self.page, self.server.http, transport, **params)
        return state(self.page)

    def state(self) -> dict[str, Any]:
        return state(self.page)

    def speak_sampled(
        self, text: str, until: tuple[str, ...] = ("done",)
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Speak `text`, sample the page on every animation frame until the turn ends, its
        audio has played out and 1 s more has passed; return (turn, samples). (The turn
        ends when its last audio arrives; a busy page may still be playing it.)"""
        self.page.evaluate(START_SAMPLER)
        index = speak(self.page, text)
        turn = wait_turn(self.page, index, until)
        self.page.wait_for_function("() => !window.voiceagentDemo.sample().playing")
        self.page.wait_for_timeout(1000)
        samples = self.page.evaluate(STOP_SAMPLER)
        return turn, samples
