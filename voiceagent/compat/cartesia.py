"""Cartesia-compatible speech: `WS /tts/websocket` and `POST /tts/bytes`, so Cartesia's
SDK, Pipecat's CartesiaTTSService / CartesiaHttpTTSService and LiveKit's cartesia plugin
work with only their base URL, key and voice changed (docs/compat.md, "Cartesia").

The socket carries contexts, each one utterance named by the client:

- a context opens with its first message (model, voice, output format, controls); later
  messages add `transcript` while `continue` is true, and `continue: false` (or leaving
  it out) ends its text. Its audio streams as `chunk` messages, its words' times (with
  `add_timestamps`) as `timestamps`, and `done` follows its last audio.
- text is held until a sentence ends (the segmenter's rule), or `max_buffer_delay_ms`
  has passed since it came (0: each message is spoken as it stands); an empty transcript
  with `continue: true` speaks what is held at once.
- `flush: true` closes a flush group: the text so far is spoken as one turn, `flush_done`
  (with its `flush_id`) follows its last audio, and later text starts the next turn of
  the same context. Chunks and timestamps carry the `flush_id` of their group.
- `{"context_id": ..., "cancel": true}` stops a context at once: nothing more of it is
  sent (no `done`).
- an error about a context is an `error` message naming it, and ends that context; the
  socket stays up.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..auth.gate import Principal, principal_of
from ..protocol.errors import ErrorCode
from ..protocol.json_text import parse_json
from ..session.port import SessionHost
from ..text.markup import without_markup
from ..text.timing import SpokenSegment
from .cartesia_request import (
    BYTES_CONTAINERS,
    WS_CONTAINERS,
    Generation,
    error_body,
    parse_generation,
)
from .context_socket import ContextSocket, serve_context_socket
from .utterance import ApiError, Utterance, json_body, streamed

log = logging.getLogger(__name__)

API = "cartesia"  # the metrics' transport label
CHUNK_MS = 200  # audio in one `chunk` message at most (clients cap a message at 1 MiB)
STATUS_OK = 206  # the `status_code` Cartesia puts on chunks, timestamps and done
MAX_CONTEXT_ID = 256


def cartesia_routes(host: SessionHost) -> list[BaseRoute]:
    api = CartesiaApi(host)
    return [
        WebSocketRoute("/tts/websocket", api.websocket),
        Route("/tts/bytes", api.bytes, methods=["POST"]),
    ]


class CartesiaApi:
    def __init__(self, host: SessionHost) -> None:
        self.host = host

    @property
    def model_name(self) -> str:
        return str(self.host.catalog.model["name"])

    async def websocket(self, ws: WebSocket) -> None:
        socket = CartesiaSocket(self.host, ws, principal_of(ws), self.model_name)
        await serve_context_socket(self.host, ws, socket)

    async def bytes(self, request: Request) -> Response:
        """The whole transcript in one request; the audio streams back as it is made,
        raw or in a WAV container."""
        try:
            body = await json_body(request)
            if not isinstance(body, dict):
                raise ApiError(ErrorCode.INVALID_MESSAGE, "the body must be a JSON object")
            text = body.get("transcript")
            if not isinstance(text, str) or not without_markup(text).strip():
                raise ApiError(ErrorCode.INVALID_PARAMETER, "transcript must be a non-empty string")
            gen = parse_generation(body, self.model_name, BYTES_CONTAINERS)
            utterance = Utterance(self.host, principal_of(request), gen.options, API)
        except ApiError as exc:
            return http_error(exc)
        try:
            utterance.push(text)  # its markup too: a <break> is a pause the turn places
            utterance.end()
        except ApiError as exc:
            utterance.close()
            return http_error(exc)
        out = gen.output
        encoder = out.stream_encoder()
        return await streamed(utterance, encoder, out.content_type, http_error, gain=gen.volume)


def http_error(error: ApiError) -> JSONResponse:
    headers = {"Retry-After": "2"} if error.status in (429, 503) else None
    return JSONResponse(error_body(error, socket=False), status_code=error.status, headers=headers)


@dataclass(eq=False)
class _Part:
    """One flush group of a context: one turn of the model."""

    utterance: Utterance
    flush_id: int  # 1, 2, ...: on this group's chunks and timestamps
    acknowledge: bool = False  # ended by a flush: `flush_done` follows its last audio


@dataclass(eq=False)
class _Context:
    id: str
    gen: Generation
    parts: asyncio.Queue[_Part | None] = field(default_factory=asyncio.Queue)
    # the groups not sent yet (a sent one is dropped: a context may live for hours)
    unsent: list[_Part] = field(default_factory=list)
    groups: int = 0  # flush groups so far
    taking: _Part | None = None  # the group that takes text now (None: text ended)
    sending: _Part | None = None  # the group whose audio is going out
    timer: asyncio.TimerHandle | None = None  # max_buffer_delay_ms, while text is held
    samples: int = 0  # audio sent so far, at the output rate
    part_start: int = 0  # `samples` when the sending group's audio began
    last_sent: float = field(default_factory=time.monotonic)
    release: Callable[[], None] | None = None  # gives back the context's live-turn slot

    def add(self, utterance: Utterance) -> _Part:
        self.groups += 1
        part = _Part(utterance, self.groups)
        self.unsent.append(part)
        self.parts.put_nowait(part)
        self.taking = part
        return part

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def close(self) -> None:
        self.stop_timer()
        for part in self.unsent:
            part.utterance.close()
        release, self.release = self.release, None
        if release is not None:
            release()

    def step_ms(self) -> float:
        now = time.monotonic()
        step, self.last_sent = (now - self.last_sent) * 1000, now
        return round(step, 1)


class CartesiaSocket(ContextSocket):
    api = API
    # Cartesia closes a socket after 5 minutes with nothing to do; clients open theirs
    # before there is text and keep it, so it is not closed sooner
    quiet_limit_s = 300.0

    def __init__(
        self, host: SessionHost, ws: WebSocket, principal: Principal, model_name: str
    ) -> None:
        super().__init__(host, ws, principal)
        self.model_name = model_name
        self._contexts: dict[str, _Context] = {}

    # -- messages in ----------------------------------------------------------------------

    async def on_text(self, text: str) -> None:
        try:
            msg = parse_json(text)
        except ValueError:
            await self.send_error(None, ApiError(ErrorCode.INVALID_JSON, "not JSON"))
            return
        if not isinstance(msg, dict):
            error = ApiError(ErrorCode.INVALID_MESSAGE, "a message is a JSON object")
            await self.send_error(None, error)
            return
        context_id = msg.get("context_id")
        if not isinstance(context_id, str) or not 0 < len(context_id) <= MAX_CONTEXT_ID:
            error = ApiError(
                ErrorCode.INVALID_MESSAGE,
                f"context_id (a string of 1 to {MAX_CONTEXT_ID} characters) is required",
            )
            await self.send_error(None, error)
            return
        if msg.get("cancel") is True:
            if not self.cancel(context_id):
                error = ApiError(
                    ErrorCode.UNKNOWN_CONTEXT, f"no live context {context_id[:80]!r} to cancel"
                )
                await self.send_error(context_id, error)
            return
        try:
            await self._request(context_id, msg)
        except ApiError as exc:
            self.cancel(context_id)  # an error about a context ends it
            await self.send_error(context_id, exc)

    async def _request(self, context_id: str, msg: dict[str, Any]) -> None:
        transcript = msg.get("transcript")
        if not isinstance(transcript, str):
            raise ApiError(ErrorCode.INVALID_MESSAGE, "transcript (a string) is required")
        said = without_markup(transcript)  # what is said; the markup goes on to the turn
        for name in ("continue", "flush"):
            if msg.get(name) is not None and not isinstance(msg[name], bool):
                raise ApiError(ErrorCode.INVALID_PARAMETER, f"{name} must be true or false")
        go_on = msg.get("continue") is True
        flush = msg.get("flush") is True
        ctx = self._contexts.get(context_id)
        if ctx is None:
            gen = parse_generation(msg, self.model_name, WS_CONTAINERS)
            if not said.strip() and not go_on:  # nothing to say, nothing to come
                await self.send_done(context_id)
                return
            ctx = self._open(context_id, gen)
        part = ctx.taking
        if part is None:  # its text has ended; only an empty repeat of the end is fine
            if said.strip() or flush:
                raise ApiError(
                    ErrorCode.INVALID_MESSAGE,
                    f"context {context_id[:80]!r} has ended its input (continue: false); "
                    "send more text in a new context",
                )
            return
        if transcript:
            part.utterance.push(transcript)
        if flush or not go_on:
            ctx.stop_timer()
            if flush and go_on:  # later text is the next group's
                if ctx.parts.qsize() >= self.host.limits.max_turns:
                    raise ApiError(
                        ErrorCode.TURN_QUEUE_FULL,
                        f"at most {self.host.limits.max_turns} flush groups may wait in a context",
                        429,
                    )
                # each group is a turn of the tenant's quota (the first: the context's)
                if over := self.host.admission.tenant(self.principal.tenant).take_turn():
                    raise ApiError(ErrorCode.QUOTA_EXCEEDED, over)
                ctx.add(self._utterance(context_id, ctx.gen))
            else:
                ctx.taking = None
                ctx.parts.put_nowait(None)
            part.acknowledge = flush
            part.utterance.end()
        elif not said.strip() or ctx.gen.buffer_delay_ms == 0:
            part.utterance.flush()  # speak what is held now
        elif not part.utterance.turn.holds_text:
            ctx.stop_timer()  # a sentence end took all that was held: the delay restarts
        elif ctx.timer is None:  # counted from when the held text began
            delay = ctx.gen.buffer_delay_ms / 1000
            loop = asyncio.get_running_loop()
            ctx.timer = loop.call_later(delay, self._held_too_long, ctx, part)

    def waiting_since(self, context_id: str) -> float | None:
        """Its groups so far are sent and the one taking text waits for more."""
        ctx = self._contexts.get(context_id)
        part = None if ctx is None else ctx.taking
        if ctx is None or part is None or ctx.sending is not part or ctx.timer is not None:
            return None
        return part.utterance.turn.waiting_since

    def _held_too_long(self, ctx: _Context, part: _Part) -> None:
        ctx.timer = None
        if ctx.taking is part:
            part.utterance.flush()

    def _utterance(self, context_id: str, gen: Generation) -> Utterance:
        """A flush group's turn: the context holds the live-turn slot for all of them."""
        return Utterance(self.host, self.principal, gen.options, self.api, context_id, slot=False)

    def _open(self, context_id: str, gen: Generation) -> _Context:
        limit = self.host.limits.max_turns
        if len(self.contexts) >= limit:
            raise ApiError(
                ErrorCode.TURN_QUEUE_FULL, f"at most {limit} contexts are live on one socket", 429
            )
        admission = self.host.admission
        if (refusal := admission.admit_request(self.principal.tenant)) is not None:
            raise ApiError(refusal.code, refusal.message)
        try:
            first = self._utterance(context_id, gen)
        except BaseException:
            admission.turn_ended()
            raise
        ctx = _Context(context_id, gen, release=admission.turn_ended)
        ctx.add(first)
        self._contexts[context_id] = ctx
        self.contexts[context_id] = first
        self._pumps[context_id] = asyncio.get_running_loop().create_task(self._run(ctx))
        return ctx

    def cancel(self, context_id: str) -> bool:
        ctx = self._contexts.pop(context_id, None)
        if ctx is not None:
            ctx.close()
        return super().cancel(context_id)

    # -- audio out ------------------------------------------------------------------------

    async def _run(self, ctx: _Context) -> None:
        """Send a context's groups in order, each group's audio as it is made."""
        try:
            while (part := await ctx.parts.get()) is not None:
                ctx.sending, ctx.part_start = part, ctx.samples
                async for piece in part.utterance.pieces():
                    if isinstance(piece, SpokenSegment):
                        await self.send_timing(ctx.id, piece)
                    else:
                        await self.send_audio(ctx.id, piece)
                part.utterance.close()
                ctx.unsent.remove(part)
                if part.acknowledge:
                    await self.send_json(
                        {
                            "type": "flush_done",
                            "context_id": ctx.id,
                            "flush_id": part.flush_id,
                            "flush_done": True,
                            "done": False,
                            "status_code": STATUS_OK,
                        }
                    )
            await self.send_done(ctx.id)
        except ApiError as exc:
            with contextlib.suppress(ConnectionError):
                await self.send_error(ctx.id, exc)
        except ConnectionError:
            pass  # the socket is going; its read loop ends it
        except Exception:
            log.exception("cartesia context failed")
            with contextlib.suppress(ConnectionError):
                error = ApiError(ErrorCode.INTERNAL_ERROR, "the context failed")
                await self.send_error(ctx.id, error)
        finally:
            ctx.close()
            if self._pumps.get(ctx.id) is asyncio.current_task():
                del self._pumps[ctx.id]
                del self.contexts[ctx.id]
                del self._contexts[ctx.id]
                self._note_if_idle()

    async def send_audio(self, context_id: str, pcm: np.ndarray) -> None:
        ctx = self._contexts[context_id]
        assert ctx.sending is not None
        out = ctx.gen.output
        if ctx.gen.volume != 1.0:
            pcm = pcm * ctx.gen.volume
        step = out.sample_rate * CHUNK_MS // 1000
        for at in range(0, len(pcm), step):
            piece = pcm[at : at + step]
            await self.send_json(
                {
                    "type": "chunk",
                    "context_id": context_id,
                    "data": base64.b64encode(out.encode(piece)).decode(),
                    "done": False,
                    "status_code": STATUS_OK,
                    "step_time": ctx.step_ms(),
                    "flush_id": ctx.sending.flush_id,
                }
            )
            ctx.samples += len(piece)

    async def send_timing(self, context_id: str, segment: SpokenSegment) -> None:
        """Word times in seconds from the context's first sample: the group's segment
        times (the model's token clock) after the audio of the groups before it."""
        ctx = self._contexts[context_id]
        assert ctx.sending is not None
        words = segment.words
        if not ctx.gen.add_timestamps or not words:
            return
        offset_ms = ctx.part_start * 1000 / ctx.gen.output.sample_rate
        await self.send_json(
            {
                "type": "timestamps",
                "context_id": context_id,
                "status_code": STATUS_OK,
                "done": False,
                "flush_id": ctx.sending.flush_id,
                "word_timestamps": {
                    "words": [w.word for w in words],
                    "start": [round((offset_ms + w.start_ms) / 1000, 3) for w in words],
                    "end": [round((offset_ms + w.end_ms) / 1000, 3) for w in words],
                },
            }
        )

    async def send_done(self, context_id: str) -> None:
        message = {"type": "done", "context_id": context_id, "done": True}
        await self.send_json({**message, "status_code": STATUS_OK})

    def http_error(self, error: ApiError) -> Response:
        return http_error(error)

    async def write_error(self, context_id: str | None, error: ApiError) -> None:
        await self.send_json(error_body(error, context_id))
