"""The carrier side of a phone media stream, without I/O: the playback buffer that plays
what a server sent on the carrier's own 20 ms clock, with marks (Vonage: notify payloads)
in line with the audio, and the records a simulated call keeps (bench/carriers.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FRAME_S = 0.02
Int16 = NDArray[np.int16]


@dataclass(frozen=True)
class Violation:
    kind: str  # binary json unknown-event schema stream-id base64 frame-size before-start overflow
    detail: str
    at: float  # time.monotonic() when it arrived


@dataclass(frozen=True)
class MarkEcho:
    name: str  # Twilio/Telnyx mark.name; Vonage: the notify payload as sorted JSON
    at: float  # time.monotonic() when the echo was sent (or dropped)
    by: str  # "play": its audio had played; "clear": flushed by a clear; "dropped": not sent


@dataclass(frozen=True)
class Played:
    at: float  # carrier-clock time the 20 ms frame started (monotonic scale)
    pcm: Int16  # what was heard; shorter than a frame when the buffer ran dry, empty in a gap


class Playout:
    """The carrier's playback buffer, without I/O: audio and marks in arrival order, one
    frame taken per `tick`. An underrun: the buffer ran dry after audio of a stretch (the
    audio since the last mark or clear) and more audio of that stretch came later.

    A server that marks inside a turn (voiceagent: every 100 ms) ends a stretch at each
    mark, so a turn that runs dry just after one of them is no underrun by that count.
    `dry_spells` records every time the buffer ran dry after audio and audio came again,
    marks or not (a clear ends one): a caller that knows where its turns begin and end
    (bench/telephony.py) counts the spells inside a turn."""

    def __init__(self, rate: int, max_samples: int | None = None) -> None:
        self.rate, self.n, self.max_samples = rate, int(rate * FRAME_S), max_samples
        self.played: list[Played] = []
        self.underruns = 0
        self.gaps: list[tuple[float, float]] = []  # (ran dry, next audio came) per underrun
        self.dry_spells: list[tuple[float, float]] = []  # (ran dry, next audio came), all
        self._queue: deque[Int16 | str] = deque()
        self._samples = 0
        self._due: list[str] = []  # marks passed mid-frame: their audio ends with the frame
        self._busy_until = 0.0  # end of the audio in the frame now playing
        self._tail_is_audio = False
        self._dry_since: float | None = None
        self._had_audio = False  # audio came since the last clear
        self._spell_since: float | None = None

    @property
    def queued_s(self) -> float:
        return self._samples / self.rate

    def push_audio(self, pcm: Int16, now: float) -> bool:
        """Queue audio; False (dropped) when it would overflow the buffer."""
        if self.max_samples is not None and self._samples + pcm.size > self.max_samples:
            return False
        if self._dry_since is not None:
            self.underruns += 1
            self.gaps.append((self._dry_since, now))
            self._dry_since = None
        if self._spell_since is not None and pcm.size:
            self.dry_spells.append((self._spell_since, now))
            self._spell_since = None
        if pcm.size:
            self._had_audio = True
            self._queue.append(pcm)
            self._samples += pcm.size
            self._tail_is_audio = True
        return True

    def push_mark(self, name: str, now: float) -> bool:
        """Queue a mark; True when it is due at once (nothing queued or playing)."""
        self._tail_is_audio, self._dry_since = False, None
        if not self._queue and not self._due and now >= self._busy_until:
            return True
        self._queue.append(name)
        return False

    def clear(self) -> list[str]:
        """Drop the queued audio and stop playing; returns the marks that were pending."""
        marks = self._due + [x for x in self._queue if isinstance(x, str)]
        self._queue.clear()
        self._due, self._samples, self._busy_until = [], 0, 0.0
        self._tail_is_audio, self._dry_since = False, None
        self._had_audio, self._spell_since = False, None
        return marks

    def tick(self, t: float) -> list[str]:
        """Play the frame starting at `t`; returns the marks whose audio had ended by `t`."""
        due, self._due = self._due, []
        while self._queue and isinstance(self._queue[0], str):
            due.append(str(self._queue.popleft()))
        pieces: list[Int16] = []
        need = self.n
        while need and self._queue:
            head = self._queue.popleft()
            if isinstance(head, str):  # passed mid-frame: its audio ends with this frame
                self._due.append(head)
                continue
            pieces.append(head[:need])
            if head.size > need:
                self._queue.appendleft(head[need:])
            need -= pieces[-1].size
        got = self.n - need
        self._samples -= got
        if got:
            self._busy_until = t + got / self.rate
        if got or self.played:  # silence is recorded from the first audio on
            self.played.append(
                Played(t, np.concatenate(pieces) if pieces else np.zeros(0, np.int16))
            )
        if need and self._tail_is_audio and self._dry_since is None:
            self._dry_since = t + got / self.rate
        if need and self._had_audio and self._spell_since is None:
            self._spell_since = t + got / self.rate
        return due
