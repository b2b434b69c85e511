"""`voiceagent bench --scenario cutoff`: the work a turn costs when it is cut off.

A long turn is read out in real time, as a listener plays it, and cancelled after
`listen_s` seconds (a barge-in). Whatever was synthesized beyond that was wasted. The
same turn runs three ways in one process on one engine: without any bound (the
baseline: synthesize as fast as possible), with the output bound (`--max-ahead-ms`:
flow and vocoder wait), and with the LM pausing as well (the embedded LM's request sits
out once its turn stops reading). Reported: process CPU seconds, LM decode steps and
seconds of audio made for each.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from ..engine.embedded import EmbeddedEngine
from ..engine.lm_engine import MAX_BACKLOG, EmbeddedLM
from ..model.sampling import SamplingParams
from ..model.speech_model import SpeechModel
from ..pipeline.turn import FrameFormat, Turn, TurnSettings

TEXT = "Here is a very long answer that goes on and on, sentence after sentence. " * 4
FRAME_S = 0.02


async def _cut_turn(
    engine: EmbeddedEngine, max_frames: int, listen_s: float, max_segment_tokens: int
) -> Turn:
    model = engine.model
    voice = next(iter(model.voices.values()))
    settings = TurnSettings(voice, SamplingParams(seed=1), 1.0, FrameFormat(48000))
    turn = Turn(
        "cut", settings, engine, max_output_frames=max_frames, max_segment_tokens=max_segment_tokens
    )
    turn.start()
    turn.push_text(TEXT)
    turn.end_text()
    start = time.monotonic()
    n = 0
    while n < int(listen_s / FRAME_S):  # a listener plays it in real time
        item = await turn.output.get()
        if item is None:
            break
        if isinstance(item, np.ndarray):  # (not a segment's timing)
            n += 1
            await asyncio.sleep(max(0.0, start + n * FRAME_S - time.monotonic()))
    turn.close()  # the barge-in
    await turn.wait()
    return turn


def measure(
    model: SpeechModel, listen_s: float = 3.0, max_ahead_ms: int = 5000, max_speech_s: float = 30
) -> dict[str, Any]:
    modes = {
        "unbounded": (0, 10**9),
        "output_bound": (max_ahead_ms // 20, 10**9),
        "output_bound_and_lm_pause": (max_ahead_ms // 20, MAX_BACKLOG),
    }
    report: dict[str, Any] = {"model": model.name, "listen_s": listen_s}
    for mode, (frames, backlog) in modes.items():
        lm = EmbeddedLM(model, max_backlog=backlog)
        engine = EmbeddedEngine(model, lm=lm)
        engine.start()
        try:
            cpu0 = time.process_time()
            turn = asyncio.run(_cut_turn(engine, frames, listen_s, int(max_speech_s * 25)))
            cpu = time.process_time() - cpu0
            steps = lm.steps
        finally:
            engine.stop()
        report[mode] = {
            "cpu_s": round(cpu, 2),
            "lm_steps": steps,
            "audio_made_s": round(turn.stats.audio_ms / 1000, 1),
        }
    base, best = report["unbounded"]["cpu_s"], report["output_bound_and_lm_pause"]["cpu_s"]
    report["cpu_saved_pct"] = round(100 * (1 - best / base), 1) if base else None
    return report


def table(report: dict[str, Any]) -> str:
    lines = [f"{'mode':<28}{'cpu_s':>8}{'lm_steps':>10}{'audio_made_s':>14}"]
    for mode in ("unbounded", "output_bound", "output_bound_and_lm_pause"):
        r = report[mode]
        lines.append(f"{mode:<28}{r['cpu_s']:>8}{r['lm_steps']:>10}{r['audio_made_s']:>14}")
    lines.append(
        f"a turn cut off after {report['listen_s']} s costs {report['cpu_saved_pct']}% less "
        "CPU than without bounds"
    )
    return "\n".join(lines)
