"""WebRTC sessions (aiortc): the same session protocol as the WebSocket, another transport.

POST /v1/webrtc/offer   {"sdp": ..., "type": "offer"} -> {"sdp": ..., "type": "answer"}

The offer must hold one audio m-line and one data channel (m=application). Control is
the WebSocket protocol's JSON, over the data channel, run by the same SessionCore and
SessionRunner through the transport port; audio goes out on the audio track instead of as
binary messages. The session's output is pinned to pcm16 at 48 kHz so frames can be
handed to aiortc, which encodes them as Opus. Inbound audio goes to the runner's listener
(voice activity, barge-in).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import av
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc import sdp as aiortc_sdp
from aiortc.exceptions import InvalidStateError
from aiortc.mediastreams import MediaStreamError
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..audio.format import FRAME_MS
from ..auth.gate import ANONYMOUS, Principal, principal_of
from ..protocol.errors import CloseCode, ErrorCode
from ..protocol.json_text import parse_json
from ..protocol.messages import Format
from ..protocol.session import SendAudio, SessionCore, error_event
from ..session.port import SessionHost, Transport
from ..session.runner import SessionRunner
from .guard import CLOSING, RATE_MESSAGE, Deadlines, MessageGate, Verdict
from .webrtc_media import RATE, OutboundAudioTrack, mono_float, set_audio_prefetch

log = logging.getLogger(__name__)

# The track's format; a client's `format` setting is ignored on WebRTC (the codec and
# rate are negotiated in SDP instead).
PINNED_FORMAT = Format(codec="pcm16", sample_rate=RATE)


@dataclass(frozen=True)
class WebRtcConfig:
    max_body_bytes: int = 64 * 1024  # an SDP offer is a few KiB
    connect_timeout_s: float = 20.0  # from answer to connected, else the session is dropped
    track_buffer_frames: int = 10  # frames queued ahead of real time at most (200 ms)
    max_inbox: int = 256  # unprocessed control messages before a session is dropped
    ice_servers: tuple[str, ...] = ()  # none by default: aiortc's default is a public STUN
    # aiortc holds 4 frames (80 ms) of inbound audio to reorder packets; the server only
    # runs VAD on it, where a late packet matters less than 60 ms of barge-in latency.
    inbound_prefetch_frames: int = 1
    # Voice activity (`input.*`) and barge-in (`barge_in.*`) are session settings, used
    # the same way on both transports.


class OfferError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def parse_offer(body: bytes, max_bytes: int) -> RTCSessionDescription:
    """The offer in a POST body ({"sdp": ..., "type": "offer"}), checked before any network
    work: JSON, aiortc's SDP parser, one audio m-line and one data channel. Raises
    OfferError (with the code the client gets) for anything else."""
    if len(body) > max_bytes:
        raise OfferError("sdp_too_large", f"body larger than {max_bytes} bytes")
    try:
        obj = parse_json(body)
    except ValueError:
        raise OfferError("invalid_json", "body must be JSON: {sdp, type}") from None
    if not isinstance(obj, dict):
        raise OfferError("invalid_json", "body must be a JSON object: {sdp, type}")
    if obj.get("type") != "offer":
        raise OfferError("invalid_sdp", "'type' must be \"offer\"")
    sdp = obj.get("sdp")
    if not isinstance(sdp, str) or not sdp.strip():
        raise OfferError("invalid_sdp", "'sdp' must be a non-empty string")
    if not sdp.lstrip().startswith("v=0"):
        raise OfferError("invalid_sdp", "'sdp' is not an SDP session description")
    try:
        parsed = aiortc_sdp.SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser raises whatever it meets on junk
        raise OfferError("invalid_sdp", f"'sdp' does not parse: {exc!r}"[:300]) from None
    kinds = sorted(m.kind for m in parsed.media)
    if kinds != ["application", "audio"]:
        raise OfferError(
            "invalid_sdp",
            "the offer must hold exactly one audio m-line and one data channel "
            f"(m=application); it has: {', '.join(kinds) or 'none'}",
        )
    # What aiortc needs but does not check itself: without it, its connect task fails
    # after we answered (an ERROR with a traceback), or closing the peer connection fails.
    mids = [m.rtp.muxId for m in parsed.media]
    if not all(mids) or len(set(mids)) != len(mids):
        raise OfferError("invalid_sdp", "each m-line needs an a=mid of its own")
    bundles = [g for g in parsed.group if g.semantic == "BUNDLE"]
    if len(bundles) > 1 or any(not {str(i) for i in g.items} <= set(mids) for g in bundles):
        raise OfferError("invalid_sdp", "one a=group:BUNDLE at most, of the offer's mids")
    for m in parsed.media:
        if not (m.ice and m.ice.usernameFragment and m.ice.password):
            raise OfferError("invalid_sdp", f"m={m.kind} has no a=ice-ufrag and a=ice-pwd")
        if not (m.dtls and m.dtls.fingerprints):
            raise OfferError("invalid_sdp", f"m={m.kind} has no a=fingerprint and a=setup")
    return RTCSessionDescription(sdp=sdp, type="offer")


# -- sessions ---------------------------------------------------------------------------


class WebRtcTransport(Transport):
    """The port over a peer connection: events on the data channel, audio on the track."""

    name = "webrtc"
    pinned_format = PINNED_FORMAT

    def __init__(self, track: OutboundAudioTrack, end: Callable[[], Awaitable[None]]) -> None:
        self.track = track
        self.channel: RTCDataChannel | None = None
        self._end = end  # the session's close

    @property
    def open(self) -> bool:
        return self.channel is not None and self.channel.readyState == "open"

    async def send_event(self, event: dict[str, Any]) -> None:
        if self.channel is None or not self.open:
            raise ConnectionError("data channel is not open")
        self.channel.send(json.dumps(event))

    async def send_audio(self, frame: SendAudio) -> None:
        await self.track.put(frame.num, frame.payload)

    async def drop_turn(self, num: int) -> None:
        self.track.drop_turn(num)

    async def close(self, code: int, reason: str) -> None:
        """A peer connection has no close code, so the data channel's last message says
        what a WebSocket's close frame would (`session.closing`): a page then tells a
        restart from a lost connection even when its audio stall check fires before the
        channel's close arrives (a busy machine)."""
        with contextlib.suppress(ConnectionError):
            await self.send_event({"type": "session.closing", "code": code, "reason": reason})
        await self._end()

    def sent_ms(self, num: int) -> int | None:
        """What the track has emitted toward the peer (the rest of the lead is dropped)."""
        return self.track.played.get(num, 0) * FRAME_MS


