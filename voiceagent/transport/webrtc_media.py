"""WebRTC media: the paced outbound audio track, and inbound audio as mono float.

The track is what makes WebRTC audio real time: 20 ms frames on an absolute clock,
silence while idle, and timestamps that never rewind (see OutboundAudioTrack).
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError

from ..audio.fade import fade_out
from ..audio.format import FRAME_MS, OPUS_RATE, frame_samples

RATE = OPUS_RATE
FRAME_SAMPLES = frame_samples(RATE)  # one Opus frame
FRAME_S = FRAME_MS / 1000
FRAME_BYTES = FRAME_SAMPLES * 2


class OutboundAudioTrack(MediaStreamTrack):
    """20 ms pcm16 48 kHz frames out, paced on an absolute monotonic clock.

    `recv()` returns the next queued frame, or silence when none is queued; pts grows by
    960 on every frame forever (across turns, cancels and idle gaps), so the RTP
    timestamps never rewind. Producers `put()` and wait while the queue is full, which
    keeps only a small buffer ahead of real time. `on_sync(turn, offset_ms)` is called
    when a turn's frame has gone out after silence or another turn's audio, so the peer
    can place that turn's timeline (lip sync) on its playback clock: at the next
    `recv()`, since aiortc's sender encodes a frame in a worker thread and sends it
    before asking for the next one (on a busy machine the encoding waited hundreds of ms
    for a thread, and the sync, sent at once, came that much before its audio).
    """

    kind = "audio"

    def __init__(
        self,
        max_frames: int = 25,
        clock: Callable[[], float] = time.monotonic,
        on_sync: Callable[[int, int], None] | None = None,
    ) -> None:
        super().__init__()
        self.on_sync = on_sync
        self._last_turn: int | None = None  # turn of the frame returned last (None: silence)
        self._sync: tuple[int, int] | None = None  # that frame's sync, once it has gone out
        self.max_frames = max_frames
        self._clock = clock
        self._queue: deque[tuple[int, bytes]] = deque()
        self._space = asyncio.Event()
        self._start: float | None = None
        self._index = 0  # frames returned so far; pts = index * 960
        self.played: dict[int, int] = {}  # turn -> frames of it returned by recv()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def put(self, turn: int, pcm: bytes) -> None:
        if len(pcm) != FRAME_BYTES:  # a short last frame: pad (or trim) to 20 ms
            pcm = pcm[:FRAME_BYTES].ljust(FRAME_BYTES, b"\0")
        while len(self._queue) >= self.max_frames:
            self._space.clear()
            await self._space.wait()
        self._queue.append((turn, pcm))

    def drop_turn(self, turn: int) -> int:
        """Discard the queued frames of a cancelled turn; return how many were dropped. A
        turn that is playing ends on its next frame faded out (`audio.fade`)."""
        before = len(self._queue)
        kept = deque(item for item in self._queue if item[0] != turn)
        if self._queue and self._queue[0][0] == turn and self.played.get(turn):
            kept.appendleft((turn, fade_out(self._queue[0][1], RATE)))
        self._queue = kept
        self._space.set()
        return before - len(self._queue)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._sync is not None and self.on_sync is not None:
            self.on_sync(*self._sync)  # the frame it is about was encoded and sent
        self._sync = None
        now = self._clock()
        if self._start is None:
            self._start = now
        due = self._start + self._index * FRAME_S
        if due > now:
            await asyncio.sleep(due - now)
        elif now - due > 0.2:
            # The loop stalled: re-anchor the clock instead of bursting to catch up.
            # Only the wall-clock anchor moves; pts keeps counting.
            self._start = now - self._index * FRAME_S
        turn: int | None = None
        if self._queue:
            turn, pcm = self._queue.popleft()
            played = self.played.get(turn, 0)
            if turn != self._last_turn:
                self._sync = (turn, played * FRAME_MS)
            self.played[turn] = played + 1
            self._space.set()
        else:
            pcm = bytes(FRAME_BYTES)
        self._last_turn = turn
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(pcm)
        frame.pts = self._index * FRAME_SAMPLES
        frame.sample_rate = RATE
        frame.time_base = fractions.Fraction(1, RATE)
        self._index += 1
        return frame


def set_audio_prefetch(pc: RTCPeerConnection, frames: int) -> bool:
    """Make the audio receivers of `pc` hold `frames` frames before decoding (aiortc: 4).
    aiortc has no setting for it, so this swaps its private jitter buffer; it returns
    False (and changes nothing) if a future aiortc stores it differently."""
    changed = False
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        name = "_RTCRtpReceiver__jitter_buffer"
        if transceiver.kind == "audio" and isinstance(getattr(receiver, name, None), JitterBuffer):
            setattr(receiver, name, JitterBuffer(capacity=16, prefetch=frames))
            changed = True
    return changed


def mono_float(frame: av.AudioFrame) -> np.ndarray:
    """Downmix any aiortc-decoded frame (packed or planar, int16 or float) to mono float."""
    arr = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        mono = arr.reshape(channels, -1).mean(axis=0)
    else:
        mono = arr.reshape(-1, channels).mean(axis=1)
    if arr.dtype == np.int16:
        mono = mono / 32768.0
    elif arr.dtype == np.int32:
        mono = mono / 2147483648.0
    return np.asarray(mono, dtype=np.float32)
