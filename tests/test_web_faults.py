"""The demo page (web/) when the server turns something down or things overlap, in headless
Chromium against a real server: a refused reply is marked as not spoken (not left
"Sending…"), a refused voice does not stay selected, a new reply does not cut off the
one still streaming, streamed pieces keep characters whole, a WebRTC page heard muted
after a Stop is heard again on its next connection, roles and voices added meanwhile can
be picked, and a page without the token it needs says so instead of retrying for ever."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_roles import roles_file
from test_voice_store import a_voice
from web_browser import Demo, chromium_path, open_demo, open_settings, speak, wait_turn

from voiceagent.auth.gate import AuthConfig
from voiceagent.model import checkpoint
from voiceagent.model.voice_store import save_voice

pytestmark = pytest.mark.skipif(
    chromium_path() is None, reason="chromium is not installed (apt-get install chromium)"
)

LONG = "Let me read the whole list of terms and conditions to you, one by one. " * 4
RESTING = (
    "() => { const s = window.voiceagentDemo.state();"
    " return !s.playing && s.botState === 'listening'; }"
)


@contextlib.contextmanager
def page_on(browser: Any, server: Any) -> Iterator[Demo]:
    """A page in a fresh browser context on a server of the test's own; no page errors."""
    context = browser.new_context()
    try:
        d = Demo(context.new_page(), server)
        yield d
        assert not d.page_errors
    finally:
        context.close()


def sent(demo: Demo, turn_id: str) -> tuple[str, list[str]]:
    """The text the page sent for `turn_id` (speak or deltas) and the kinds it sent."""
    messages = [
        m
        for m in demo.state()["sent"]
        if m.get("turn_id") == turn_id and m["type"] in ("speak", "text.delta", "text.end")
    ]
    text = "".join(m.get("text", "") for m in messages if m["type"] != "text.end")
    return text, [m["type"] for m in messages]


# -- what the server turns down ------------------------------------------------------------


