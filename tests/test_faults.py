"""Faults inside the pipeline and at the edges: each one ends only its own turn with a
coded error, nothing leaks (LM slots, live turns, sessions, tasks, threads), and the
server goes on by itself.

A model cannot be asked to fail on cue, so the faults are injected: `Faulty` wraps the
real tiny model's stages and breaks them only for the rows that belong to the voice
"faulty" (recognized by its prompt tokens and speaker vector). Everything else is
real: server, clients, engine threads, batching with healthy turns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import websockets
from conftest import run

from voiceagent.bench.clients import Client, TurnResult, connect
from voiceagent.engine.lm_engine import EmbeddedLM, EngineError
from voiceagent.model import checkpoint
from voiceagent.model.sampling import SamplingParams
from voiceagent.model.speech_model import SpeechModel
from voiceagent.server.background import BackgroundServer
from voiceagent.session.playout import PlayoutConfig

MARK = 0.123  # the faulty voice's speaker vector is filled with it


class FaultyLM:
    """The real LM; `mode` breaks the faulty voice's requests: "prefill" raises on its
    prefill, "decode" raises in any decode step that holds it, "nan" gives it NaN
    logits."""

    def __init__(self, lm: Any, faulty_prompt: tuple[int, ...], mode: str) -> None:
        self.lm, self.faulty_prompt, self.mode = lm, faulty_prompt, mode
        self.poisoned: set[int] = set()  # KV slots of faulty requests
        self._next_is_faulty = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lm, name)

    def prompt_embeds(self, text_ids: list[int], speech_ids: list[int]) -> torch.Tensor:
        self._next_is_faulty = tuple(speech_ids) == self.faulty_prompt
        return self.lm.prompt_embeds(text_ids, speech_ids)

    def forward_embeds(
        self, x: torch.Tensor, pool: Any, slots: torch.Tensor, start: Any, layers: Any = None
    ):
        prefill = x.shape[1] > 1
        if prefill:
            slot = int(slots[0])
            self.poisoned.discard(slot)  # a slot is reused by later requests
            if self._next_is_faulty:
                self.poisoned.add(slot)
                if self.mode == "prefill":
                    raise RuntimeError("injected prefill fault")
        rows = [i for i, s in enumerate(slots.tolist()) if s in self.poisoned]
        if rows and not prefill and self.mode == "decode":
            raise RuntimeError("injected decode fault")
        logits = self.lm.forward_embeds(x, pool, slots, start, layers)
        if rows and self.mode == "nan":
            logits[rows] = float("nan")
        return logits


class FaultyFlow(torch.nn.Module):
    """The real flow; the faulty voice's rows of mel come out as NaN."""

    def __init__(self, flow: Any) -> None:
        super().__init__()
        self.flow = flow

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.flow, name)

    def forward_chunk(self, tokens: torch.Tensor, spk: torch.Tensor, state: Any):
        mel, state = self.flow.forward_chunk(tokens, spk, state)
        rows = (spk == MARK).all(dim=1)
        mel = mel.clone()
        mel[rows] = float("nan")
        return mel, state


def faulty_model(tiny_dir: Path, mode: str) -> SpeechModel:
    model = checkpoint.load(tiny_dir)
    agent = model.voices["agent"]
    faulty = dataclasses.replace(
        agent,
        name="faulty",
        prompt_tokens=(*agent.prompt_tokens, 1, 2, 3),
        embedding=torch.full_like(agent.embedding, MARK),
    )
    model.voices["faulty"] = faulty
    if mode == "flow_nan":
        model.flow = FaultyFlow(model.flow)
    else:
        model.lm = FaultyLM(model.lm, faulty.prompt_tokens, mode)  # type: ignore[assignment]
    return model


