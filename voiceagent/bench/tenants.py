"""--scenario tenants: does one tenant's flood slow another tenant down?

Tenant A floods: more sessions than its quota allows, each sending turns back to back
(its quotas refuse the excess with `quota_exceeded`). Tenant B has one session and
measures time to first audio (client side: `speak` sent -> first audio frame). The same
run measures B first with A idle, then during A's flood; the difference is what A's
admitted work costs B (quotas bound it; the refusals themselves are cheap)."""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ..auth import keys
from ..auth.gate import AuthConfig
from ..model.checkpoint import SpeechModel
from ..server.app import ServerConfig
from ..server.background import BackgroundServer, free_port
from .clients import Client, connect
from .served import served_engine, served_playout

SENTENCE = "Thanks for calling, your order shipped this morning."
QUOTA = "[tenants.a]\nsessions = {sessions}\nturns_per_min = {turns}\nchars_per_min = {chars}\n"


async def _ttfa(url: str, key: str, turns: int) -> list[float]:
    found = []
    async with connect(url, key) as ws:
        c = Client(ws)
        await c.start()
        for _ in range(turns):
            t0 = time.perf_counter()
            r = await c.speak(SENTENCE)
            assert r.first_frame_at is not None, r.events
            found.append((r.first_frame_at - t0) * 1000)
    return found


async def _flood(url: str, key: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    try:
        async with connect(url, key) as ws:
            await ws.send(json.dumps({"type": "session.start"}))
            while not stop.is_set():
                await ws.send(json.dumps({"type": "speak", "text": SENTENCE}))
                while True:  # until this turn ends or is refused
                    msg = await ws.recv()
                    if isinstance(msg, bytes):
                        continue
                    event = json.loads(msg)
                    kind, code = event["type"], event.get("code")
                    if code == "quota_exceeded":
                        counts["refused_turns"] += 1
                        await asyncio.sleep(0.05)  # a client that retries at once, nearly
                        break
                    if kind == "turn.done":
                        counts["turns"] += 1
                        break
                    if kind in ("turn.failed", "error") and event.get("turn_id"):
                        break
    except Exception:
        counts["refused_sessions"] += 1  # closed on connect (quota): counted, not retried


def _summary(ttfa: list[float]) -> dict[str, float]:
    ordered = sorted(ttfa)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {"median_ms": round(statistics.median(ordered)), "p95_ms": round(p95)}


def measure(
    model: SpeechModel,
    turns: int = 10,
    flood_sessions: int = 12,
    quota: tuple[int, int, int] = (4, 60, 3000),
) -> dict[str, Any]:
    """B's TTFA with A idle, then while A floods `flood_sessions` sessions against its
    quota (sessions, turns per minute, characters per minute)."""
    with tempfile.TemporaryDirectory() as tmp:
        keys_file = Path(tmp) / "keys.toml"
        sessions, per_min, chars = quota
        keys_file.write_text(QUOTA.format(sessions=sessions, turns=per_min, chars=chars))
        key_a, _ = keys.add_key(keys_file, "a")
        key_b, _ = keys.add_key(keys_file, "b")
        auth = AuthConfig("on", keys_file, "bench-secret")
        config = ServerConfig(
            port=free_port(), auth=auth, max_sessions=64, playout=served_playout()
        )
        with BackgroundServer(model, config, **served_engine(model)) as server:

            async def run() -> dict[str, Any]:
                await _ttfa(server.url, key_b, 2)  # warm up
                idle = await _ttfa(server.url, key_b, turns)
                stop = asyncio.Event()
                counts = {"turns": 0, "refused_turns": 0, "refused_sessions": 0}
                floods = [
                    asyncio.create_task(_flood(server.url, key_a, stop, counts))
                    for _ in range(flood_sessions)
                ]
                await asyncio.sleep(1.0)  # let the flood reach its quotas
                busy = await _ttfa(server.url, key_b, turns)
                stop.set()
                await asyncio.wait(floods, timeout=30)
                return {
                    "quota_a": {
                        "sessions": sessions,
                        "turns_per_min": per_min,
                        "chars_per_min": chars,
                    },
                    "flood_sessions": flood_sessions,
                    "b_idle": _summary(idle),
                    "b_during_flood": _summary(busy),
                    "a": counts,
                }

            return asyncio.run(run())


def table(report: dict[str, Any]) -> str:
    q, a = report["quota_a"], report["a"]
    idle, busy = report["b_idle"], report["b_during_flood"]
    return "\n".join(
        [
            f"tenant A quota: {q['sessions']} sessions, {q['turns_per_min']} turns/min, "
            f"{q['chars_per_min']} chars/min; A opens {report['flood_sessions']} sessions",
            f"tenant B TTFA, A idle:      {_ms(idle)}",
            f"tenant B TTFA, A flooding:  {_ms(busy)}",
            f"A during the flood: {a['turns']} turns played, {a['refused_turns']} turns and "
            f"{a['refused_sessions']} sessions refused (quota_exceeded)",
        ]
    )


def _ms(s: dict[str, float]) -> str:
    return f"median {s['median_ms']:>5} ms   p95 {s['p95_ms']:>5} ms"
