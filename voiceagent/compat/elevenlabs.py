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
are in docs/compat-elevenlabs.md.

Alignment is approximate: a segment's span is exact (the model's 25 Hz token clock), its
words share it by length in characters (text/timing.py), and each word's characters (and
the space after it) share the word's time equally. The two clients read the times
differently, and this server follows each: with `sync_alignment=true` (LiveKit sends it)
the times count from the context's first sample; without it (Pipecat) each alignment's
times count from the start of the speech it covers, and consecutive alignments tile the
context's audio, so adding up their spans (Pipecat's running clock) gives the context's
timeline.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..audio.codecs import alaw_encode, float_to_int16, mulaw_encode
from ..auth.gate import Principal, principal_of
from ..model.sampling import SamplingParams
from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.messages import LANGUAGES
from ..session.port import SessionHost
from ..text.timing import SpokenSegment
from .context_socket import ContextSocket, serve_context_socket
from .utterance import ApiError, SpeechOptions, Utterance, find_voice

log = logging.getLogger(__name__)

API = "elevenlabs"  # the metrics' transport label
PREFIX = "/v1/text-to-speech/{voice_id}"

DEFAULT_FORMAT = "mp3_44100_128"  # ElevenLabs' default when none is asked for
PCM_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
# Formats ElevenLabs offers that this server cannot make yet (they need an encoder and a
# container from audio/containers.py): refused with `unsupported_format`.
LATER_FORMATS = re.compile(r"(mp3|opus|wav)_\d{4,5}(_\d{1,3})?")

MAX_CONTEXTS = 5  # per socket, as ElevenLabs allows
MAX_CONTEXT_ID = 128
DEFAULT_CONTEXT = "default"  # a multi-context message without context_id
DEFAULT_INACTIVITY_S = 20  # ElevenLabs' default `inactivity_timeout`
MAX_INACTIVITY_S = 180
CHUNK_MS = 500  # the most audio in one message (an aiohttp line reader takes 128 KiB)


def _invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_PARAMETER, message)


# -- output formats ---------------------------------------------------------------------


@dataclass(frozen=True)
class OutputFormat:
    """One of ElevenLabs' `output_format` values this server makes."""

    name: str  # as the client asked: pcm_16000, ulaw_8000, ...
    codec: str  # pcm (int16 little-endian), ulaw or alaw (G.711, one byte a sample)
    sample_rate: int

    @property
    def sample_bytes(self) -> int:
        return 2 if self.codec == "pcm" else 1

    @property
    def content_type(self) -> str:
        kind = {"pcm": "audio/pcm", "ulaw": "audio/basic", "alaw": "audio/x-alaw-basic"}
        return f"{kind[self.codec]};rate={self.sample_rate}"

    @property
    def utterance_rate(self) -> int:
        """The PCM rate to ask of the utterance. (mp3, once containers.py lands: MODEL_RATE,
        since its stream encoder takes 24 kHz and resamples itself.)"""
        return self.sample_rate

    def encoder(self) -> AudioEncoder:
        return AudioEncoder(self.codec)

    def chunk_samples(self) -> int:
        return self.sample_rate * CHUNK_MS // 1000


class AudioEncoder:
    """float32 PCM at the format's rate -> the format's bytes, in stream order.
    (mp3: a stream encoder from containers.py, whose `finish` flushes its last frame.)"""

    def __init__(self, codec: str) -> None:
        self.codec = codec

    def encode(self, pcm: np.ndarray) -> bytes:
        pcm16 = float_to_int16(pcm)
        if self.codec == "ulaw":
            return mulaw_encode(pcm16).tobytes()
        if self.codec == "alaw":
            return alaw_encode(pcm16).tobytes()
        return pcm16.astype("<i2").tobytes()

    def finish(self) -> bytes:
        return b""


def parse_format(name: str) -> OutputFormat:
    """Raises ApiError: `unsupported_format` for a format of ElevenLabs' this server does
    not make (yet), `invalid_parameter` for anything else unknown."""
    codec, _, rate = name.partition("_")
    if codec == "pcm" and rate.isdigit() and int(rate) in PCM_RATES:
        return OutputFormat(name, "pcm", int(rate))
    if name in ("ulaw_8000", "alaw_8000"):
        return OutputFormat(name, codec, 8000)
    supported = ", ".join([*(f"pcm_{r}" for r in PCM_RATES), "ulaw_8000", "alaw_8000"])
    if LATER_FORMATS.fullmatch(name):
        raise ApiError(
            ErrorCode.UNSUPPORTED_FORMAT,
            f"output_format {name} is not supported by this server yet; use one of {supported}",
        )
    raise _invalid(f"unknown output_format {name[:40]!r}; use one of {supported}")


# -- alignment --------------------------------------------------------------------------


