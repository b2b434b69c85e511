"""ElevenLabs-compatible text to speech, so ElevenLabs' clients (Pipecat's
`ElevenLabsTTSService` and `ElevenLabsHttpTTSService`, LiveKit's elevenlabs plugin, the
SDK's realtime helper) work with only their base URL, key and voice id changed:

WS   /v1/text-to-speech/{voice_id}/multi-stream-input   several contexts on one socket
WS   /v1/text-to-speech/{voice_id}/stream-input         one utterance per socket
POST /v1/text-to-speech/{voice_id}/stream               audio as it is made
POST /v1/text-to-speech/{voice_id}/stream/with-timestamps   NDJSON: audio and alignment
POST /v1/text-to-speech/{voice_id}                      the same audio (streamed too)

The two sockets speak ElevenLabs' JSON: text in (`text`, `flush`, `close_context`,
`close_socket`), `{"audio": base64, "alignment", "normalizedAlignment", "contextId",
"isFinal"}` out. What differs from ElevenLabs, and the exact client lines to change,
are in docs/compat.md (ElevenLabs).
Alignment (approximate) is elevenlabs_wire.py's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..auth.gate import Principal, principal_of
from ..model.sampling import SamplingParams
from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.json_text import parse_json
from ..session.port import SessionHost
from ..text.timing import SpokenSegment
from .context_socket import ContextSocket, serve_context_socket
from .elevenlabs_wire import (
    CHUNK_MS,
    DEFAULT_FORMAT,
    Alignment,
    Encoder,
    OutputFormat,
    StreamParams,
    given_of,
    http_error,
    invalid,
    language_of,
    message_flag,
    parse_format,
    seed_of,
    speed_of,
    speed_set,
)
from .utterance import ApiError, SpeechOptions, Utterance, WatchedStream, json_body, streamed

log = logging.getLogger(__name__)

API = "elevenlabs"  # the metrics' transport label
PREFIX = "/v1/text-to-speech/{voice_id}"
MAX_CONTEXTS = 5  # per socket, as ElevenLabs allows
MAX_CONTEXT_ID = 128
DEFAULT_CONTEXT = "default"  # a multi-context message without context_id

# -- the sockets ------------------------------------------------------------------------


@dataclass
class Context:
    """What the socket keeps for one context beside its utterance."""

    encoder: Encoder
    heard: float  # loop time of its last message or audio (for the inactivity timeout)
    flushed: bool = False  # its last message was a flush without text: input may end
    ending: bool = False  # closed after a flush: its audio finishes, then isFinal
    alignment: Alignment = field(default_factory=Alignment)


class ElevenLabsSocket(ContextSocket):
    """`multi-stream-input` (multi=True) and `stream-input` (one implicit context, ended
    by `{"text": ""}`, after whose isFinal the server closes the socket)."""

    api = API

    def __init__(
        self,
        host: SessionHost,
        ws: WebSocket,
        principal: Principal,
        params: StreamParams,
        multi: bool = True,
    ) -> None:
        super().__init__(host, ws, principal)
        self.params = params
        self.multi = multi
        self.state: dict[str, Context] = {}
        self.loop = asyncio.get_running_loop()
        self.heard = self.loop.time()  # last message or audio on the socket
        self.ended = False

    # -- text in --------------------------------------------------------------------------

    async def on_text(self, text: str) -> None:
        self.heard = self.loop.time()
        try:
            msg = parse_json(text)
        except ValueError:
            await self.send_error(None, ApiError(ErrorCode.INVALID_JSON, "not valid JSON"))
            return
        try:
            if not isinstance(msg, dict):
                raise ApiError(ErrorCode.INVALID_MESSAGE, "a message must be a JSON object")
            if self.multi:
                await self._multi(msg)
            else:
                await self._single(msg)
        except ApiError as exc:
            cid = msg.get("context_id") if self.multi and isinstance(msg, dict) else None
            await self.send_error(cid if isinstance(cid, str) else None, exc)

    async def _multi(self, msg: dict[str, Any]) -> None:
        if message_flag(msg, "close_socket"):
            await self._close_socket()
            return
        cid = msg.get("context_id", DEFAULT_CONTEXT)
        if not isinstance(cid, str) or not cid or len(cid) > MAX_CONTEXT_ID:
            raise ApiError(
                ErrorCode.INVALID_MESSAGE,
                f"context_id must be a non-empty string of at most {MAX_CONTEXT_ID} characters",
            )
        text = msg.get("text")
        if text is not None and not isinstance(text, str):
            raise invalid("text must be a string")
        flush, close = message_flag(msg, "flush"), message_flag(msg, "close_context")
        if text:
            await self._text(cid, text, msg)
        ctx = self.state.get(cid)
        if ctx is not None:
            ctx.heard = self.heard
            if flush:
                # a flush of its own (no text with it), or one that closes too, ends the
                # input; a sentence sent with flush (LiveKit's auto_mode) does not
                ctx.flushed = close or not (text and text.strip())
                self.contexts[cid].flush()
        if close:
            await self._close_context(cid)

    async def _single(self, msg: dict[str, Any]) -> None:
        text = msg.get("text")
        if not isinstance(text, str):
            raise invalid("text must be a string")
        cid = DEFAULT_CONTEXT
        if text == "":  # end of input: speak it all, then isFinal, then the socket closes
            if cid in self.state:
                self.state[cid].flushed = True
                await self._close_context(cid)
            else:
                await self._end_socket(CloseCode.NORMAL, "end of input")
            return
        await self._text(cid, text, msg)
        if message_flag(msg, "flush") and cid in self.contexts:
            self.contexts[cid].flush()

    async def _text(self, cid: str, text: str, msg: dict[str, Any]) -> None:
        """Text for a context, opened by its first message (whose voice_settings count)."""
        ctx = self.state.get(cid)
        if ctx is None:
            if len(self.contexts) >= MAX_CONTEXTS:
                await self._refused(
                    cid,
                    ApiError(
                        ErrorCode.TOO_MANY_CONTEXTS,
                        f"at most {MAX_CONTEXTS} contexts may be open on one socket; "
                        "close one first",
                    ),
                )
                return
            try:
                settings = msg.get("voice_settings")
                options = SpeechOptions(
                    self.params.voice,
                    self.params.language,
                    speed_of(settings),
                    SamplingParams(seed=self.params.seed),
                    self.params.format.utterance_rate,
                    self.params.given | given_of(speed=speed_set(settings)),
                )
                self.open(cid, options)
            except ApiError as exc:
                await self._refused(cid, exc)
                return
            ctx = self.state[cid] = Context(self.params.format.encoder(), self.heard)
        elif ctx.ending:
            raise ApiError(
                ErrorCode.UNKNOWN_CONTEXT, f"context {cid[:40]!r} is closed: open a new one"
            )
        self.contexts[cid].push(text)  # raises text_too_long, quota_exceeded
        if text.strip():
            ctx.flushed = False
            if self.params.auto_mode:  # full sentences or phrases: speak each at once
                self.contexts[cid].flush()

    async def _refused(self, cid: str, error: ApiError) -> None:
        """A context that could not open: the error, then isFinal, so a client waiting
        for the context's end is not left waiting."""
        await self.send_error(cid, error)
        await self._final(cid)

    async def _close_context(self, cid: str) -> None:
        """Right after a flush of its own (`{"flush": true}` or `{"text": "", "flush":
        true}`), or with a flush in the same message, `close_context` ends the context:
        what was sent is spoken to the end, then isFinal. That is how Pipecat and LiveKit
        end an utterance. Otherwise, or a second time, it is a barge-in (how both
        interrupt): the context stops at once, and isFinal follows."""
        ctx = self.state.get(cid)
        if ctx is None:
            return  # already over (its isFinal was sent): a harmless race
        if ctx.flushed and not ctx.ending:
            ctx.ending = True
            self.contexts[cid].end()
            return
        self.cancel(cid)
        await self._final(cid)

    async def _close_socket(self) -> None:
        await self._end_socket(CloseCode.NORMAL, "close_socket")

    async def _end_socket(self, code: int, reason: str) -> None:
        """Stop every context and close; the read loop ends with this message."""
        self.close_all()
        self.ended = True
        with contextlib.suppress(Exception):
            await self.ws.close(code, reason)
        raise ConnectionError(reason)

    # -- out ------------------------------------------------------------------------------

    def _ids(self, cid: str | None) -> dict[str, str]:
        # Pipecat reads contextId, LiveKit either: both are sent (stream-input has none)
        return {"contextId": cid, "context_id": cid} if self.multi and cid is not None else {}

    async def send_audio(self, context_id: str, pcm: np.ndarray) -> None:
        ctx = self.state[context_id]
        ctx.heard = self.heard = self.loop.time()
        step = self.params.format.chunk_samples()
        for i in range(0, len(pcm), step):
            data = ctx.encoder.encode(pcm[i : i + step])
            await self._send_audio(context_id, ctx, data)

    async def _send_audio(self, cid: str, ctx: Context, data: bytes) -> None:
        aligned = ctx.alignment.take(relative=not self.params.sync_alignment)
        await self.send_json(
            {
                "audio": base64.b64encode(data).decode() if data else None,
                "isFinal": None,
                "normalizedAlignment": aligned,
                "alignment": aligned,
                **self._ids(cid),
            }
        )

    async def send_timing(self, context_id: str, segment: SpokenSegment) -> None:
        self.state[context_id].alignment.add(segment)

    async def send_done(self, context_id: str) -> None:
        ctx = self.state[context_id]
        tail = ctx.encoder.finish()
        if tail or ctx.alignment.chars:
            await self._send_audio(context_id, ctx, tail)
        await self._final(context_id)
        if not self.multi:  # stream-input: one utterance a socket
            self.ended = True
            with contextlib.suppress(Exception):
                await self.ws.close(CloseCode.NORMAL, "done")

    async def _final(self, cid: str) -> None:
        self.state.pop(cid, None)
        await self.send_json({"isFinal": True, **self._ids(cid)})

    def http_error(self, error: ApiError) -> Response:
        return http_error(error)

    async def write_error(self, context_id: str | None, error: ApiError) -> None:
        """ElevenLabs' error message: `error` (our stable code) and `message`. One that
        ends a context (its synthesis failed) is followed by the context's isFinal."""
        message = {"error": str(error.code), "message": error.message}
        await self.send_json({**message, **self._ids(context_id)})
        if context_id is not None and self._pumps.get(context_id) is asyncio.current_task():
            await self._final(context_id)

    def cancel(self, context_id: str) -> bool:
        self.state.pop(context_id, None)
        return super().cancel(context_id)

    # -- inactivity -----------------------------------------------------------------------

    async def watch(self) -> None:
        """ElevenLabs' `inactivity_timeout`: a context with no message and no audio for
        that long is closed (`idle_timeout`, then isFinal), and so is the socket once no
        context is left and nothing has come or gone for that long."""
        limit = self.params.inactivity_s
        while not self.ended:
            now = self.loop.time()
            wake = self.heard + limit
            for cid, ctx in list(self.state.items()):
                if ctx.heard + limit > now:
                    wake = min(wake, ctx.heard + limit)
                    continue
                self.cancel(cid)
                error = ApiError(
                    ErrorCode.IDLE_TIMEOUT, f"no message and no audio for {limit:g} s: closed"
                )
                with contextlib.suppress(ConnectionError):
                    await self.send_error(cid, error)
                    await self._final(cid)
            if wake <= now and not self.contexts:
                self.ended = True
                self.host.engine.metrics.closed.labels(str(ErrorCode.IDLE_TIMEOUT)).inc()
                with contextlib.suppress(Exception):
                    await self.send_error(
                        None,
                        ApiError(ErrorCode.IDLE_TIMEOUT, f"no message for {limit:g} s: closed"),
                    )
                    await self.ws.close(CloseCode.POLICY_VIOLATION, str(ErrorCode.IDLE_TIMEOUT))
                return
            await asyncio.sleep(max(wake - now, 0.05))