def test_a_reply_the_server_turns_down_is_marked_not_spoken(demo: Demo) -> None:
    # What was seen: a text over max_text_chars got text_too_long, and the reply stayed
    # "Sending…" for good, the bot "Thinking…", and Stop enabled.
    s = demo.open("ws")
    words = "word " * (s["limits"]["max_text_chars"] // 5 + 10)
    assert len(words.encode()) < s["limits"]["max_message_bytes"]  # text_too_long, not the size
    i = speak(demo.page, words)
    refused = wait_turn(demo.page, i, ("failed",), timeout_ms=10000)
    assert "longer than the server allows" in refused["error"], refused
    assert demo.state()["errors"][0]["code"] == "text_too_long"
    demo.page.wait_for_function(RESTING)
    assert demo.page.get_attribute("#cancel", "aria-disabled") == "true"
    # the next reply is its own: spoken, and the refused one stays refused
    j = speak(demo.page, "Hi.")
    assert wait_turn(demo.page, j, ("done",))["status"] == "done"
    assert demo.state()["turns"][i]["status"] == "failed"


def test_a_voice_the_server_turns_down_does_not_stay_selected(demo: Demo) -> None:
    s = demo.open("ws")
    before = s["voice"]
    # a list gone stale: the voice was deleted on the server after the page listed it
    demo.page.evaluate(
        "() => document.querySelector('#voice').add(new Option('deleted-voice', 'deleted-voice'))"
    )
    demo.page.select_option("#voice", "deleted-voice")
    demo.page.wait_for_function(
        "() => window.voiceagentDemo.state().errors.some((e) => e.code === 'unknown_voice')"
    )
    demo.page.wait_for_function(
        "(v) => document.querySelector('#voice').value === v", arg=before, timeout=5000
    )
    assert demo.state()["voice"] == before
    i = speak(demo.page, "Hi.")
    turn = wait_turn(demo.page, i, ("done",))
    assert turn["voice"] == before


# -- overlapping and streamed replies ------------------------------------------------------


def test_a_new_reply_while_one_streams_does_not_cut_the_first_short(demo: Demo) -> None:
    # What was seen: with "Send the text in small pieces" on, a second reply 300 ms after
    # a long first one dropped the rest of the first's pieces; its transcript still said
    # the whole text was spoken.
    demo.open("ws")
    open_settings(demo.page)
    demo.page.check("#stream-mode")
    first = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."
    i = speak(demo.page, first)
    demo.page.wait_for_timeout(300)
    j = speak(demo.page, "Second.")
    wait_turn(demo.page, j, ("done",))
    turns = demo.state()["turns"]
    text, kinds = sent(demo, turns[i]["turn_id"])
    assert text == first and kinds[-1] == "text.end" and kinds.count("text.end") == 1, kinds
    assert turns[i]["status"] == "done"
    order = [m.get("turn_id") for m in demo.state()["sent"] if m["type"].startswith("text.")]
    assert order.index(turns[j]["turn_id"]) > max(
        k for k, t in enumerate(order) if t == turns[i]["turn_id"]
    ), "the second reply's pieces came before the first had all been sent"


def test_streamed_pieces_keep_every_character_whole(demo: Demo) -> None:
    # What was seen: an emoji split between two pieces; each half was a lone surrogate the
    # server refused (invalid_parameter), and "Okay" was never spoken.
    demo.open("ws")
    open_settings(demo.page)
    demo.page.check("#stream-mode")
    text = "Okay😀 thanks, that is great 👍🏽 see you."
    i = speak(demo.page, text)
    turn = wait_turn(demo.page, i, ("done", "failed"))
    assert turn["status"] == "done" and demo.state()["errors"] == []
    assert sent(demo, turn["turn_id"])[0] == text


# -- connections ---------------------------------------------------------------------------


def test_a_webrtc_page_stopped_mid_reply_is_heard_on_its_next_connection(demo: Demo) -> None:
    # What was seen: Stop mutes the audio element until the next reply's audio; the page
    # then connected again (WebSocket and back) and every reply played muted for good.
    demo.open("webrtc")
    i = speak(demo.page, LONG)
    wait_turn(demo.page, i, ("playing",))
    demo.page.click("#cancel")
    wait_turn(demo.page, i, ("cancelled",))
    assert demo.page.evaluate("document.querySelector('#remote-audio').muted")
    open_settings(demo.page)
    for kind in ("ws", "webrtc"):
        demo.page.select_option("#transport-select", kind)
        demo.page.wait_for_function(
            "(k) => { const s = window.voiceagentDemo.state();"
            " return s.sessionStarted && s.transport === k; }",
            arg="WebRTC" if kind == "webrtc" else "WebSocket",
            timeout=20000,
        )
    j = speak(demo.page, "Your order shipped this morning.")
    wait_turn(demo.page, j, ("done",))
    assert not demo.page.evaluate("document.querySelector('#remote-audio').muted")


@pytest.mark.parametrize("transport", ["ws", "webrtc"])
def test_a_page_without_the_token_it_needs_says_so_and_stops_trying(
    browser: Any, make_server: Any, tmp_path: Path, transport: str
) -> None:
    # What was seen (WebSocket): "The server turned the connection down.", retried for ever.
    server = make_server(auth=AuthConfig("on", tmp_path / "keys.toml", "demo-secret"))
    with page_on(browser, server) as d:
        d.page.goto(f"{server.http}/?transport={transport}")
        d.page.wait_for_function(
            "() => window.voiceagentDemo && window.voiceagentDemo.state().connection === 'stopped'",
            timeout=20000,
        )
        state = d.state()
        assert "access token" in state["connectionMessage"], state["connectionMessage"]
        assert state["retryInMs"] is None


# -- roles ---------------------------------------------------------------------------------


def test_roles_can_be_picked_beside_the_voices(
    browser: Any, make_server: Any, tmp_path: Path, tiny_model: Any
) -> None:
    voice = next(iter(tiny_model.voices))
    server = make_server(roles_file=roles_file(tmp_path, voice))
    with page_on(browser, server) as d:
        open_demo(d.page, server.http, "ws")
        groups = d.page.evaluate(
            """() => [...document.querySelectorAll('#voice optgroup')].map((g) =>
                 [g.label, [...g.querySelectorAll('option')].map((o) => o.value)])"""
        )
        assert groups == [["Voices", list(tiny_model.voices)], ["Roles", ["calm", "support"]]]
        d.page.select_option("#voice", "support")
        d.page.wait_for_function(
            "() => window.voiceagentDemo.state().voice === 'support'"
            " && window.voiceagentDemo.state().events.includes('session.updated')"
        )
        i = speak(d.page, "Hi.")
        assert wait_turn(d.page, i, ("done",))["voice"] == "support"  # turn.started.voice


def test_a_voice_added_while_the_page_is_open_can_be_picked(
    browser: Any, make_server: Any, tmp_path: Path, tiny_dir: Path
) -> None:
    # What was seen: the list was filled once, from session.created; a voice made since
    # (POST /v1/voices, or a file an operator added) showed only after a reconnect.
    voices = tmp_path / "voices"
    server = make_server(checkpoint.load(tiny_dir), voices_dir=voices, voices_rescan_s=0.1)
    with page_on(browser, server) as d:
        open_demo(d.page, server.http, "ws")
        assert "carol" not in d.state()["voices"]
        save_voice(voices, a_voice("carol"), "carol speaking")
        time.sleep(0.5)  # the server's rescan
        d.page.focus("#voice")  # the picker is about to open
        d.page.wait_for_function("() => window.voiceagentDemo.state().voices.includes('carol')")
        d.page.select_option("#voice", "carol")
        d.page.wait_for_function("() => window.voiceagentDemo.state().voice === 'carol'")
        i = speak(d.page, "Hi.")
        assert wait_turn(d.page, i, ("done",))["voice"] == "carol"
