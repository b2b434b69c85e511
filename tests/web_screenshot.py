"""Screenshots of the demo page mid-speech: web/screenshot.png (a laptop, 1280x800) and
web/screenshot-phone.png (a phone, 375x667).

    .venv/bin/python tests/web_screenshot.py [--transport webrtc|ws] [--out PATH] [--phone PATH]

Starts a server with the model `serve` uses by default (voiceagent's own voice where this
copy ships one, else the tiny model) on a free port (voiceagent.server.background), opens
the page in headless Chromium, speaks a sentence and takes each screenshot while the mouth
is open and the captions mark a word a second into it. Not a test; no pytest needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright
from web_browser import launch, open_demo, speak, state, wait_turn

from voiceagent.model import checkpoint
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Hello! Your order shipped this morning, and it should arrive on Thursday."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["webrtc", "ws"], default="webrtc")
    parser.add_argument("--out", type=Path, default=ROOT / "web" / "screenshot.png")
    parser.add_argument("--phone", type=Path, default=ROOT / "web" / "screenshot-phone.png")
    args = parser.parse_args()

    model = checkpoint.load(checkpoint.default_model_dir())
    with (
        BackgroundServer(model, ServerConfig(port=free_port())) as server,
        sync_playwright() as p,
    ):
        browser = launch(p)
        for out, phone in ((args.out, False), (args.phone, True)):
            context = browser.new_context(
                viewport={"width": 375, "height": 667} if phone else {"width": 1280, "height": 800},
                device_scale_factor=2 if phone else 1,
                is_mobile=phone,
                has_touch=phone,
            )
            page = context.new_page()
            open_demo(page, server.http, args.transport)
            # a first turn so the transcript has something to show
            wait_turn(page, speak(page, "Hi there."), ("done",))
            page.wait_for_function("() => window.voiceagentDemo.state().botState === 'listening'")
            speak(page, TEXT)
            # mid-speech: the mouth well open, a second into the turn, a word marked
            page.wait_for_function(
                "() => { const s = window.voiceagentDemo.state();"
                " return s.lastTurn?.turn_id === 'r2' && s.playing && s.playing.offsetMs > 1000"
                " && s.mouthOpen > 0.35 && s.caption.marked >= 2; }",
                timeout=20000,
            )
            page.screenshot(path=str(out))
            s = state(page)
            context.close()
            print(
                f"wrote {out} ({s['transport']}, mouth {s['mouthOpen']:.2f}, "
                f"caption at {s['caption']['word']!r}, TTFA {s['turns'][0]['ttfa_ms']} ms)"
            )
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