def no_leaks(server: BackgroundServer) -> None:
    vs, lm = server.voice_server, server.engine.lm
    assert vs.admission.sessions == 0 and vs.admission.live_turns == 0
    assert sorted(lm._free) == list(range(lm.max_batch)), "an LM slot leaked"
    assert not lm._active and not lm._waiting


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# -- faults inside the model ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["prefill", "decode", "nan", "flow_nan"])
def test_a_model_fault_fails_only_its_own_turn_and_the_next_one_speaks(
    make_server, tiny_dir: Path, mode: str
) -> None:
    server = make_server(model=faulty_model(tiny_dir, mode), playout=PlayoutConfig(lead_ms=200))

    async def healthy(i: int) -> TurnResult:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(sampling={"seed": i})
            return await c.speak("A healthy answer that takes a little while to say.")

    async def broken() -> tuple[TurnResult, TurnResult]:
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(voice="faulty")
            failed = await c.speak("This one breaks the model.")
            again = await c.speak("And this one does not.", voice="agent")
            return failed, again

    async def go() -> None:
        *fine, (failed, again) = await asyncio.gather(*(healthy(i) for i in range(3)), broken())
        error = failed.event("error")
        assert error["code"] == "synthesis_failed" and "turn_id" in error
        assert again.event("turn.done")["timings"]["tokens"] > 0
        for result in fine:  # batched with the broken turn, and unharmed
            assert result.event("turn.done")["timings"]["tokens"] > 0
            assert all(e["type"] != "error" for e in result.events)
        await wait_until(lambda: server.voice_server.admission.sessions == 0)

    run(go())
    no_leaks(server)


def test_a_decode_fault_while_the_others_sit_out_fails_only_the_faulty_request(
    tiny_dir: Path,
) -> None:
    """What was seen: with the healthy request far ahead of its listener (sitting out of
    the step), a step that held only the faulty one failed every request."""
    model = faulty_model(tiny_dir, "decode")
    lm = EmbeddedLM(model, max_batch=4)
    text = model.tokenizer.encode("A healthy answer that takes a while to say. " * 3)

    async def go() -> tuple[int, str]:
        healthy = lm.generate(
            text, model.voices["agent"], SamplingParams(seed=1), torch.Generator(), 150, 200
        )
        await wait_until(lambda: healthy.backlog >= lm.max_backlog)  # nobody reads it
        broken = lm.generate(
            text[:5], model.voices["faulty"], SamplingParams(), torch.Generator(), 5, 10
        )
        with pytest.raises(EngineError) as failed:
            async for _ in broken:
                pass
        tokens = 0
        async for new in healthy:  # its turn reads on, to its end
            tokens += len(new)
        return tokens, str(failed.value)

    lm.start()
    try:
        tokens, why = run(go())
    finally:
        lm.stop()
    assert "injected decode fault" in why
    assert tokens >= 150
    assert sorted(lm._free) == list(range(lm.max_batch))


# -- the client goes away --------------------------------------------------------------

STEPS = ["sent", "started", "first_audio", "playing", "cancelling", "done"]


@pytest.mark.parametrize("abrupt", [False, True], ids=["close", "reset"])
def test_a_client_leaving_at_any_step_of_a_turn_leaves_nothing_behind(
    make_server, abrupt: bool
) -> None:
    server = make_server(playout=PlayoutConfig(lead_ms=200))
    loop_tasks = _tasks_of(server)
    threads = threading.active_count()

    async def leave_at(step: str) -> None:
        ws = await connect(server.url)
        c = Client(ws)
        await c.start()
        await c.send(
            {"type": "speak", "text": "An answer the client will not wait for.", "turn_id": "t"}
        )
        if step != "sent":
            await _until(ws, "turn.started")
        if step in ("first_audio", "playing", "cancelling"):
            await _frames(ws, 1 if step == "first_audio" else 10)
        if step == "cancelling":
            await c.send({"type": "cancel", "turn_id": "t"})
        if step == "done":
            await c.turn()
        if abrupt:
            ws.transport.abort()  # a reset: no close frame
        else:
            await ws.close()
        await wait_until(lambda: server.voice_server.admission.sessions == 0)
        await wait_until(lambda: server.voice_server.admission.live_turns == 0)

    async def go() -> None:
        for step in STEPS:
            await leave_at(step)
        async with connect(server.url) as ws:  # and the server still speaks
            c = Client(ws)
            await c.start()
            assert (await c.speak("Still here.")).frames

    run(go())
    no_leaks(server)
    deadline = time.monotonic() + 10
    while _tasks_of(server) > loop_tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _tasks_of(server) <= loop_tasks, "asyncio tasks leaked on the server"
    assert threading.active_count() <= threads, "threads leaked"


async def _until(ws: websockets.ClientConnection, kind: str) -> None:
    while True:
        message = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(message, str) and f'"{kind}"' in message:
            return


async def _frames(ws: websockets.ClientConnection, n: int) -> None:
    while n:
        if isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
            n -= 1


def _tasks_of(server: BackgroundServer) -> int:
    loop = server.voice_server.loop
    assert loop is not None

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1  # not this one

    return asyncio.run_coroutine_threadsafe(count(), loop).result(10)
