"""The bot's side of a call: it attaches to the call's session with the token it passed
to the carrier (`session.attach`), then speaks the normal JSON protocol. Events for a
bot not (yet) attached are kept, a bounded number."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from typing import Any

import numpy as np
from starlette.websockets import WebSocket

from ..audio.format import FRAME_MS, frame_samples
from ..audio.resample import StreamResampler
from ..protocol.errors import CloseCode
from ..protocol.frames import AudioFrame, pack
from ..protocol.json_text import parse_json

log = logging.getLogger(__name__)

CALLER_AUDIO_RATES = (0, 8000, 16000)
MIN_TOKEN_CHARS = 16  # the token is the only key to a call: it must not be guessable
CALLER_TURN = 0  # caller audio goes to the bot as binary frames of "turn 0"


class BotLink:
    """Where a call's events go: the attached bot's WebSocket, else a bounded backlog."""

    def __init__(self, backlog: int = 512, send_timeout_s: float = 10.0) -> None:
        self.ws: WebSocket | None = None
        # a bot that stops reading is let go after this long (the call's loop must go on:
        # the carrier's hang-up and media wait behind a blocked send)
        self.send_timeout_s = send_timeout_s
        self._failed: WebSocket | None = None  # the bot a send failed to, until it detaches
        self._backlog: deque[dict[str, Any]] = deque(maxlen=backlog)
        self._dropped = 0
        self._caller_rate = 0
        self._resampler: StreamResampler | None = None
        self._pending = b""  # resampled caller audio short of a whole frame
        self._caller_seq = 0
        self._caller_ms = 0.0  # caller audio since the call began, bot or no bot

    @property
    def attached(self) -> bool:
        return self.ws is not None

    async def send(self, event: dict[str, Any]) -> None:
        if self.ws is not None:
            try:
                async with asyncio.timeout(self.send_timeout_s):
                    await self.ws.send_text(json.dumps(event))
                return
            except Exception:  # gone, or stopped reading: keep the event for the next bot
                self._failed, self.ws = self.ws, None
        if event.get("type") == "audio.levels":
            return  # lip-sync levels are worthless later
        if len(self._backlog) == self._backlog.maxlen:
            self._dropped += 1
        self._backlog.append(event)

    async def attach(self, ws: WebSocket, hello: dict[str, Any], caller_rate: int) -> None:
        self.ws, self._failed = ws, None
        self._caller_rate = caller_rate
        self._resampler = None
        await ws.send_text(json.dumps(hello))
        if self._dropped:
            log.warning("%d events for the bot were dropped while none was attached", self._dropped)
            self._dropped = 0
        while self._backlog and self.ws is ws:
            await ws.send_text(json.dumps(self._backlog.popleft()))

    def detach(self, ws: WebSocket) -> bool:
        """True when `ws` was the attached bot (or was, until a send to it failed, and no
        other has attached since): the call has no bot now."""
        if ws is self.ws:
            self.ws = None
            return True
        if ws is self._failed:
            self._failed = None
            return self.ws is None
        return False

    async def caller_audio(self, pcm: bytes, rate: int) -> None:
        """The caller's voice, for the bot's recognizer, as 20 ms PCM16 frames if it asked,
        stamped on the call's timeline (that of `speech_started`), which runs from the
        call's start whether a bot is attached or not."""
        at_ms = self._caller_ms
        self._caller_ms += len(pcm) // 2 * 1000 / rate
        ws = self.ws
        if ws is None or not self._caller_rate:
            return
        if self._resampler is None or self._resampler.in_rate != rate:
            self._resampler = StreamResampler(rate, self._caller_rate)
            self._pending = b""
            self._caller_seq = round(at_ms / FRAME_MS)
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
        y = self._resampler.process(x)  # soxr hands out what it has: any length
        self._pending += np.clip(np.rint(y * 32768), -32768, 32767).astype("<i2").tobytes()
        size = 2 * frame_samples(self._caller_rate)
        while len(self._pending) >= size:
            out, self._pending = self._pending[:size], self._pending[size:]
            seq = self._caller_seq
            self._caller_seq += 1
            frame = AudioFrame("pcm16", CALLER_TURN, seq, seq * FRAME_MS, out)
            try:
                async with asyncio.timeout(self.send_timeout_s):
                    await ws.send_bytes(pack(frame))
            except TimeoutError:  # it stopped reading: let it go, as `send` does
                if self.ws is ws:
                    self._failed, self.ws = ws, None
                return
            except Exception:  # gone: the next event's send finds out
                return

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        ws, self.ws = self.ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close(code, reason)


def parse_attach(text: str) -> dict[str, Any] | None:
    """The `session.attach` message, if `text` is one."""
    try:
        msg = parse_json(text)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and msg.get("type") == "session.attach" else None


def check_attach(msg: dict[str, Any]) -> tuple[str, int] | str:
    """(token, caller audio rate), or what is wrong with the message."""
    token = msg.get("token")
    if not isinstance(token, str) or not MIN_TOKEN_CHARS <= len(token) <= 256:
        return f"'token' must be a string of {MIN_TOKEN_CHARS} to 256 characters"
    rate = msg.get("caller_audio_rate", 0)
    if isinstance(rate, bool) or rate not in CALLER_AUDIO_RATES:
        return f"'caller_audio_rate' must be one of {', '.join(map(str, CALLER_AUDIO_RATES))}"
    return token, int(rate)
