"""`voiceagent bench --scenario telephony`: phone calls through the server, as a carrier
and a bot see them.

The server runs in this process (BackgroundServer). At each concurrency level, that many
simulated Twilio calls (bench/carriers.py: 20 ms caller clock, carrier-side playout with
marks and clear) dial /v1/telephony/twilio, 100 ms apart, and a bot attaches to each
through /v1/calls. The bot speaks `turns` turns as an LLM would: a few words per
`text.delta`, then `text.end`. On one turn (the middle one) the caller talks over the
bot with a real recorded sentence (phone_speech) once `listen_s` of the turn has played.

- TTFA: the bot's first delta of a turn sent -> the carrier's first media message of it.
- Clear latency: the caller's speech onset sent (the first loud frame of the sentence)
  -> the carrier receives `clear`.
- Underruns: a turn's audio ran dry at the carrier while more of it came later (the
  carrier's dry spells between the turn's first and last media message).
- CPU: this process's CPU time (server, carriers and bots alike) over the level's wall
  time and the number of calls, in percent of one core.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..model.speech_model import SpeechModel
from ..server.app import ServerConfig
from ..server.background import BackgroundServer, free_port
from . import phone_speech
from .carriers import SimulatedTwilioCall
from .clients import connect
from .served import served_engine, served_playout
from .ws import TEXTS, percentile

ONSET_RMS = 300.0  # a 20 ms frame of the caller's sentence this loud is speech (~-40 dBFS)


@dataclass(frozen=True)
class Options:
    turns: int = 3
    listen_s: float = 1.0  # of the barge-in turn heard before the caller talks
    words_per_delta: int = 3  # the bot's LLM streams this many words ...
    delta_every_s: float = 0.1  # ... this often (about 30 words per second)
    pause_s: float = 0.3  # between a turn's end (played, or the caller done) and the next
    arrive_every_s: float = 0.1  # calls of a level dial in this far apart
    turn_timeout_s: float = 60.0


@dataclass
class Turn:
    ttfa_ms: float | None = None
    underruns: int = 0
    clear_ms: float | None = None  # the barge-in turn only
    late_media: int = 0  # media messages of the turn that arrived after its clear


@dataclass
class CallResult:
    turns: list[Turn] = field(default_factory=list)
    barged: bool = False  # the caller talked over a playing turn
    violations: int = 0  # messages that broke Twilio's schema
    errors: list[str] = field(default_factory=list)  # error events, or why the call failed


class Bot:
    """The bot's socket on /v1/calls: every JSON event kept with its arrival time."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            async for message in self.ws:
                if isinstance(message, str):
                    event = json.loads(message)
                    if event.get("type") != "audio.levels":
                        self.events.append((time.monotonic(), event))

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    def find(self, kinds: tuple[str, ...], turn_id: str | None = None) -> dict[str, Any] | None:
        for _, event in self.events:
            if event.get("type") in kinds and (turn_id is None or event.get("turn_id") == turn_id):
                return event
        return None

    async def wait(
        self, kinds: tuple[str, ...], turn_id: str | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (event := self.find(kinds, turn_id)) is None:
            if time.monotonic() > deadline or self._reader.done():
                seen = [e.get("type") for _, e in self.events]
                raise TimeoutError(f"no {'/'.join(kinds)} for {turn_id} (events: {seen})")
            await asyncio.sleep(0.01)
        return event

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def onset_offset_s(pcm: np.ndarray) -> float:
    """Where speech starts in a clip: its first 20 ms frame louder than ONSET_RMS."""
    n = pcm.size // 160 * 160
    rms = np.sqrt((pcm[:n].astype(np.float64).reshape(-1, 160) ** 2).mean(axis=1))
    loud = np.flatnonzero(rms > ONSET_RMS)
    return float(loud[0]) * 0.02 if loud.size else 0.0


def barge_turn(turns: int) -> int:
    return turns // 2


async def _stream_text(bot: Bot, turn_id: str, text: str, opts: Options) -> None:
    words = text.split()
    for i in range(0, len(words), opts.words_per_delta):
        if i:
            await asyncio.sleep(opts.delta_every_s)
        delta = " ".join(words[i : i + opts.words_per_delta]) + " "
        await bot.send({"type": "text.delta", "turn_id": turn_id, "text": delta})
    await bot.send({"type": "text.end", "turn_id": turn_id})


def _heard_s(call: SimulatedTwilioCall, since: float) -> float:
    return sum(p.pcm.size for p in call.played if p.at >= since) / call.rate


async def _turn(
    call: SimulatedTwilioCall,
    bot: Bot,
    t: int,
    sentence: phone_speech.Prompt | None,
    result: CallResult,
    opts: Options,
) -> Turn:
    turn_id, turn = f"r{t + 1}", Turn()
    text = TEXTS[t % len(TEXTS)]
    if sentence is not None:  # long enough to still play when the caller talks
        text += " " + TEXTS[(t + 1) % len(TEXTS)]
    n_media, n_said = len(call.media_at), len(call.said_at)
    sent = time.monotonic()
    streaming = asyncio.create_task(_stream_text(bot, turn_id, text, opts))
    try:
        await call.wait_until(lambda: len(call.media_at) > n_media, opts.turn_timeout_s)
        first = call.media_at[n_media]
        turn.ttfa_ms = (first - sent) * 1000
        ends = ("turn.done", "turn.cancelled", "error")
        if sentence is not None:
            await call.wait_until(
                lambda: (
                    _heard_s(call, first) >= opts.listen_s or bot.find(ends, turn_id) is not None
                ),
                opts.turn_timeout_s,
            )
            if bot.find(ends, turn_id) is None:
                result.barged = True
                call.say(sentence.pcm)
                await call.wait_until(lambda: len(call.said_at) > n_said, 5)
                said = call.said_at[n_said]
                onset = said + onset_offset_s(sentence.pcm)
                await bot.wait(ends, turn_id, 15)
                clears = [c for c in call.clears if c >= said]
                if clears:
                    turn.clear_ms = (clears[0] - onset) * 1000
                    turn.late_media = sum(m > clears[0] for m in call.media_at[n_media:])
                # the caller says the whole sentence; the bot answers after it
                await asyncio.sleep(max(0.0, said + sentence.seconds - time.monotonic()))
        end = await bot.wait(ends, turn_id, opts.turn_timeout_s)
        if end["type"] == "error":
            result.errors.append(str(end.get("code")))
        await streaming
        await call.wait_until(lambda: call.playout.queued_s == 0, opts.turn_timeout_s)
        stop = call.clears[-1] if turn.clear_ms is not None else call.media_at[-1]
        turn.underruns = sum(first <= a and b <= stop for a, b in call.playout.dry_spells)
    finally:
        streaming.cancel()
        await asyncio.gather(streaming, return_exceptions=True)
    await asyncio.sleep(opts.pause_s)
    return turn


async def one_call(
    base: str, index: int, sentence: phone_speech.Prompt | None, opts: Options, voices: list[str]
) -> CallResult:
    token = secrets.token_urlsafe(24)
    params = {"token": token, "voice": voices[index % len(voices)]}  # spread over the voices
    result = CallResult()
    call = SimulatedTwilioCall(f"{base}/v1/telephony/twilio", params)
    try:
        await call.open()
        async with connect(f"{base}/v1/calls") as ws:
            bot = Bot(ws)
            try:
                await bot.send({"type": "session.attach", "token": token})
                created = await bot.wait(("session.created", "error"), timeout=30)
                if created["type"] != "session.created":
                    raise RuntimeError(f"attach refused: {created}")
                for t in range(opts.turns):
                    barge = sentence if t == barge_turn(opts.turns) else None
                    result.turns.append(await _turn(call, bot, t, barge, result, opts))
                result.errors += [
                    str(e.get("code")) for _, e in bot.events if e.get("type") == "error"
                ]
            finally:
                await bot.close()
    except Exception as exc:  # a failed call counts against its level; the bench goes on
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        await call.close()
        result.violations = len(call.violations)
    return result


def _stats(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if values else None


async def level(base: str, calls: int, opts: Options, voices: list[str]) -> dict[str, Any]:
    sentences = phone_speech.barge_in_sentences(8)
    cpu0, t0 = time.process_time(), time.monotonic()

    async def arrive(i: int) -> CallResult:
        await asyncio.sleep(opts.arrive_every_s * i)
        sentence = sentences[i % len(sentences)] if sentences else None
        return await one_call(base, i, sentence, opts, voices)

    results = await asyncio.gather(*(arrive(i) for i in range(calls)))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    turns = [t for r in results for t in r.turns]
    ttfa = [t.ttfa_ms for t in turns if t.ttfa_ms is not None]
    clear = [t.clear_ms for t in turns if t.clear_ms is not None]
    underruns = sum(t.underruns for t in turns)
    failed = [r for r in results if len(r.turns) < opts.turns]
    errors = sorted({e for r in results for e in r.errors})
    return {
        "calls": calls,
        "realtime": underruns == 0 and not failed,
        "underruns": underruns,
        "calls_with_underruns": sum(any(t.underruns for t in r.turns) for r in results),
        "failed_calls": len(failed),
        "turns": len(turns),
        "ttfa_ms_p50": _stats(ttfa, 0.5),
        "ttfa_ms_p95": _stats(ttfa, 0.95),
        "barge_ins": sum(r.barged for r in results),
        "clears": len(clear),
        "clear_ms_p50": _stats(clear, 0.5),
        "clear_ms_p95": _stats(clear, 0.95),
        "late_media": sum(t.late_media for t in turns),
        "violations": sum(r.violations for r in results),
        "cpu_pct_per_call": round(100 * cpu / wall / calls, 1),
        "errors": errors[:5],
    }


def measure(
    model: SpeechModel,
    levels: list[int],
    opts: Options,
    lead_ms: int = 200,
    max_speech_s: float = 3.0,
    max_ahead_ms: int = 5000,
) -> dict[str, Any]:
    """Ramp through `levels` until one is not real time; report the last one that was."""
    if not phone_speech.available():
        raise RuntimeError(
            f"no phone speech in {phone_speech.SOUNDS_DIR}: install asterisk-core-sounds-en-wav"
        )
    playout = served_playout(
        lead_ms=lead_ms, max_segment_tokens=int(max_speech_s * 25), max_ahead_ms=max_ahead_ms
    )
    config = ServerConfig(port=free_port(), playout=playout, web_dir=None)
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with BackgroundServer(model, config, **served_engine(model)) as server:
        base = server.http.replace("http://", "ws://")
        warm = replace(opts, turns=1, listen_s=0.3)
        voices = list(model.voices)
        asyncio.run(level(base, 1, warm, voices))  # first-call allocations, not measured
        for n in levels:
            runs.append(asyncio.run(level(base, n, opts, voices)))
            if not runs[-1]["realtime"]:
                break
    ok = [r for r in runs if r["realtime"]]
    best = ok[-1] if ok else runs[0]
    return {
        "model": model.name,
        "random_weights": model.random_weights,
        "carrier": "twilio",
        "calls_realtime": best["calls"] if ok else 0,
        "ttfa_ms_p50": best["ttfa_ms_p50"],
        "ttfa_ms_p95": best["ttfa_ms_p95"],
        "clear_ms_p50": best["clear_ms_p50"],
        "clear_ms_p95": best["clear_ms_p95"],
        "cpu_pct_per_call": best["cpu_pct_per_call"],
        "turns_per_call": opts.turns,
        "cores": os.cpu_count(),
        "wall_s": round(time.monotonic() - t0, 1),
        "levels": runs,
    }


def table(report: dict[str, Any]) -> str:
    cols = (
        "calls",
        "realtime",
        "underruns",
        "failed_calls",
        "ttfa_ms_p50",
        "ttfa_ms_p95",
        "clears",
        "clear_ms_p50",
        "clear_ms_p95",
        "cpu_pct_per_call",
    )
    lines = ["".join(f"{c:>17}" for c in cols)]
    lines += ["".join(f"{r[c]!s:>17}" for c in cols) for r in report["levels"]]
    lines.append(
        f"{report['calls_realtime']} Twilio calls in real time on {report['cores']} cores "
        f"(carriers and bots in the same process); at that level TTFA p50/p95 "
        f"{report['ttfa_ms_p50']}/{report['ttfa_ms_p95']} ms, clear p95 "
        f"{report['clear_ms_p95']} ms, {report['cpu_pct_per_call']} % of a core per call"
    )
    for r in report["levels"]:
        if r["errors"] or r["violations"] or r["late_media"]:
            lines.append(
                f"{r['calls']} calls: errors {r['errors']}, violations {r['violations']}, "
                f"late media {r['late_media']}"
            )
    if report["random_weights"]:
        lines.append(
            f"model '{report['model']}' has random weights: its audio is noise; the numbers "
            "measure the pipeline, not the speech"
        )
    return "\n".join(lines)
