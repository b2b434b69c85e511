"""Marks: how a carrier tells us what the caller has heard.

After every few frames of a turn we send a named mark; the carrier echoes it once the
audio before it has played. A `clear` makes the carrier echo the pending marks at once,
so those echoes say nothing about playing: the turn's marks are forgotten when we clear.
No I/O here.
"""

from __future__ import annotations

from ..audio.format import FRAME_MS

PREFIX = "va"
# Marks awaiting their echo at most (ten a second of speech: over eight minutes). A
# carrier that never echoes (Asterisk before 20.18 ignores MARK_MEDIA) must not make the
# book grow for the whole call: beyond this the oldest are forgotten.
MAX_PENDING = 5000


class MarkBook:
    def __init__(self, every_frames: int = 5) -> None:
        self.every_frames = max(1, every_frames)
        self._pending: dict[str, tuple[int, int]] = {}  # name -> (turn number, ms played)
        self._frames: dict[int, int] = {}  # frames sent per turn still playing

    def sent(self, num: int) -> str | None:
        """One more frame of turn `num` went out; the mark to send after it, if one is due."""
        frames = self._frames[num] = self._frames.get(num, 0) + 1
        return self._name(num, frames) if frames % self.every_frames == 0 else None

    def end(self, num: int) -> str | None:
        """The turn's last frame went out: a mark at its very end (unless one is there)."""
        frames = self._frames.pop(num, 0)
        if frames == 0 or frames % self.every_frames == 0:
            return None
        return self._name(num, frames)

    def has_audio(self, num: int) -> bool:
        return self._frames.get(num, 0) > 0

    def clear(self, num: int) -> None:
        """The carrier is told to drop turn `num`: the echoes to come mean nothing."""
        self._frames.pop(num, None)
        for name in [n for n, (t, _) in self._pending.items() if t == num]:
            del self._pending[name]

    def echoed(self, name: str) -> tuple[int, int] | None:
        """(turn number, ms the caller has heard) for a real echo; None for a mark that was
        cleared or is not ours. Carriers echo in order, so the marks before it are done
        with too."""
        heard = self._pending.pop(name, None)
        if heard is not None:
            self._pending = {n: at for n, at in self._pending.items() if at > heard}
        return heard

    def _name(self, num: int, frames: int) -> str:
        name = f"{PREFIX}:{num}:{frames * FRAME_MS}"
        if len(self._pending) >= MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        self._pending[name] = (num, frames * FRAME_MS)
        return name
