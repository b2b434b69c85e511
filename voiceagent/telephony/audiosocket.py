"""Asterisk AudioSocket: Asterisk connects to our TCP port, sends the call's UUID, then
the caller's audio as signed-linear packets (audiosocket_frames.py).

Asterisk writes each packet we send straight to the channel, without a buffer, so we
pace our own frames: a sender emits one 20 ms packet per 20 ms on an absolute clock, and
what it has emitted is what the caller heard. A cancel drops the frames not yet emitted.
The UUID is the bot's token; settings come from the bot (session.update).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator

from ..audio.fade import fade_out
from ..audio.format import FRAME_MS
from ..protocol.errors import ErrorCode
from ..protocol.session import SendAudio
from ..transport.guard import GuardConfig, MessageGate, Verdict
from . import audiosocket_frames as wire
from .call import CallHost, CallRefused, CallTransport, run_call
from .events import CallerAudio, CallInfo, CarrierEvent, Dtmf, Invalid, Stopped

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
READ_BYTES = 65536
KEPT_TURNS = 16  # turns whose frames written are remembered (turns play one by one)


class AudioSocketTransport(CallTransport):
    def __init__(
        self, writer: asyncio.StreamWriter, info: CallInfo, send_timeout_s: float = 10.0
    ) -> None:
        super().__init__(info)
        self.writer = writer
        self.send_timeout_s = send_timeout_s
        self._queue: deque[tuple[int, bytes]] = deque()
        self._emitted: dict[int, int] = {}  # frames of each turn written to Asterisk
        self._ready = asyncio.Event()
        self._sender = asyncio.get_running_loop().create_task(self._send_paced())

    async def send_audio(self, frame: SendAudio) -> None:
        self._queue.append((frame.num, frame.payload))
        self._ready.set()

    async def drop_turn(self, num: int) -> None:
        kept = deque(item for item in self._queue if item[0] != num)
        if self._queue and self._queue[0][0] == num and self._emitted.get(num):
            # it is playing: its next frame fades out instead of a step to silence
            kept.appendleft((num, fade_out(self._queue[0][1], self.info.sample_rate)))
        self._queue = kept

    def sent_ms(self, num: int) -> int | None:
        return self._emitted.get(num, 0) * FRAME_MS

    async def _send_paced(self) -> None:
        """One packet per 20 ms; the clock restarts after the queue ran empty."""
        period = FRAME_MS / 1000
        with contextlib.suppress(ConnectionError):
            while True:
                await self._ready.wait()
                start, k = time.monotonic(), 0
                while self._queue:
                    num, payload = self._queue.popleft()
                    self.writer.write(wire.encode_audio(payload, self.info.sample_rate))
                    await self._drain()
                    if num not in self._emitted:  # a new turn: forget the long-finished ones
                        for old in [n for n in self._emitted if n < num - KEPT_TURNS]:
                            del self._emitted[old]
                    self._emitted[num] = self._emitted.get(num, 0) + 1
                    k += 1
                    await asyncio.sleep(max(0.0, start + k * period - time.monotonic()))
                self._ready.clear()

    async def _drain(self) -> None:
        """Wait while Asterisk is behind; one that stops reading for send_timeout_s ends
        the call (its frames would pile up here, counted as heard)."""
        try:
            async with asyncio.timeout(self.send_timeout_s):
                await self.writer.drain()
        except TimeoutError:
            log.warning("call %s: Asterisk stopped reading; ending the call", self.info.call_id)
            self.writer.close()
            raise ConnectionError("Asterisk stopped reading") from None

    async def hangup(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.write(wire.encode_hangup())
            await self.writer.drain()
            self.writer.close()

    async def stop_sender(self) -> None:
        self._sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sender


async def _packets(
    reader: asyncio.StreamReader, decoder: wire.AudioSocketDecoder, guard: GuardConfig
) -> AsyncGenerator[wire.Packet | Stopped, None]:
    """Asterisk's packets, read no faster than the guard's message rate (the rest waits
    in the network), then Stopped."""
    gate = MessageGate(guard)
    while True:
        try:
            data = await reader.read(READ_BYTES)
        except ConnectionError:
            data = b""
        if not data:
            yield Stopped("disconnected")  # Asterisk hangs up by closing the socket
            return
        try:
            packets = decoder.feed(data)
        except wire.AudioSocketError as exc:
            log.warning("audiosocket stream broken: %s", exc)
            yield Stopped("error")  # the framing is lost: nothing after it can be read
            return
        for packet in packets:
            if await gate.pace() is Verdict.CLOSE:
                yield Stopped(str(ErrorCode.RATE_LIMITED))
                return
            yield packet


async def _events(
    packets: AsyncGenerator[wire.Packet | Stopped, None], first_audio: wire.Packet
) -> AsyncGenerator[CarrierEvent, None]:
    rate = first_audio.sample_rate
    yield packet_event(first_audio, rate)
    async for packet in packets:
        event = packet if isinstance(packet, Stopped) else packet_event(packet, rate)
        yield event
        if isinstance(event, Stopped):
            return


def packet_event(packet: wire.Packet, sample_rate: int) -> CarrierEvent:
    """What a packet from Asterisk tells a call whose audio is at `sample_rate` (the rate
    of its first audio packet)."""
    if packet.is_audio:
        if len(packet.payload) % 2:
            return Invalid(f"{len(packet.payload)} bytes of 16-bit audio")
        if packet.sample_rate != sample_rate:
            return Invalid(f"{packet.sample_rate} Hz audio in a {sample_rate} Hz call")
        return CallerAudio(packet.payload)
    if packet.kind == wire.Kind.DTMF:
        try:
            return Dtmf(packet.digit)
        except ValueError as exc:
            return Invalid(str(exc))
    if packet.kind == wire.Kind.HANGUP:
        return Stopped("hangup")
    return Invalid(f"unexpected {packet.kind.name} packet")


async def handle_audiosocket(
    host: CallHost, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """One AudioSocket connection: UUID first, the first audio tells the rate."""
    packets = _packets(reader, wire.AudioSocketDecoder(wire.FROM_ASTERISK), host.guard)
    call_id, first_audio = "", None
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            async for packet in packets:
                if isinstance(packet, Stopped):
                    break
                if packet.kind == wire.Kind.UUID and not call_id:
                    call_id = packet.uuid
                elif packet.is_audio and call_id:
                    first_audio = packet
                    break
                elif not call_id:
                    log.warning("audiosocket: %s before the UUID", packet.kind.name)
                    break
    except TimeoutError:
        log.warning("audiosocket: no UUID and audio in %.0f s", START_TIMEOUT_S)
    if first_audio is None:
        writer.close()
        await packets.aclose()
        return
    # The UUID is the call's token, the only key to it: logs and the bot's `call` object
    # name the call by a digest of it instead.
    public_id = "as-" + hashlib.sha256(call_id.encode()).hexdigest()[:16]
    info = CallInfo(
        "audiosocket", public_id, public_id, "pcm16", first_audio.sample_rate, {"token": call_id}
    )
    transport = AudioSocketTransport(writer, info, host.guard.send_timeout_s)
    try:
        await run_call(host, transport, _events(packets, first_audio))
    except CallRefused as refused:
        log.warning("audiosocket call %s refused: %s", public_id, refused)
        await transport.hangup()
    finally:
        await transport.stop_sender()
        await packets.aclose()
        writer.close()


async def serve_audiosocket(host: CallHost, bind: str, port: int) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handle_audiosocket(host, reader, writer)
        except Exception:
            log.exception("audiosocket connection failed")

    server = await asyncio.start_server(handle, bind, port)
    log.info("AudioSocket listening on %s:%d", bind, port)
    return server
