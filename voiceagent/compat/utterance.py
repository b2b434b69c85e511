"""One utterance of a drop-in API (OpenAI, Cartesia, ElevenLabs, /v1/tts): a turn with
no real-time pacing. Its audio is handed out as fast as it is synthesized (those
clients play it out themselves), and its words' timing as soon as it is known.

An `Utterance` holds one of the server's live-turn slots from creation to `close`, and
counts in the same metrics as a session's turn, under the API's name as transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Send

from ..audio.format import FRAME_MS, MODEL_RATE
from ..auth.gate import Principal
from ..model.contract import Voice
from ..model.sampling import SamplingParams
from ..pipeline.turn import FrameFormat, OutputItem, Turn, TurnFailed, TurnSettings
from ..protocol.errors import ErrorCode
from ..protocol.json_text import parse_json
from ..session.port import SessionHost
from ..text.timing import SpokenSegment
from ..transport.http_body import BodyTooLarge, read_body

log = logging.getLogger(__name__)

# Audio made ahead of a slow reader at most: beyond it synthesis waits (as a session's
# turn does), so a client that stops reading costs no compute and little memory.
MAX_AHEAD_MS = 10_000

STATUS = {  # the HTTP status of each refusal an API may answer with
    ErrorCode.UNKNOWN_VOICE: 400,
    ErrorCode.INVALID_PARAMETER: 400,
    ErrorCode.INVALID_MESSAGE: 400,
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.TEXT_TOO_LONG: 400,
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.QUOTA_EXCEEDED: 429,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.SERVER_BUSY: 503,
    ErrorCode.TOO_MANY_SESSIONS: 503,
    ErrorCode.SERVER_DRAINING: 503,
    ErrorCode.ENGINE_UNAVAILABLE: 503,
    ErrorCode.SYNTHESIS_FAILED: 500,
    ErrorCode.INTERNAL_ERROR: 500,
}


# A request body's size at most: the longest text an API takes (ElevenLabs', 40,000
# characters, in UTF-8 and JSON escapes) fits many times over.
MAX_JSON_BODY_BYTES = 1 << 20


async def json_body(request: Request) -> Any:
    """A request's JSON body, read no further than MAX_JSON_BODY_BYTES (ApiError if it
    is larger or is not JSON)."""
    try:
        return parse_json(await read_body(request, MAX_JSON_BODY_BYTES))
    except BodyTooLarge as exc:
        raise ApiError(ErrorCode.MESSAGE_TOO_LARGE, str(exc)) from None
    except ValueError:
        raise ApiError(ErrorCode.INVALID_JSON, "the body is not JSON") from None


class Encoder(Protocol):
    """One utterance's float32 PCM -> the bytes of an API's output format, in stream
    order; `finish` returns what is left at the end (audio/containers.py's encoders are
    ones)."""

    def encode(self, pcm: np.ndarray) -> bytes: ...

    def finish(self) -> bytes: ...


class ApiError(Exception):
    """A refusal with a stable code, as each API reports it (JSON body, error message)."""

    def __init__(self, code: ErrorCode, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS.get(code, 400)
        self.counted = False  # in errors_total already (a failed utterance counts its own)

    def body(self) -> dict[str, str]:
        return {"type": "error", "code": str(self.code), "message": self.message}


# What a request may set that a role has a default for.
SETTABLE = frozenset({"language", "speed", "temperature", "top_k", "top_p", "seed"})


@dataclass(frozen=True)
class SpeechOptions:
    voice: str  # as the caller names it (a tenant's own voice shadows a shared one)
    language: str = "auto"
    speed: float = 1.0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    sample_rate: int = MODEL_RATE  # of the PCM handed out
    # What the request set itself (of SETTABLE); where `voice` names a role, its
    # defaults fill in the rest
    given: frozenset[str] = SETTABLE


def find_voice(host: SessionHost, principal: Principal, name: str) -> Voice:
    """The voice a caller names (a voice, or a role: its voice)."""
    catalog = host.catalog_for(principal)
    voice = host.engine.model.voices.get(catalog.voice_key(name))
    if name not in catalog.names or voice is None:
        shown = ", ".join(sorted(catalog.names)[:20]) or "none"
        raise ApiError(ErrorCode.UNKNOWN_VOICE, f"unknown voice {name[:80]!r}; available: {shown}")
    return voice


def role_defaults(host: SessionHost, principal: Principal, name: str) -> dict[str, Any]:
    """The defaults of the role `name` (language, speed, sampling; {}: not a role)."""
    role = host.catalog_for(principal).roles.get(name)
    return {} if role is None else role.defaults


def with_defaults(options: SpeechOptions, defaults: dict[str, Any]) -> SpeechOptions:
    """`options` with a role's defaults for what the request did not set itself."""
    given = options.given
    sampling = {k: v for k, v in defaults.get("sampling", {}).items() if k not in given}
    plain = {k: defaults[k] for k in ("language", "speed") if k in defaults and k not in given}
    return replace(options, sampling=replace(options.sampling, **sampling), **plain)


