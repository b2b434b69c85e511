"""The browser demo page (web/) end to end: a real server on 127.0.0.1 serves the page,
headless Chromium (the system's `chromium`, driven by Playwright) loads it, connects over
WebRTC or the WebSocket fallback, speaks, and plays the audio; the test reads what the
page shows and its read-only debug handle `window.voiceagentDemo.state()`.

`outputLevel` in that handle comes from an AnalyserNode on the page's real output path
(WebSocket: the playback worklet's output; WebRTC: the remote stream), so "audio plays"
means decoded, non-silent audio reached the output, not just that frames arrived."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest
from web_browser import (
    AUDIBLE,
    HAS_ESPEAK,
    START_SAMPLER,
    STOP_SAMPLER,
    Demo,
    audible,
    chromium_path,
    late_frame_ms,
    open_demo,
    open_settings,
    speak,
    wait_turn,
)

pytestmark = pytest.mark.skipif(
    chromium_path() is None, reason="chromium is not installed (apt-get install chromium)"
)

SHORT = "Hello there, how are you today?"
LONG = "Let me read the whole list of terms and conditions to you, one by one. " * 4


# -- connecting and speaking -------------------------------------------------------------


def check_speaks(demo: Demo, transport: str) -> None:
    turn, samples = demo.speak_sampled(SHORT)
    loud = audible(samples)
    assert loud, f"no audio reached the output over {transport}"
    assert max(s["out"] for s in samples) > 2 * AUDIBLE
    # about as long as the turn's audio played (sent_ms), not a blip
    heard_ms = loud[-1]["t"] - loud[0]["t"]
    assert heard_ms > 0.6 * turn["sent_ms"], (heard_ms, turn["sent_ms"])
    # time to first audio, measured in the page: speak sent -> first audio played
    assert turn["ttfa_ms"] is not None and 0 < turn["ttfa_ms"] < 5000, turn
    assert not turn["ttfa_estimated"], "the page had no playback-clock anchor for the turn"
    readout = demo.page.text_content("#ttfa") or ""  # in the Details disclosure
    assert readout.startswith(f"{turn['ttfa_ms']} ms"), readout
    assert demo.state()["errors"] == []


def test_connects_over_webrtc_by_default_and_plays_a_turn(demo: Demo) -> None:
    s = demo.open()
    assert s["transport"] == "WebRTC" and s["fallback"] is None
    assert demo.page.inner_text("#transport") == "WebRTC"
    assert demo.page.inner_text("#connection") == "Connected"
    check_speaks(demo, "WebRTC")


def test_websocket_transport_plays_a_turn(demo: Demo) -> None:
    s = demo.open("ws")
    assert s["transport"] == "WebSocket"
    assert demo.page.inner_text("#transport") == "WebSocket"
    check_speaks(demo, "WebSocket")


def test_falls_back_to_websocket_when_webrtc_fails(demo: Demo) -> None:
    demo.page.route(
        "**/v1/webrtc/offer",
        lambda route: route.fulfill(
            status=503,
            content_type="application/json",
            body='{"type":"error","code":"internal_error","message":"no WebRTC today"}',
        ),
    )
    s = demo.open()
    assert s["transport"] == "WebSocket" and "no WebRTC today" in s["fallback"]
    # one indicator, and it tells the truth; a fallback that worked is not an error
    assert demo.page.inner_text("#transport") == "WebSocket (WebRTC blocked)"
    assert "no WebRTC today" in (demo.page.get_attribute("#link", "title") or "")
    assert s["errors"] == [] and demo.page.inner_text("#errors") == ""
    turn = demo.speak_sampled(SHORT)[0]
    assert turn["status"] == "done"


def test_random_weights_notice_is_shown_for_the_tiny_model(demo: Demo) -> None:
    s = demo.open("ws")
    assert s["model"]["random_weights"] is True
    notice = demo.page.locator("#model-notice")
    assert notice.is_visible()
    assert "noise" in notice.inner_text()  # the short form, over the avatar
    demo.page.click("#model-notice summary")
    text = notice.inner_text()
    assert "random weights" in text and "noise, not speech" in text and "--model" in text


def test_type_like_an_llm_streams_small_deltas_then_ends_the_turn(demo: Demo) -> None:
    demo.open("ws")
    open_settings(demo.page)
    demo.page.check("#stream-mode")
    turn = demo.speak_sampled(SHORT)[0]
    assert turn["status"] == "done" and turn["sent_ms"] > 0
    sent = [m for m in demo.state()["sent"] if m["type"] in ("speak", "text.delta", "text.end")]
    kinds = [m["type"] for m in sent]
    assert "speak" not in kinds
    assert kinds[-1] == "text.end" and kinds.count("text.end") == 1
    deltas = [m["t"] for m in sent if m["type"] == "text.delta"]
    assert len(deltas) >= len(SHORT) // 6, kinds  # small pieces, not the whole text
    gaps = sorted(b - a for a, b in itertools.pairwise(deltas))
    assert 30 < gaps[len(gaps) // 2] < 120, gaps  # one about every 50 ms
    assert turn["ttfa_ms"] is not None


def test_server_errors_are_shown_in_plain_words(demo: Demo) -> None:
    s = demo.open("ws")
    demo.page.fill("#text", "x" * (s["limits"]["max_message_bytes"] + 10))
    demo.page.click("#speak")
    demo.page.wait_for_function("() => window.voiceagentDemo.state().errors.length > 0")
    error = demo.state()["errors"][0]
    assert error["code"] == "message_too_large"
    shown = demo.page.inner_text("#errors")
    assert "That text is too long to send in one message" in shown
    assert f"server: {error['message']}" in shown  # the server's own words, under it
    # the session goes on
    assert demo.speak_sampled("Hi.")[0]["status"] == "done"


# -- the avatar ----------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["ws", "webrtc"])
def test_mouth_moves_while_audio_plays_and_rests_after(demo: Demo, transport: str) -> None:
    demo.open(transport)
    assert demo.state()["mouthOpen"] == 0
    samples = demo.speak_sampled(SHORT)[1]
    s = demo.state()
    assert s["levelEvents"] > 0, "the server sent no audio.levels events"
    if transport == "webrtc":
        assert s["syncEvents"] > 0, "the server sent no audio.sync events"
    mouth = [x["mouth"] for x in samples]
    assert max(mouth) > 0.2, f"the mouth hardly opened: max {max(mouth):.3f}"
    moving = [round(m, 2) for m in mouth if m > 0.05]
    assert len(set(moving)) > 5, "the mouth opened but did not move"
    # The mouth follows the audio as heard (levels released on the playback clock, not
    # when they arrive, which is up to ~200 ms before the audio plays).
    loud = audible(samples)
    open_ = [x for x in samples if x["mouth"] > 0.05]
    assert open_, "the mouth never opened"
    # (plus the frames a busy machine skipped just before: a change shows only then)
    slack = 150 + max(late_frame_ms(samples, x["t"]) for x in (open_[0], loud[0]))
    assert abs(open_[0]["t"] - loud[0]["t"]) < slack, (open_[0]["t"], loud[0]["t"], slack)
    slack = 200 + max(late_frame_ms(samples, x["t"]) for x in (open_[-1], loud[-1]))
    assert abs(open_[-1]["t"] - loud[-1]["t"]) < slack, (open_[-1]["t"], loud[-1]["t"], slack)
    # ...and rests, closed, a short while after the audio ended
    after = [x["mouth"] for x in samples if x["t"] > loud[-1]["t"] + 400]
    assert after and max(after) < 0.02, after[:10]
    assert s["mouthOpen"] < 0.02


@pytest.mark.parametrize("transport", ["ws", "webrtc"])
def test_cancel_silences_the_turn_and_closes_the_mouth(demo: Demo, transport: str) -> None:
    demo.open(transport)
    demo.page.evaluate(START_SAMPLER)
    index = speak(demo.page, LONG)
    demo.page.wait_for_function(
        "() => window.voiceagentDemo.state().mouthOpen > 0.1", timeout=15000
    )
    demo.page.wait_for_timeout(500)
    # when the click reaches the page (Playwright's click can take a while on a busy machine)
    demo.page.evaluate(
        "() => document.querySelector('#cancel').addEventListener("
        "'click', () => { window.__cancelAt = performance.now(); })"
    )
    demo.page.click("#cancel")
    wait_turn(demo.page, index, ("cancelled",))  # at once: the page marks it stopped
    demo.page.wait_for_function(  # the server's turn.cancelled confirms it
        "(i) => window.voiceagentDemo.state().turns[i].played_source", arg=index
    )
    turn = demo.state()["turns"][index]
    demo.page.wait_for_timeout(800)
    samples = demo.page.evaluate(STOP_SAMPLER)
    t_cancel = demo.page.evaluate("window.__cancelAt")
    assert turn["reason"] == "cancel"
    # The page reports where it stopped the turn (playback.reports), and the server's
    # turn.cancelled carries that; WebRTC mutes what the jitter buffer still holds.
    assert turn["played_source"] == "listener", turn
    # (some of it was heard: the mouth moved; how much depends on a busy machine's player,
    # and a starved server may have sent no more than the page had played)
    assert 0 < turn["played_ms"] <= turn["sent_ms"], turn
    # The page silences its output at the click: the WebSocket player drops its queue,
    # WebRTC mutes what the jitter buffer still holds (without that: ~90-100 ms of tail
    # here). 60 ms allows the analyser's 21 ms window and a late animation frame.
    last_loud = max((x["t"] for x in samples if x["out"] > AUDIBLE), default=0.0)
    assert last_loud - t_cancel < 60, f"audible {last_loud - t_cancel:.0f} ms after cancel"
    later = [x for x in samples if x["t"] > t_cancel + 150]
    assert later, "no samples after the cancel"
    assert max(x["out"] for x in later) < AUDIBLE, "audio kept playing after cancel"
    assert max(x["mouth"] for x in later) < 0.02, "the mouth kept moving after cancel"
    assert "Stopped by you after" in demo.page.inner_text("#turns")


# -- roles ---------------------------------------------------------------------------------


def test_switching_role_changes_the_voice_of_the_next_turn(demo: Demo) -> None:
    s = demo.open()
    assert s["voices"] == httpx.get(demo.server.http + "/v1/voices").json()["voices"]
    assert {"agent", "narrator", "supervisor"} <= set(s["voices"])
    options = demo.page.locator("#voice option").all_inner_texts()
    assert options == s["voices"]
    assert s["voice"] == "agent"
    for voice in ["narrator", "supervisor", "agent"]:
        demo.page.select_option("#voice", voice)
        demo.page.wait_for_function(
            "(v) => window.voiceagentDemo.state().events.includes('session.updated')"
            " && window.voiceagentDemo.state().voice === v",
            arg=voice,
        )
        turn = demo.speak_sampled("Hi.")[0]
        assert turn["voice"] == voice, turn  # turn.started.voice
        assert f"· {voice} ·" in demo.page.inner_text("#turns")
    assert [t["voice"] for t in demo.state()["turns"]] == ["narrator", "supervisor", "agent"]


# -- microphone and barge-in ---------------------------------------------------------------


@pytest.mark.skipif(not HAS_ESPEAK, reason="espeak-ng is not installed (apt-get install espeak-ng)")
@pytest.mark.parametrize("transport", ["webrtc", "ws"])
def test_speaking_into_the_mic_interrupts_the_bot(demo: Demo, transport: str) -> None:
    demo.open(transport)
    demo.page.click("#mic")  # the fake mic: ~3 s of silence, then speech (looped)
    demo.page.wait_for_function("() => window.voiceagentDemo.state().mic === true")
    assert demo.page.get_attribute("#mic", "aria-pressed") == "true"
    index = speak(demo.page, LONG)
    turn = wait_turn(demo.page, index, ("cancelled", "done"), timeout_ms=20000)
    assert turn["status"] == "cancelled" and turn["reason"] == "barge_in", turn
    assert 0 < turn["played_ms"] <= turn["sent_ms"], turn
    s = demo.state()
    assert "speech_started" in s["events"]
    assert s["events"].index("speech_started") < s["events"].index("turn.cancelled")
    assert any("barge-in" in line for line in s["barge"])
    assert "barge-in" in (demo.page.text_content("#barge") or "")  # in Details
    # said on screen and to screen readers
    assert "Interrupted when you spoke" in demo.page.inner_text("#turns")
    assert "You spoke: the avatar stopped." in demo.page.inner_text("#turns")
    assert {"kind": "alert", "text": "You interrupted the avatar."} in [
        {"kind": a["kind"], "text": a["text"]} for a in s["announcements"]
    ]
    demo.page.wait_for_function(
        "() => window.voiceagentDemo.state().mouthOpen < 0.02", timeout=2000
    )


@pytest.mark.skipif(not HAS_ESPEAK, reason="espeak-ng is not installed (apt-get install espeak-ng)")
def test_in_duck_mode_speaking_lowers_the_bot_and_the_turn_plays_on(demo: Demo) -> None:
    demo.open("webrtc")
    open_settings(demo.page)
    demo.page.select_option("#barge-mode", "duck")
    demo.page.click("#mic")
    demo.page.wait_for_function("() => window.voiceagentDemo.state().mic === true")
    index = speak(demo.page, LONG)
    demo.page.wait_for_function(
        "() => window.voiceagentDemo.state().events.includes('audio.ducked')", timeout=20000
    )
    s = demo.state()
    assert s["bargeMode"] == "duck"
    assert s["events"].index("speech_started") < s["events"].index("audio.ducked")
    assert "turn.cancelled" not in s["events"]
    assert "quieter" in (demo.page.text_content("#barge") or "")  # in Details
    assert any("lowers its voice" in a["text"] for a in s["announcements"])
    turn = s["turns"][index]
    assert turn["status"] in ("playing", "done"), turn  # not cancelled


# -- with authentication on ---------------------------------------------------------------


@pytest.mark.parametrize("transport", ["webrtc", "ws"])
def test_a_demo_link_with_a_token_connects_when_auth_is_on(
    browser: Any, make_server: Any, tmp_path: Path, transport: str
) -> None:
    from voiceagent.auth import tokens
    from voiceagent.auth.gate import AuthConfig

    secret = "demo-secret"
    server = make_server(auth=AuthConfig("on", tmp_path / "keys.toml", secret))
    assert httpx.get(server.http + "/v1/voices").status_code == 401
    context = browser.new_context()
    try:
        d = Demo(context.new_page(), server)
        token = tokens.mint(secret.encode(), "demo", 300)
        open_demo(d.page, server.http, transport, token=token)
        assert d.state()["transport"] == ("WebRTC" if transport == "webrtc" else "WebSocket")
        assert d.state()["fallback"] is None
        check_speaks(d, transport)
        assert not d.page_errors
    finally:
        context.close()