class WebRtcSession:
    def __init__(
        self, gateway: WebRtcGateway, pc: RTCPeerConnection, principal: Principal = ANONYMOUS
    ) -> None:
        self.gateway = gateway
        self.tenant = principal.tenant
        host = gateway.host
        self.config = gateway.config
        self.pc = pc
        self.id = uuid.uuid4().hex[:16]
        self.track = OutboundAudioTrack(self.config.track_buffer_frames, on_sync=self._on_sync)
        self.transport = WebRtcTransport(self.track, self.close)
        self.core = SessionCore(
            self.id,
            host.catalog_for(principal),
            host.limits,
            self.transport.pinned_format,
            budget=host.admission.tenant(principal.tenant),
        )
        self.runner = SessionRunner(
            self.core, host.engine, self.transport, host.playout, host.admission
        )
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue(self.config.max_inbox)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)
        self._spawn(self._control())
        self._spawn(self._connect_deadline())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_sync(self, turn: int, offset_ms: int) -> None:
        self.send_event({"type": "audio.sync", "turn": turn, "offset_ms": offset_ms})

    def send_event(self, event: dict[str, Any]) -> None:
        """Best effort: an event with no open channel to carry it is dropped."""
        if self.transport.channel is not None and self.transport.open:
            self.transport.channel.send(json.dumps(event))

    # -- peer connection events -----------------------------------------------------------

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if self.transport.channel is not None:  # one control channel per session
            return
        self.transport.channel = channel
        loop = asyncio.get_running_loop()
        # session.start and idleness count from here: before it, connect_timeout_s does
        deadlines = Deadlines(self.gateway.host.guard, loop.time())
        self._spawn(self._watch(deadlines))

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            deadlines.heard(loop.time())
            try:
                self._inbox.put_nowait(message)
            except asyncio.QueueFull:
                self._flooded(f"{self._inbox.maxsize} unread")

        @channel.on("close")
        def on_close() -> None:
            self.close_soon()  # without control the session is useless

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._listen(track))

    def _on_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.close_soon()

    async def _connect_deadline(self) -> None:
        """Connected, with the control channel open (session.start's own timeout counts
        from that), by `connect_timeout_s`: else the session goes."""
        await asyncio.sleep(self.config.connect_timeout_s)
        missing = (
            "connection"
            if self.pc.connectionState != "connected"
            else "control channel"
            if self.transport.channel is None
            else None
        )
        if missing is not None:
            log.info("session %s: no %s after %ss", self.id, missing, self.config.connect_timeout_s)
            self._count_closed(ErrorCode.CONNECT_TIMEOUT)
            self.close_soon()

    def _flooded(self, why: str) -> None:
        log.warning("session %s: control messages flooded in (%s); closing", self.id, why)
        self._count_closed(ErrorCode.RATE_LIMITED)
        self.close_soon()

    def _count_closed(self, code: ErrorCode) -> None:
        """The server ends this session on its own (voiceagent_sessions_closed_total)."""
        if not self.closed.is_set() and self._closing is None:
            self.gateway.host.engine.metrics.closed.labels(str(code)).inc()

    async def _watch(self, deadlines: Deadlines) -> None:
        """Close the session once it has waited too long for session.start, or idle (no
        control message and no live turn; the microphone's audio is not a message)."""
        loop = asyncio.get_running_loop()
        while True:
            deadline = deadlines.next(loop.time(), self.core.started, self.runner.idle_since)
            if deadline is None:
                return  # started, and no idle timeout: nothing more to watch
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            code = deadlines.expired(loop.time(), self.core.started, self.runner.idle_since)
            if code is not None:
                break
        log.info("session %s closed: %s", self.id, code)
        self._count_closed(code)
        self.gateway.host.engine.metrics.errors.labels(str(code)).inc()
        with contextlib.suppress(ConnectionError):
            await self.transport.send_event(error_event(code, CLOSING[code]))
        await self.transport.close(CloseCode.POLICY_VIOLATION, str(code))

    async def _control(self) -> None:
        """The control messages, acted on no faster than the guard's message rate: a
        flood fills the inbox (a full one drops the session) or lasts `flood_close_s`."""
        gate = MessageGate(self.gateway.host.guard)
        while True:
            message = await self._inbox.get()
            verdict = await gate.pace()
            if verdict is Verdict.CLOSE:
                self._flooded("held back too long")
                return
            if verdict is Verdict.WARN:
                self.send_event(error_event(ErrorCode.RATE_LIMITED, RATE_MESSAGE))
            try:
                if isinstance(message, str):
                    await self.runner.on_text(message)
                else:
                    await self.runner.on_bytes(message)
            except ConnectionError:
                self.close_soon()
                return
            except Exception:
                log.exception("session %s failed", self.id)
                self.close_soon()
                return

    async def _listen(self, track: MediaStreamTrack) -> None:
        """Inbound audio -> VAD -> events on the data channel. Reading also keeps aiortc's
        unbounded receive queue drained."""
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, av.AudioFrame) or not self.transport.open:
                continue  # nowhere to send speech events yet
            try:
                await self.runner.hear(mono_float(frame), frame.sample_rate)
            except ConnectionError:
                self.close_soon()

    # -- teardown -------------------------------------------------------------------------

    def close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self.close())

    async def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()  # first: no second close, and the slot is released exactly once
        self.gateway.release(self)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        with contextlib.suppress(Exception):
            await self.runner.close()
        self.track.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()
        log.info("session %s closed", self.id)