class Utterance:
    def __init__(
        self,
        host: SessionHost,
        principal: Principal,
        options: SpeechOptions,
        api: str,
        turn_id: str | None = None,
        voice: Voice | None = None,
        slot: bool = True,
    ) -> None:
        """Raises ApiError when the voice is unknown, no live-turn slot is free or the
        server is draining.
        `voice`: one made for this request alone (else `options.voice` names it).
        `slot`: False where the caller holds the live-turn slot itself (one for all
        the flush groups of a Cartesia context)."""
        self.host = host
        self.api = api  # the metrics' transport label: "openai", "cartesia", ...
        self.tenant = principal.tenant
        if voice is None:  # a voice or a role, by name: a role's defaults apply
            voice = find_voice(host, principal, options.voice)
            options = with_defaults(options, role_defaults(host, principal, options.voice))
        self.options = options
        if not 0.5 <= options.speed <= 2.0:
            raise ApiError(ErrorCode.INVALID_PARAMETER, "speed must be within 0.5 and 2.0")
        if slot and (refusal := host.admission.admit_request(self.tenant)) is not None:
            raise ApiError(refusal.code, refusal.message)
        self._slot = slot
        self.chars = 0
        self._closed = False
        self._outcome = "cancelled"  # unless it ends otherwise
        self._code: ErrorCode | None = None  # the error a failed one ended with
        self.turn = Turn(
            turn_id or uuid.uuid4().hex,
            TurnSettings(
                voice,
                options.sampling,
                options.speed,
                FrameFormat(options.sample_rate),
                options.language,
            ),
            host.engine,
            schedule=host.playout.schedule,
            max_segment_tokens=host.playout.max_segment_tokens,
            max_output_frames=MAX_AHEAD_MS // FRAME_MS,
        )
        self.turn.start()
        self.first_audio: float | None = None  # monotonic time the first audio left
        self.on_close: list[Callable[[], None]] = []  # run once, when it is closed

    # -- text in --------------------------------------------------------------------------

    def push(self, text: str) -> None:
        """More text of this utterance; raises ApiError beyond the per-turn or the
        tenant's character limit (nothing of `text` is taken then)."""
        limit = self.host.limits.max_text_chars
        if self.chars + len(text) > limit:
            raise self._failed(
                ApiError(ErrorCode.TEXT_TOO_LONG, f"an utterance takes at most {limit} characters")
            )
        over = self.host.admission.tenant(self.tenant).take_chars(len(text))
        if over is not None:
            raise self._failed(ApiError(ErrorCode.QUOTA_EXCEEDED, over))
        self.chars += len(text)
        self.turn.push_text(text)

    def flush(self) -> None:
        """Speak the text buffered so far now, though no sentence has ended."""
        self.turn.flush_text()

    def end(self) -> None:
        self.turn.end_text()

    # -- audio out ------------------------------------------------------------------------

    async def pieces(self) -> AsyncIterator[np.ndarray | SpokenSegment]:
        """PCM (float32 mono at `options.sample_rate`: every frame that is ready, as one
        array) and segment timing, in order, until the turn ends. Raises ApiError when
        synthesis fails."""
        out = self.turn.output
        taken_from = time.monotonic()  # its consumer takes its audio from now on
        while True:
            item: OutputItem | bool = await out.get()
            frames: list[np.ndarray] = []
            while isinstance(item, np.ndarray):
                frames.append(item)
                item = out.get_nowait() if not out.empty() else False
            if frames:
                if self.first_audio is None:
                    self.first_audio = time.monotonic()
                    ready = self.turn.stats.could_be_heard(taken_from)
                    self.host.engine.metrics.ttfa.labels(self.api).observe(self.first_audio - ready)
                yield np.concatenate(frames)
            if item is False:  # nothing more ready yet
                continue
            if item is None:
                self._outcome = "done"
                return
            if isinstance(item, TurnFailed):
                raise self._failed(ApiError(ErrorCode(item.code), str(item)))
            assert isinstance(item, SpokenSegment)
            yield item

    async def pcm(self) -> AsyncIterator[np.ndarray]:
        """The audio alone."""
        async for piece in self.pieces():
            if isinstance(piece, np.ndarray):
                yield piece

    # -- end ------------------------------------------------------------------------------

    def _failed(self, error: ApiError) -> ApiError:
        """`error` ends this utterance: it is counted and logged as failed, with its code."""
        self._outcome, self._code = "failed", error.code
        self.host.engine.metrics.errors.labels(str(error.code)).inc()
        error.counted = True
        return error

    def close(self) -> None:
        """Stop all work now (a cancel, a client gone) or after the end. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.turn.close()
        if self._slot:
            self.host.admission.turn_ended()
        for hook in self.on_close:
            hook()
        metrics, stats = self.host.engine.metrics, self.turn.stats
        metrics.turns.labels(self.api, self._outcome).inc()
        if self._outcome == "done":
            metrics.audio_seconds.labels(self.api).inc(stats.audio_ms / 1000)
            if stats.rtf is not None:
                metrics.rtf.observe(stats.rtf)
        # the one summary line per turn, as sessions write it (docs/operations.md)
        fields = {
            "turn_id": self.turn.id,
            "outcome": self._outcome,
            "transport": self.api,
            "ttfa_ms": None
            if self.first_audio is None
            else round((self.first_audio - stats.created) * 1000, 1),
            "audio_s": round(stats.audio_ms / 1000, 3),
            "rtf": stats.rtf,
            "code": None if self._code is None else str(self._code),
        }
        log.info("turn.end", extra={k: v for k, v in fields.items() if v is not None})


async def streamed(
    utterance: Utterance,
    encoder: Encoder,
    media_type: str,
    refuse: Callable[[ApiError], Response],
    headers: dict[str, str] | None = None,
    failed: Callable[[ApiError], bytes] | None = None,
    gain: float = 1.0,
) -> Response:
    """The utterance's audio as an HTTP response, encoded and sent as it is made. The
    status line waits for the first audio, so a turn that fails early (the LM server is
    down) still gets its own status (`refuse` makes that response); a failure after it
    can only end the body early (after `failed`'s bytes). The utterance is closed when
    the body ends, whichever way (a client that hangs up stops the synthesis)."""
    audio = utterance.pcm()
    try:
        first = await anext(audio, None)
    except ApiError as exc:
        utterance.close()
        return refuse(exc)

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            if first is not None:
                yield encoder.encode(first * gain if gain != 1.0 else first)
            async for pcm in audio:
                if data := encoder.encode(pcm * gain if gain != 1.0 else pcm):
                    yield data
            if tail := encoder.finish():
                yield tail
        except ApiError as exc:
            log.warning("%s audio stopped: %s", utterance.api, exc.message)
            if failed is not None:
                yield failed(exc)
        finally:
            utterance.close()

    return WatchedStream(body(), utterance.host, media_type=media_type, headers=headers)


class WatchedStream(StreamingResponse):
    """A body whose reader must keep reading: one that stops for `send_timeout_s` (its
    buffers full) loses the rest of its audio as a stalled socket does, so it holds no
    live-turn slot and no synthesis. The connection itself stays until the client reads
    or goes (the end of the body cannot be sent before)."""

    def __init__(
        self, content: AsyncGenerator[bytes, None], host: SessionHost, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._body = content
        self._host = host

    async def stream_response(self, send: Send) -> None:
        async def watched(message: Message) -> None:
            if not message.get("more_body"):  # the start, or the end once the body is over
                await send(message)
                return
            try:
                async with asyncio.timeout(self._host.guard.send_timeout_s):
                    await send(message)  # (written at once; what times out is the wait)
            except TimeoutError:
                log.info("a client stopped reading its audio: the rest is dropped")
                self._host.engine.metrics.closed.labels(str(ErrorCode.SLOW_CONSUMER)).inc()
                await self._body.aclose()  # the utterance closes: its slot is free

        await super().stream_response(watched)
