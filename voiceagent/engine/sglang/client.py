"""LM backend on an SGLang server: the exported model (`export-sglang`) decodes the
speech tokens; voiceagent streams them back over HTTP.

Each LM request is `POST /generate` with `input_ids` and `stream: true`. SGLang cannot
apply a minimum length without its tokenizer, so a request with a minimum runs in two
phases: first exactly `min_len` tokens with the stop tokens pushed down (logit_bias),
then the rest with the stop tokens allowed; the second phase's prompt repeats the first
(SGLang's prefix cache makes that free). Cancel aborts the request on the server
(`/abort_request` with its rid) so no accelerator time is wasted.

SGLang answers a streamed request it cannot serve with HTTP 200 all the same: an `error`
chunk, or a chunk whose finish reason is an abort with a status (its queue is full). Those
fail the request like an HTTP error status does: a status of 500 or more (the server, a
router without workers, an overloaded proxy) as `EngineUnavailable`, the rest as
`EngineError`. A stream that ends without saying so is the server going away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import torch

from ...model.contract import Voice
from ...model.sampling import SamplingParams
from ...model.speech_model import SpeechModel
from ...ops.metrics import Metrics
from ..lm_engine import EngineError, EngineUnavailable, TokenStream
from .export import META, logit_bias, prompt_ids

log = logging.getLogger(__name__)


class SGLangLM:
    def __init__(
        self,
        model: SpeechModel,
        url: str,
        export_dir: Path,
        timeout_s: float = 30.0,
    ) -> None:
        meta_path = export_dir / META
        if not meta_path.is_file():
            raise EngineError(f"{meta_path}: missing; run `voiceagent export-sglang` first")
        self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        self.model = model
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._bias = logit_bias(self.meta)
        self._no_stop = {
            **self._bias,
            **{str(t): -self.meta["speech_lift"] for t in self.meta["stop_ids"]},
        }
        self._active: set[str] = set()
        self._aborts: set[asyncio.Task[None]] = set()
        # One connection per live request (httpx's default pool of 100 would hold up the
        # 101st turn, and the readiness probe, while SGLang itself is fine); probes and
        # aborts have a client of their own.
        self._client: httpx.AsyncClient | None = None
        self._control: httpx.AsyncClient | None = None
        self._probe: str | None = None  # the readiness path, once the server told us
        self.steps = 0
        self.metrics = Metrics()  # replaced by the engine's

    # The embedded engine's interface -----------------------------------------------------

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    @property
    def load(self) -> int:
        return len(self._active)

    async def healthy(self) -> bool:
        """SGLang's `/health`; behind sglang-router, the router's `/readiness`, since the
        router's `/health` says 200 even when no SGLang server is behind it."""
        try:
            if self._probe is None:
                r = await self._controls().get(f"{self.url}/readiness", timeout=2.0)
                if r.status_code == 404:
                    self._probe = "/health"
                else:
                    self._probe = "/readiness"
                    return r.status_code == 200
            r = await self._controls().get(f"{self.url}{self._probe}", timeout=2.0)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def generate(
        self,
        text_ids: list[int],
        voice: Voice,
        params: SamplingParams,
        gen: torch.Generator,
        min_len: int,
        max_len: int,
    ) -> TokenStream:
        loop = asyncio.get_running_loop()
        rid = uuid.uuid4().hex
        ids = prompt_ids(
            self.meta, list(voice.lm_text_ids) + text_ids, list(voice.lm_speech_tokens)
        )
        task: asyncio.Task[None] | None = None

        def cancel() -> None:
            if task is not None and not task.done():
                task.cancel()
                aborting = loop.create_task(self._abort(rid))
                self._aborts.add(aborting)
                aborting.add_done_callback(self._aborts.discard)

        stream = TokenStream(loop, cancel)
        stream.prompt_tokens = len(ids)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        params = params.of_model(self.model.sampling)
        task = loop.create_task(
            self._run(rid, ids, params, seed, min(min_len, max_len), max_len, stream)
        )
        return stream

    # -------------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=5.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
        return self._client

    def _controls(self) -> httpx.AsyncClient:
        if self._control is None:
            self._control = httpx.AsyncClient(timeout=5.0)
        return self._control

    async def _abort(self, rid: str) -> None:
        for phase_rid in (f"{rid}-a", rid):  # whichever phase was running
            with contextlib.suppress(httpx.HTTPError):
                await self._controls().post(f"{self.url}/abort_request", json={"rid": phase_rid})

    async def _run(
        self,
        rid: str,
        ids: list[int],
        params: SamplingParams,
        seed: int,
        min_len: int,
        max_len: int,
        stream: TokenStream,
    ) -> None:
        self._active.add(rid)
        m = self.metrics
        t0 = time.monotonic()
        first = True
        finished = False  # the request ran to its end (for the latency histogram)
        off = int(self.meta["speech_offset"])
        stops = set(self.meta["stop_ids"])
        temperature, top_k, top_p = params.drawing
        produced: list[int] = []
        try:
            phases = [(min_len, self._no_stop, f"{rid}-a")] if min_len else []
            phases.append((max_len - min_len, self._bias, rid))
            for budget, bias, phase_rid in phases:
                if budget <= 0:
                    continue
                body = {
                    "rid": phase_rid,
                    "input_ids": ids + [off + t for t in produced],
                    "stream": True,
                    "sampling_params": {
                        "temperature": temperature,
                        "top_k": top_k if top_k > 0 else -1,
                        "top_p": top_p,
                        "max_new_tokens": budget,
                        "logit_bias": bias,
                        "stop_token_ids": sorted(stops),
                        "sampling_seed": seed + len(produced),
                    },
                }
                async for new, cached in self._stream(body):
                    stream.cached_tokens = max(stream.cached_tokens, cached)
                    self.steps += 1
                    m.lm_tokens.inc(len(new))
                    if first:
                        m.sglang_latency.labels("first_token").observe(time.monotonic() - t0)
                        first = False
                    for token in new:
                        if token in stops:
                            finished = True
                            stream.feed(None)
                            return
                        produced.append(token - off)
                        stream.feed([token - off])
            finished = True
            stream.feed(None)
        except asyncio.CancelledError:
            raise
        except (httpx.HTTPError, EngineUnavailable) as exc:
            m.sglang_failures.labels("unavailable").inc()
            log.warning("SGLang request %s: %s is unavailable: %r", rid, self.url, exc)
            stream.feed(EngineUnavailable("the LM server is unavailable"))
        except EngineError as exc:  # it refused the request and said why
            m.sglang_failures.labels("error").inc()
            log.warning("SGLang request %s failed: %s", rid, exc)
            stream.feed(exc)
        except Exception as exc:
            m.sglang_failures.labels("error").inc()
            log.exception("SGLang request %s failed", rid)
            stream.feed(EngineError(f"SGLang request failed: {exc}"))
        finally:
            self._active.discard(rid)
            took = time.monotonic() - t0
            if finished:
                m.sglang_latency.labels("total").observe(took)
            log.debug(
                "SGLang request %s: %d tokens in %.2f s%s",
                rid, len(produced), took, "" if finished else " (did not finish)",
            )  # fmt: skip

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[tuple[list[int], int]]:
        """New token ids of a streamed /generate, whether the server streams cumulative
        or incremental `output_ids`, with chunks that may hold several tokens."""
        seen = 0
        async with self._http().stream("POST", f"{self.url}/generate", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                raise _refusal(resp.status_code, text)
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if isinstance(chunk.get("error"), dict | str):
                    error = chunk["error"]
                    status = error.get("code", 400) if isinstance(error, dict) else 400
                    message = error.get("message", error) if isinstance(error, dict) else error
                    raise _refusal(status, str(message)[:300])
                out = chunk.get("output_ids") or []
                info = chunk.get("meta_info", {})
                total = int(info.get("completion_tokens", seen + len(out)))
                new = out[seen:] if len(out) == total and total > seen else out
                seen = total
                if new:
                    yield new, int(info.get("cached_tokens", 0))
                reason = info.get("finish_reason")
                if isinstance(reason, dict) and reason.get("type") == "abort":
                    # ours is a cancel, which stops this task first: this is the server's
                    status = reason.get("status_code") or 503
                    raise _refusal(status, f"it aborted the request: {reason.get('message', '')}")
                if reason is not None:
                    return
        raise EngineUnavailable("the stream ended before the request did")


def _refusal(status: Any, text: str) -> EngineError:
    """SGLang's refusal of a request: its server-side statuses mean it cannot serve now."""
    code = status if isinstance(status, int) else 500
    cls = EngineUnavailable if code >= 500 else EngineError
    return cls(f"SGLang refused the request ({code}): {text}")
