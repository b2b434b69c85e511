"""Screenshot of the demo page mid-speech, written to web/screenshot.png.

    .venv/bin/python tests/web_screenshot.py [--transport webrtc|ws] [--out PATH]

Starts a server with the random-weight tiny model on a free port (voiceagent.server.
background), opens the page in headless Chromium, speaks a sentence and takes the
screenshot while the mouth is open. Not a test; no pytest needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright
from web_browser import launch, open_demo, speak, state, wait_turn

from voiceagent.model import checkpoint
from voiceagent.model.tiny.checkpoint import ensure_tiny
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Hello! Your order shipped this morning, and it should arrive on Thursday."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["webrtc", "ws"], default="webrtc")
    parser.add_argument("--out", type=Path, default=ROOT / "web" / "screenshot.png")
    args = parser.parse_args()

    model = checkpoint.load(ensure_tiny())
    with (
        BackgroundServer(model, ServerConfig(port=free_port())) as server,
        sync_playwright() as p,
    ):
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        open_demo(page, server.http, args.transport)
        page.fill("#text", TEXT)
        # a first turn so the turn log and TTFA readout have something to show
        wait_turn(page, speak(page, "Hi there."), ("done",))
        page.wait_for_timeout(400)
        speak(page, TEXT)
        # mid-speech: the mouth well open, a second into the turn
        page.wait_for_function(
            "() => { const s = window.voiceagentDemo.state();"
            " return s.lastTurn?.turn_id === 'r2' && s.playing && s.playing.offsetMs > 1000"
            " && s.mouthOpen > 0.35; }",
            timeout=20000,
        )
        page.screenshot(path=str(args.out))
        s = state(page)
        browser.close()
    print(
        f"wrote {args.out} ({s['transport']}, mouth {s['mouthOpen']:.2f}, "
        f"TTFA {s['turns'][0]['ttfa_ms']} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
