"""The demo page heals its connection by itself, in headless Chromium: a real `voiceagent
serve` process is killed (SIGKILL) or stopped (SIGTERM, which drains) in the middle of a
turn and started again on the same port, and the page, without a click, says what happened
in plain words, ends the cut-off turn, reconnects with backoff, clears its old errors and
speaks again. Also: a full server ("try again later") and WebRTC whose ICE is blocked (a
hint after 3 s, then the WebSocket)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from web_browser import Demo, audible, chromium_path, open_demo, speak, state, wait_turn

from voiceagent.server.background import free_port

pytestmark = pytest.mark.skipif(
    chromium_path() is None, reason="chromium is not installed (apt-get install chromium)"
)

ROOT = Path(__file__).resolve().parents[1]
SHORT = "Hello there, how are you today?"
MEDIUM = "Your order shipped this morning, and it should arrive on Thursday."
LONG = "Let me read the whole list of terms and conditions to you, one by one. " * 4
# The page retries after 0.5 s, 1 s, 2 s, then every 2 s (the default cap is 4 s).
QUERY = {"retry_max_ms": 2000}
STILL = ["#avatar", "#caption", "#text", "#speak", "#cancel", "#mic", "#voice"]
RECTS = """(sels) => Object.fromEntries(sels.map((sel) => {
  const r = document.querySelector(sel).getBoundingClientRect();
  return [sel, [r.left, r.top, r.width, r.height]];
}))"""
# What the connection indicator says, on every animation frame.
WATCH = """() => {
  window.__seen = [];
  const loop = () => {
    const s = window.voiceagentDemo.sample();
    const last = window.__seen[window.__seen.length - 1];
    if (!last || last.text !== s.connectionText || last.bot !== s.botText) {
      window.__seen.push({t: performance.now(), text: s.connectionText, bot: s.botText});
    }
    window.__watch = requestAnimationFrame(loop);
  };
  window.__watch = requestAnimationFrame(loop);
}"""
UNWATCH = "() => { cancelAnimationFrame(window.__watch); return window.__seen; }"


class ServeProcess:
    """`voiceagent serve` with the tiny model as a real process on a fixed port."""

    def __init__(self, model_dir: Path, port: int, log: Path) -> None:
        self.model_dir = model_dir
        self.port = port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> None:
        serve = ["serve", "--model", str(self.model_dir), "--port", str(self.port)]
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "voiceagent.cli", *serve],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.http}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def message(page: Any) -> str:
    return str(state(page)["connectionMessage"] or "")


def runs(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


# What the page says when the connection goes: (transport, signal) -> its first words.
LOST_WORDS = {
    ("ws", "SIGKILL"): "The connection to the server was lost.",
    ("webrtc", "SIGKILL"): "The audio from the server stopped: the connection was lost.",
    ("ws", "SIGTERM"): "The server is shutting down (usually for a restart).",
    ("webrtc", "SIGTERM"): "The server is shutting down (usually for a restart).",
}


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("transport", ["ws", "webrtc"])
def test_the_page_recovers_by_itself_when_the_server_restarts(
    browser: Any, tiny_dir: Path, tmp_path: Path, transport: str, how: str
) -> None:
    server = ServeProcess(tiny_dir, free_port(), tmp_path / "serve.log")
    server.start()
    context = browser.new_context()
    try:
        page = context.new_page()
        d = Demo(page, server)
        d.open(transport, **QUERY)
        name = "WebSocket" if transport == "ws" else "WebRTC"
        # an error on screen from before the restart: it must not outlive the connection
        page.fill("#text", " ")
        page.click("#speak")
        assert d.state()["errors"] and page.inner_text("#errors")
        still = page.evaluate(RECTS, STILL)
        page.evaluate(WATCH)

        # SIGKILL cuts a long turn off; SIGTERM drains: the server lets the turn finish
        index = speak(page, LONG if how == "SIGKILL" else MEDIUM)
        focused = page.evaluate("document.activeElement.id")
        assert focused == "speak"
        page.wait_for_function(
            "() => { const p = window.voiceagentDemo.sample().playing;"
            " return p && p.offsetMs > 600; }",
            timeout=15000,
        )
        server.signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)

        # The page notices by itself (over WebRTC too, where nothing closes: the audio
        # stops, and the words below say it was the silence, not ICE's later failure),
        # stops the turn, and says so in plain words. (A generous wait: a starved browser
        # runs its timers late.)
        page.wait_for_function(
            "() => window.voiceagentDemo.state().connection !== 'connected'", timeout=30000
        )
        s = d.state()
        assert s["playing"] is None and s["botState"] == "connecting"
        assert message(page).startswith(LOST_WORDS[(transport, how)]), message(page)
        assert "Reconnecting" in message(page)
        assert page.locator("#conn-message").is_visible()
        assert page.inner_text("#bot-state").strip() == "Reconnecting…"
        turn = s["turns"][index]
        row = page.inner_text(f"#turns li[data-turn-id='{turn['turn_id']}'] .meta")
        if how == "SIGKILL":
            assert turn["status"] == "ended" and turn["played_ms"] > 500, turn
            assert row.startswith("Cut off after") and "connection was lost" in row, row
        else:
            assert turn["status"] == "done", turn  # drained: the whole sentence was sent
        assert any("Reconnecting" in a["text"] for a in s["announcements"])  # said aloud
        page.wait_for_function("() => window.voiceagentDemo.sample().mouthOpen < 0.02")

        # Nothing listens for a while: the page keeps trying, and says so.
        assert server.wait(30) in (0, -signal.SIGKILL)
        page.wait_for_function(
            "() => (window.voiceagentDemo.state().connectionMessage || '')"
            ".startsWith('Cannot reach the server. Reconnecting')",
            timeout=15000,
        )
        assert page.evaluate(RECTS, STILL) == still  # messages float: nothing moved

        # The server is back on the same port: the page reconnects without a click.
        server.start()
        page.wait_for_function(
            "() => { const s = window.voiceagentDemo.state();"
            " return s.connection === 'connected' && s.sessionStarted; }",
            timeout=30000,
        )
        # The watcher samples on animation frames, which a busy browser runs late: let it
        # draw the frame that shows the new state before it stops.
        page.wait_for_function("() => window.__seen.at(-1).text === 'Connected'")
        seen = page.evaluate(UNWATCH)
        s = d.state()
        assert s["reconnects"] == 1 and s["transport"] == name and s["fallback"] is None
        assert s["errors"] == [] and page.inner_text("#errors") == ""  # old errors cleared
        assert s["connectionMessage"] is None and page.locator("#conn-message").is_hidden()
        assert page.inner_text("#connection") == "Connected"
        assert s["turns"][index]["status"] == ("ended" if how == "SIGKILL" else "done")
        assert "Reconnected." in page.inner_text("#turns")
        assert page.evaluate("document.activeElement.id") == focused  # never lost
        assert page.evaluate(RECTS, STILL) == still
        # the indicator went one way: connected, offline and retrying, connected again
        texts = runs([x["text"] for x in seen])
        assert texts[0] == "Connected" and texts[-1] == "Connected", texts
        assert set(texts[1:-1]) <= {"Offline", "Reconnecting…"}, texts
        assert "Offline" in texts

        # and the session works: a new turn plays
        page.wait_for_function(
            "() => window.voiceagentDemo.state().botState === 'listening'", timeout=5000
        )
        turn, samples = d.speak_sampled(SHORT)
        assert turn["status"] == "done" and audible(samples), turn
        assert not d.page_errors, d.page_errors
    finally:
        context.close()
        server.stop()


@pytest.mark.parametrize("transport", ["ws", "webrtc"])
def test_a_full_server_is_said_plainly_and_the_page_gets_in_when_a_place_frees(
    browser: Any, make_server: Any, transport: str
) -> None:
    server = make_server(max_sessions=1)
    first = browser.new_context()
    second = browser.new_context()
    try:
        # the place is taken over a WebSocket, which frees it the moment its page closes
        Demo(first.new_page(), server).open("ws")
        page = second.new_page()
        d = Demo(page, server)
        page.goto(f"{server.http}/?transport={transport}&retry_max_ms=1000")
        page.wait_for_function(
            "() => (window.voiceagentDemo.state().connectionMessage || '')"
            ".startsWith('The server is full right now. Reconnecting')",
            timeout=15000,
        )
        s = d.state()
        assert s["errors"] == [] and s["fallback"] is None  # not an error, not a fallback
        assert s["connection"] in ("connecting", "reconnecting")
        first.close()  # a place frees
        page.wait_for_function("() => window.voiceagentDemo.state().sessionStarted", timeout=20000)
        s = d.state()
        assert s["transport"] == ("WebSocket" if transport == "ws" else "WebRTC")
        assert s["connectionMessage"] is None and s["errors"] == []
        assert not d.page_errors, d.page_errors
    finally:
        second.close()


def unreachable(sdp: str) -> str:
    """The SDP with every ICE candidate's address moved to TEST-NET-1 (192.0.2.0/24, never
    routed): what a firewall that drops the media path looks like to both ends."""
    return re.sub(
        r"^(a=candidate:\S+ \d+ \S+ \d+ )(\S+)",
        r"\g<1>192.0.2.1",
        sdp,
        flags=re.MULTILINE,
    )


def test_blocked_webrtc_shows_a_hint_then_the_page_uses_the_websocket(demo: Demo) -> None:
    def block(route: Any) -> None:
        offer = json.loads(route.request.post_data or "{}")
        offer["sdp"] = unreachable(offer["sdp"])
        response = route.fetch(post_data=json.dumps(offer))
        answer = response.json()
        answer["sdp"] = unreachable(answer["sdp"])
        route.fulfill(response=response, json=answer)

    demo.page.route("**/v1/webrtc/offer", block)
    demo.page.goto(demo.server.http + "/")
    demo.page.wait_for_function(
        "() => (window.voiceagentDemo.state().connectionMessage || '')"
        ".startsWith('Still connecting… a firewall may be blocking the audio path;"
        " the page will switch to WebSocket')",
        timeout=10000,
    )
    s = demo.state()
    assert s["connection"] == "connecting" and s["transport"] == "WebRTC", s["connection"]
    assert demo.page.evaluate("performance.now()") > 2500  # after ~3 s of connecting
    assert demo.page.locator("#conn-message").is_visible()
    assert any(a["text"].startswith("Still connecting") for a in s["announcements"])
    # then the WebSocket, and the page says which transport it really uses
    demo.page.wait_for_function("() => window.voiceagentDemo.state().sessionStarted", timeout=30000)
    s = demo.state()
    assert s["transport"] == "WebSocket" and "did not open" in s["fallback"], s["fallback"]
    assert demo.page.inner_text("#transport") == "WebSocket (WebRTC blocked)"
    assert s["errors"] == [] and s["connectionMessage"] is None
    turn = wait_turn(demo.page, speak(demo.page, SHORT), ("done",))
    assert turn["ttfa_ms"] is not None


def test_a_killed_server_while_the_page_is_idle_is_noticed_over_webrtc(
    browser: Any, tiny_dir: Path, tmp_path: Path
) -> None:
    """Over WebRTC nothing closes when the server dies: the page notices the audio track
    went quiet (the server sends silence while idle) within ~2 s, not ICE's 5-6 s."""
    server = ServeProcess(tiny_dir, free_port(), tmp_path / "serve.log")
    server.start()
    context = browser.new_context()
    try:
        page = context.new_page()
        open_demo(page, server.http, "webrtc", **QUERY)
        # the idle track's silence has reached the page (on a starved machine the first
        # packets come late; a server killed before them is noticed by ICE alone)
        page.wait_for_function("() => window.voiceagentDemo.state().rtpPackets > 0", timeout=15000)
        server.signal(signal.SIGKILL)
        # (a generous wait: a starved browser polls its stats late) ...
        page.wait_for_function(
            "() => window.voiceagentDemo.state().connection !== 'connected'", timeout=15000
        )
        # ...but the page noticed the track's silence ("stall", 2 s without a packet), not
        # ICE: ICE's failure (5-6 s) would read "The connection to the server was lost."
        assert message(page).startswith("The audio from the server stopped"), state(page)["log"]
        server.wait(10)
        server.start()
        page.wait_for_function(
            "() => window.voiceagentDemo.state().connection === 'connected'", timeout=30000
        )
        assert state(page)["transport"] == "WebRTC"
    finally:
        context.close()
        server.stop()