def char_times(segment: SpokenSegment) -> tuple[list[str], list[int]]:
    """The segment's characters, as ElevenLabs aligns them (its words, one space after
    each word that has one and after the last), and their N+1 boundaries in whole ms on
    the turn's timeline: character i spans [bounds[i], bounds[i+1]]. The first boundary
    is the segment's start and the last its end, so consecutive segments tile."""
    start, end = round(segment.start_ms), round(segment.end_ms)
    text = segment.text
    chars: list[str] = []
    bounds: list[int] = []
    at = 0
    words = segment.words
    for i, word in enumerate(words):
        pos = text.find(word.word, at)
        at = (pos if pos >= 0 else at) + len(word.word)
        spaced = i == len(words) - 1 or (at < len(text) and text[at].isspace())
        these = [*word.word, " "] if spaced else list(word.word)
        span = word.end_ms - word.start_ms
        for k, ch in enumerate(these):
            chars.append(ch)
            bounds.append(round(word.start_ms + span * k / len(these)))
    bounds.append(end)
    if bounds:
        bounds[0] = start
    for i in range(1, len(bounds)):  # rounding must not step back, nor pass the end
        bounds[i] = min(max(bounds[i], bounds[i - 1]), end)
    return chars, bounds


@dataclass
class Alignment:
    """Characters whose timing is known but not yet sent, and their boundaries (ms)."""

    chars: list[str] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)

    def add(self, segment: SpokenSegment) -> None:
        chars, bounds = char_times(segment)
        if not chars:
            return
        if self.bounds and bounds[0] == self.bounds[-1]:
            bounds = bounds[1:]
        else:  # the first pending segment (or one that does not follow on: keep its own)
            self.bounds = self.bounds[:-1] if self.bounds else []
        self.chars += chars
        self.bounds += bounds

    def take(self, relative: bool) -> dict[str, list[Any]] | None:
        """The pending characters as ElevenLabs' WebSocket alignment (times in ms from
        the context's start, or from the first pending character's start), or None."""
        if not self.chars:
            return None
        off = self.bounds[0] if relative else 0
        b = self.bounds
        aligned: dict[str, list[Any]] = {
            "chars": self.chars,
            "charStartTimesMs": [t - off for t in b[:-1]],
            "charDurationsMs": [b[i + 1] - b[i] for i in range(len(b) - 1)],
        }
        self.chars, self.bounds = [], []
        return aligned

    def take_seconds(self) -> dict[str, list[Any]] | None:
        """The HTTP with-timestamps shape: seconds from the request's first sample."""
        if not self.chars:
            return None
        b = self.bounds
        aligned: dict[str, list[Any]] = {
            "characters": self.chars,
            "character_start_times_seconds": [t / 1000 for t in b[:-1]],
            "character_end_times_seconds": [t / 1000 for t in b[1:]],
        }
        self.chars, self.bounds = [], []
        return aligned


# -- request parameters -----------------------------------------------------------------


def _bool(query: Mapping[str, str], name: str, default: bool) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise _invalid(f"{name} must be true or false")


def _seed(value: Any) -> int:
    if value is None or value == "":
        return 0
    try:
        seed = int(value)
    except (TypeError, ValueError):
        raise _invalid("seed must be an integer from 0 to 4294967295") from None
    if isinstance(value, bool | float) or not 0 <= seed <= 2**32 - 1:
        raise _invalid("seed must be an integer from 0 to 4294967295")
    return seed


def _language(code: Any) -> str:
    """ElevenLabs' language_code picks our text normalization where we have one for it;
    other languages are spoken with automatic normalization."""
    if code is None or code == "":
        return "auto"
    if not isinstance(code, str):
        raise _invalid("language_code must be a string")
    base = code.split("-")[0].lower()
    return base if base in LANGUAGES else "auto"


def _speed(voice_settings: Any) -> float:
    """`voice_settings.speed`; the other settings (stability, similarity_boost, style,
    use_speaker_boost) have no counterpart here and are ignored."""
    if voice_settings is None:
        return 1.0
    if not isinstance(voice_settings, dict):
        raise _invalid("voice_settings must be an object")
    speed = voice_settings.get("speed")
    if speed is None:
        return 1.0
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise _invalid("voice_settings.speed must be a number")
    if not 0.5 <= speed <= 2.0:
        raise _invalid(f"voice_settings.speed {speed} is outside what this server supports: 0.5-2")
    return float(speed)


@dataclass(frozen=True)
class StreamParams:
    """A socket's query string. model_id, enable_logging, enable_ssml_parsing,
    apply_text_normalization, apply_language_text_normalization and
    optimize_streaming_latency are accepted and ignored (one model; text is always
    normalized for the language)."""

    voice: str
    format: OutputFormat
    language: str = "auto"
    seed: int = 0
    inactivity_s: float = DEFAULT_INACTIVITY_S
    sync_alignment: bool = False
    auto_mode: bool = False

    @classmethod
    def parse(
        cls, host: SessionHost, principal: Principal, voice: str, query: Mapping[str, str]
    ) -> StreamParams:
        find_voice(host, principal, voice)  # unknown: refused before the upgrade
        fmt = parse_format(query.get("output_format") or DEFAULT_FORMAT)
        timeout = query.get("inactivity_timeout")
        inactivity = float(DEFAULT_INACTIVITY_S)
        if timeout:
            try:
                inactivity = float(timeout)
            except ValueError:
                raise _invalid("inactivity_timeout must be a number of seconds") from None
            if not 0 < inactivity <= MAX_INACTIVITY_S:
                raise _invalid(f"inactivity_timeout must be within 0 and {MAX_INACTIVITY_S}")
        return cls(
            voice,
            fmt,
            _language(query.get("language_code")),
            _seed(query.get("seed")),
            inactivity,
            _bool(query, "sync_alignment", False),
            _bool(query, "auto_mode", False),
        )