# -- signaling --------------------------------------------------------------------------


def quiet_close_race(loop: asyncio.AbstractEventLoop) -> None:
    """aiortc runs each connection attempt in a task nobody awaits. A session that closes
    its peer connection while the attempt still runs (a peer that never connects, closed
    at the connect deadline) makes the attempt fail with InvalidStateError ("...
    transport is closed"; aiortc checks for a close only before it starts), and asyncio
    logs that as an ERROR with a traceback. It is the close we asked for: logged at INFO
    instead. Any other exception no task retrieved goes to the loop's handler as before."""
    previous = loop.get_exception_handler()
    if getattr(previous, "quiets_aiortc", False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        task = context.get("future")
        coro = task.get_coro() if isinstance(task, asyncio.Task) else None
        if isinstance(context.get("exception"), InvalidStateError) and (
            getattr(coro, "__qualname__", "") == "RTCPeerConnection.__connect"
        ):
            log.info("a WebRTC connection attempt ended with its session: %s", context["exception"])
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handler.quiets_aiortc = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)


class WebRtcGateway:
    """Accepts offers and owns the WebRTC sessions of one server."""

    def __init__(self, host: SessionHost, config: WebRtcConfig | None = None) -> None:
        self.host = host
        self.config = config or WebRtcConfig()
        self.sessions: set[WebRtcSession] = set()

    def release(self, session: WebRtcSession) -> None:
        if session in self.sessions:
            self.sessions.discard(session)
            self.host.admission.release(WebRtcTransport.name, session.tenant)

    async def close_all(self) -> None:
        for session in list(self.sessions):
            await session.close()

    async def offer(self, request: Request) -> JSONResponse:
        quiet_close_race(asyncio.get_running_loop())  # once per loop
        now = asyncio.get_running_loop().time()
        if not self.host.connections.admit(request.client.host if request.client else None, now):
            self.host.engine.metrics.refused.labels(str(ErrorCode.RATE_LIMITED)).inc()
            message = "too many new connections from this address"
            response = self._error(OfferError(str(ErrorCode.RATE_LIMITED), message, 429))
            response.headers["Retry-After"] = "1"
            return response
        try:
            offer = await self._read_offer(request)
        except OfferError as err:
            return self._error(err)
        # Take the slot before the first await, so concurrent offers cannot overshoot.
        principal = principal_of(request)
        refusal = self.host.admission.admit(WebRtcTransport.name, principal.tenant)
        if refusal is not None:
            response = self._error(OfferError(str(refusal.code), refusal.message, 503))
            response.headers["Retry-After"] = str(refusal.retry_after_s)
            return response
        ice = [RTCIceServer(url) for url in self.config.ice_servers]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        session: WebRtcSession | None = None
        try:
            session = WebRtcSession(self, pc, principal)
            self.sessions.add(session)
            answer = await self._negotiate(session, offer)
        except OfferError as err:
            await self._abandon(session, pc, principal.tenant)
            return self._error(err)
        except Exception as exc:
            log.exception("answering a WebRTC offer failed")
            await self._abandon(session, pc, principal.tenant)
            return self._error(
                OfferError("internal_error", f"could not answer the offer: {exc}", 500)
            )
        return JSONResponse({"sdp": answer.sdp, "type": answer.type, "session_id": session.id})

    def _error(self, err: OfferError) -> JSONResponse:
        self.host.engine.metrics.errors.labels(err.code).inc()
        return JSONResponse(
            {"type": "error", "code": err.code, "message": err.message}, status_code=err.status
        )

    async def _abandon(
        self, session: WebRtcSession | None, pc: RTCPeerConnection, tenant: str
    ) -> None:
        if session is not None:
            await session.close()
        else:
            self.host.admission.release(WebRtcTransport.name, tenant)
            with contextlib.suppress(Exception):
                await pc.close()

    async def _read_offer(self, request: Request) -> RTCSessionDescription:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.config.max_body_bytes:
                raise OfferError(
                    "sdp_too_large", f"body larger than {self.config.max_body_bytes} bytes"
                )
        return parse_offer(bytes(body), self.config.max_body_bytes)

    async def _negotiate(
        self, session: WebRtcSession, offer: RTCSessionDescription
    ) -> RTCSessionDescription:
        pc = session.pc
        try:
            await pc.setRemoteDescription(offer)
        except Exception as exc:
            raise OfferError("invalid_sdp", f"offer rejected: {exc!r}"[:300]) from None
        if not set_audio_prefetch(pc, self.config.inbound_prefetch_frames):
            log.warning("could not shorten aiortc's inbound jitter buffer; barge-in is slower")
        audio = next(t for t in pc.getTransceivers() if t.kind == "audio")
        opus = [
            c
            for c in RTCRtpSender.getCapabilities("audio").codecs
            if c.mimeType.lower() == "audio/opus"
        ]
        audio.setCodecPreferences(opus)
        pc.addTrack(session.track)
        try:
            answer = await pc.createAnswer()
        except Exception as exc:  # e.g. no Opus in the offer
            raise OfferError("invalid_sdp", f"cannot answer the offer: {exc!r}"[:300]) from None
        await pc.setLocalDescription(answer)  # gathers ICE candidates (no trickle)
        local = pc.localDescription
        if not any(
            m.kind == "audio" and any(c.mimeType.lower() == "audio/opus" for c in m.rtp.codecs)
            for m in aiortc_sdp.SessionDescription.parse(local.sdp).media
        ):
            raise OfferError("invalid_sdp", "the offer has no Opus at 48 kHz for the audio")
        return local