# -- HTTP -------------------------------------------------------------------------------


class ElevenLabsApi:
    def __init__(self, host: SessionHost) -> None:
        self.host = host

    def routes(self) -> list[BaseRoute]:
        return [
            WebSocketRoute(f"{PREFIX}/multi-stream-input", self.multi_stream_input),
            WebSocketRoute(f"{PREFIX}/stream-input", self.stream_input),
            Route(f"{PREFIX}/stream/with-timestamps", self.with_timestamps, methods=["POST"]),
            Route(f"{PREFIX}/stream", self.stream, methods=["POST"]),
            Route(PREFIX, self.stream, methods=["POST"]),
        ]

    async def multi_stream_input(self, ws: WebSocket) -> None:
        await self._socket(ws, multi=True)

    async def stream_input(self, ws: WebSocket) -> None:
        await self._socket(ws, multi=False)

    async def _socket(self, ws: WebSocket, multi: bool) -> None:
        principal = principal_of(ws)
        try:
            params = StreamParams.parse(
                self.host, principal, ws.path_params["voice_id"], ws.query_params
            )
        except ApiError as exc:  # before the upgrade: the client sees the HTTP status
            await ws.send_denial_response(http_error(exc))
            return
        socket = ElevenLabsSocket(self.host, ws, principal, params, multi)
        watch = asyncio.get_running_loop().create_task(socket.watch())
        try:
            await serve_context_socket(self.host, ws, socket)
        finally:
            watch.cancel()

    async def _request(self, request: Request) -> tuple[Utterance, OutputFormat]:
        """A checked body and query, and the utterance speaking it (ApiError if not).
        Of the body, `text`, `voice_settings.speed`, `language_code` and `seed` count;
        the rest (model_id, previous_text, pronunciation dictionaries, ...) is ignored."""
        body = await json_body(request)
        if not isinstance(body, dict):
            raise ApiError(ErrorCode.INVALID_MESSAGE, "the body must be a JSON object")
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            raise invalid("text must be a non-empty string")
        fmt = parse_format(request.query_params.get("output_format") or DEFAULT_FORMAT)
        options = SpeechOptions(
            request.path_params["voice_id"],
            language_of(body.get("language_code")),
            speed_of(body.get("voice_settings")),
            SamplingParams(seed=seed_of(body.get("seed"))),
            fmt.utterance_rate,
            given_of(
                speed=speed_set(body.get("voice_settings")),
                language=body.get("language_code") is not None,
                seed=body.get("seed") is not None,
            ),
        )
        utterance = Utterance(self.host, principal_of(request), options, API)
        try:
            utterance.push(text)
        except ApiError:
            utterance.close()
            raise
        utterance.end()
        return utterance, fmt

    async def stream(self, request: Request) -> Response:
        """The audio, in the requested format, as it is made."""
        try:
            utterance, fmt = await self._request(request)
        except ApiError as exc:
            return http_error(exc)
        return await streamed(utterance, fmt.encoder(), fmt.content_type, http_error)

    async def with_timestamps(self, request: Request) -> Response:
        """NDJSON, one object a line: `audio_base64` and the characters timed so far
        (`alignment`, `normalized_alignment`; seconds from the first sample)."""
        try:
            utterance, fmt = await self._request(request)
        except ApiError as exc:
            return http_error(exc)
        pieces = _pieces(utterance)
        try:
            first = await anext(pieces, None)
        except ApiError as exc:
            utterance.close()
            return http_error(exc)
        encoder = fmt.encoder()
        alignment = Alignment()

        def line(data: bytes) -> bytes:
            aligned = alignment.take_seconds()
            item: dict[str, Any] = {"alignment": aligned, "normalized_alignment": aligned}
            if data:  # (Pipecat decodes any audio_base64 it is given: none on a last line)
                item["audio_base64"] = base64.b64encode(data).decode()
            return json.dumps(item).encode() + b"\n"

        async def lines() -> AsyncGenerator[bytes, None]:
            try:
                piece = first
                while piece is not None:
                    if isinstance(piece, SpokenSegment):
                        alignment.add(piece)
                    else:
                        yield line(encoder.encode(piece))
                    piece = await anext(pieces, None)
                tail = encoder.finish()
                if tail or alignment.chars:
                    yield line(tail)
            except ApiError as exc:
                log.warning("elevenlabs stream stopped: %s", exc.message)
            finally:
                utterance.close()

        return WatchedStream(lines(), self.host, media_type="application/x-ndjson")


async def _pieces(utterance: Utterance) -> AsyncIterator[np.ndarray | SpokenSegment]:
    """The utterance's pieces, its audio cut to at most CHUNK_MS a piece."""
    step = utterance.options.sample_rate * CHUNK_MS // 1000  # (the utterance's rate)
    async for piece in utterance.pieces():
        if isinstance(piece, np.ndarray):
            for i in range(0, len(piece), step):
                yield piece[i : i + step]
        else:
            yield piece


def elevenlabs_routes(host: SessionHost) -> list[BaseRoute]:
    return ElevenLabsApi(host).routes()