def http_error(error: ApiError) -> JSONResponse:
    """ElevenLabs' error body (`detail.status`, `detail.message`, which its SDK reads)
    with our stable code beside it."""
    body = {"detail": {"status": str(error.code), "message": error.message}, **error.body()}
    headers = {"Retry-After": "2"} if error.status in (429, 503) else None
    return JSONResponse(body, status_code=error.status, headers=headers)


# -- the sockets ------------------------------------------------------------------------


@dataclass
class Context:
    """What the socket keeps for one context beside its utterance."""

    encoder: AudioEncoder
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
            msg = json.loads(text)
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
        if _flag(msg, "close_socket"):
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
            raise _invalid("text must be a string")
        flush, close = _flag(msg, "flush"), _flag(msg, "close_context")
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
            raise _invalid("text must be a string")
        cid = DEFAULT_CONTEXT
        if text == "":  # end of input: speak it all, then isFinal, then the socket closes
            if cid in self.state:
                self.state[cid].flushed = True
                await self._close_context(cid)
            else:
                await self._end_socket(CloseCode.NORMAL, "end of input")
            return
        await self._text(cid, text, msg)
        if _flag(msg, "flush") and cid in self.contexts:
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
                options = SpeechOptions(
                    self.params.voice,
                    self.params.language,
                    _speed(msg.get("voice_settings")),
                    SamplingParams(seed=self.params.seed),
                    self.params.format.utterance_rate,
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

    async def send_error(self, context_id: str | None, error: ApiError) -> None:
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


def _flag(msg: dict[str, Any], name: str) -> bool:
    value = msg.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _invalid(f"{name} must be true or false")
    return value


# -- HTTP -------------------------------------------------------------------------------

# What a request body may carry. Beyond text: voice_settings.speed, language_code and seed
# count; the rest is accepted and ignored (one model; no request stitching, no
# pronunciation dictionaries).
BODY_FIELDS = {
    "text",
    "model_id",
    "voice_settings",
    "language_code",
    "seed",
    "previous_text",
    "next_text",
    "previous_request_ids",
    "next_request_ids",
    "apply_text_normalization",
    "apply_language_text_normalization",
    "pronunciation_dictionary_locators",
    "use_pvc_as_ivc",
}


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
        """A checked body and query, and the utterance speaking it (ApiError if not)."""
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise ApiError(ErrorCode.INVALID_JSON, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(ErrorCode.INVALID_MESSAGE, "the body must be a JSON object")
        unknown = sorted(set(body) - BODY_FIELDS)
        if unknown:
            raise _invalid(f"unknown field(s): {', '.join(unknown)}")
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _invalid("text must be a non-empty string")
        fmt = parse_format(request.query_params.get("output_format") or DEFAULT_FORMAT)
        options = SpeechOptions(
            request.path_params["voice_id"],
            _language(body.get("language_code")),
            _speed(body.get("voice_settings")),
            SamplingParams(seed=_seed(body.get("seed"))),
            fmt.utterance_rate,
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
        pieces = _pieces(utterance)
        try:  # the first audio before the status line: an early failure gets its status
            first = await anext(pieces, None)
        except ApiError as exc:
            utterance.close()
            return http_error(exc)
        encoder = fmt.encoder()

        async def audio() -> AsyncIterator[bytes]:
            try:
                if isinstance(first, np.ndarray):
                    yield encoder.encode(first)
                async for piece in pieces:
                    if isinstance(piece, np.ndarray) and (data := encoder.encode(piece)):
                        yield data
                if tail := encoder.finish():
                    yield tail
            except ApiError as exc:  # after the status line: all that is left is to stop
                log.warning("elevenlabs stream stopped: %s", exc.message)
            finally:
                utterance.close()

        return StreamingResponse(audio(), media_type=fmt.content_type)

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
            item = {
                "audio_base64": base64.b64encode(data).decode(),
                "alignment": aligned,
                "normalized_alignment": aligned,
            }
            return json.dumps(item).encode() + b"\n"

        async def lines() -> AsyncIterator[bytes]:
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

        return StreamingResponse(lines(), media_type="application/x-ndjson")


async def _pieces(utterance: Utterance) -> AsyncIterator[np.ndarray | SpokenSegment]:
    """The utterance's pieces, its audio cut to at most CHUNK_MS a piece."""
    step = utterance.options.sample_rate * CHUNK_MS // 1000
    async for piece in utterance.pieces():
        if isinstance(piece, np.ndarray):
            for i in range(0, len(piece), step):
                yield piece[i : i + step]
        else:
            yield piece


def elevenlabs_routes(host: SessionHost) -> list[BaseRoute]:
    return ElevenLabsApi(host).routes()
