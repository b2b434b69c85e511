"""Playout: how far ahead of real time a session sends, and how much of a turn the
listener has heard, from the best source at hand."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..audio.format import FRAME_MS
from ..pipeline.turn import ChunkSchedule


@dataclass(frozen=True)
class PlayoutConfig:
    lead_ms: int = 200  # audio sent ahead of real time; small so a cancel is heard at once
    streaming: bool = True  # False: the naive whole-utterance baseline (benchmarks)
    schedule: ChunkSchedule = field(default_factory=ChunkSchedule)
    max_segment_tokens: int | None = None  # speech tokens (25 per second) per segment
    # Audio a turn may synthesize ahead of sending (0: unbounded). Beyond it the turn's
    # flow/vocoder work waits, so a barge-in wastes at most this much.
    max_ahead_ms: int = 5000
    # Mel frames the vocoder holds back at a chunk's end (None: the model's exact amount).
    hold_back: int | None = None


@dataclass(frozen=True)
class Heard:
    ms: int
    source: str  # listener (its final report) | report (its last report, run on) | server


@dataclass
class TurnPlayout:
    """What the server knows of one playing turn's way to the listener."""

    # monotonic time the listener plays its first frame at (after what it still had of
    # the turn before; moved on when it ran dry)
    clock: float | None = None
    frames: int = 0  # frames handed to the transport
    report: tuple[int, float] | None = None  # the listener's last (played_ms, received at)

    def sent(self) -> None:
        self.frames += 1

    def heard(self, transport_sent_ms: int | None, now: float | None = None) -> Heard:
        """The listener plays in real time once audio reaches it, so: its last report plus
        the time since, or else the time on the turn's play clock; never more than has
        left the server (by the transport's count where it has one)."""
        now = time.monotonic() if now is None else now
        out_ms = self.frames * FRAME_MS if transport_sent_ms is None else transport_sent_ms
        if self.report is not None:
            played, at = self.report
            return Heard(int(min(played + (now - at) * 1000, out_ms)), "report")
        if self.clock is None:
            return Heard(0, "server")
        return Heard(int(max(0.0, min((now - self.clock) * 1000, out_ms))), "server")
