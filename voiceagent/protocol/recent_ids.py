"""The turn ids a session used lately: enough to refuse a client's repeated id without a
set that grows for the whole life of a long session."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

RECENT_TURN_IDS = 1000  # a session's live turns (at most `max_turns`) are among them


class RecentIds:
    def __init__(self, size: int = RECENT_TURN_IDS) -> None:
        self.size = size
        self._order: deque[str] = deque()
        self._ids: set[str] = set()

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def copy(self) -> RecentIds:
        other = RecentIds(self.size)
        other._order, other._ids = self._order.copy(), self._ids.copy()
        return other

    def add(self, turn_id: str) -> None:
        if turn_id in self._ids:
            return
        self._order.append(turn_id)
        self._ids.add(turn_id)
        if len(self._order) > self.size:
            self._ids.discard(self._order.popleft())
