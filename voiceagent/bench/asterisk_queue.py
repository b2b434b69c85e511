"""chan_websocket's queue of the media an app sends, sans I/O: what the simulated Asterisk
WebSocket call (asterisk.py) plays and which events it sends back, in the order of checks
of channels/chan_websocket.c (process_binary_message, handle_command, dequeue_frame).

Media is cut into `frame_size` frames; outside START/STOP_MEDIA_BUFFERING a shorter tail
is dropped. XOFF when the queue reaches `xoff_level` frames, XON at the first tick below
`xon_level`; a message arriving at `queue_max` frames is dropped whole. One `tick()` per
ptime plays one frame; marks and MEDIA_BUFFERING_COMPLETED wait in the queue and go out
when the playout reaches them (FLUSH_MEDIA drops them unsent).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..telephony import asterisk_ws_control as ctl

QUEUE_COMMANDS = frozenset(
    {
        ctl.START_MEDIA_BUFFERING,
        ctl.STOP_MEDIA_BUFFERING,
        ctl.MARK_MEDIA,
        ctl.FLUSH_MEDIA,
        ctl.GET_STATUS,
        ctl.REPORT_QUEUE_DRAINED,
        ctl.PAUSE_MEDIA,
        ctl.CONTINUE_MEDIA,
    }
)


@dataclass(frozen=True)
class _Queued:
    """An event that waits its turn among the frames."""

    event: ctl.Event


class MediaQueue:
    def __init__(
        self,
        frame_size: int,
        channel_id: str | None = None,
        xoff_level: int = ctl.XOFF_LEVEL,
        xon_level: int = ctl.XON_LEVEL,
        queue_max: int = ctl.QUEUE_LENGTH_MAX,
    ) -> None:
        self.frame_size = frame_size
        self.channel_id = channel_id
        self.xoff_level, self.xon_level, self.queue_max = xoff_level, xon_level, queue_max
        self.length = 0  # frames only, as Asterisk counts
        self.full = False  # XOFF in force
        self.paused = False
        self.bulk = False  # between START_ and STOP_MEDIA_BUFFERING
        self.report_drained = False
        self.media_while_xoff = 0  # messages that came while XOFF was in force
        self.dropped_messages = 0  # refused whole: the queue was at queue_max
        self.dropped_partial_bytes = 0  # tails shorter than a frame outside buffering
        self._items: deque[bytes | _Queued] = deque()
        self._leftover = b""

    def media(self, data: bytes) -> list[ctl.Event]:
        """A binary message from the app; returns MEDIA_XOFF if it filled the queue."""
        if self.length >= self.queue_max:
            self.dropped_messages += 1
            return []
        if self.full:
            self.media_while_xoff += 1
        if self.bulk:
            data, self._leftover = self._leftover + data, b""
        whole = len(data) // self.frame_size * self.frame_size
        out: list[ctl.Event] = []
        for i in range(0, whole, self.frame_size):
            out += self._push(data[i : i + self.frame_size])
        tail = data[whole:]
        if tail and self.bulk:
            self._leftover = tail
        else:
            self.dropped_partial_bytes += len(tail)
        return out

    def _push(self, frame: bytes) -> list[ctl.Event]:
        self._items.append(frame)
        self.length += 1
        if not self.full and self.length >= self.xoff_level:
            self.full = True
            return [ctl.MediaXoff(self.channel_id)]
        return []

    def command(self, cmd: ctl.Command) -> list[ctl.Event]:
        """One of QUEUE_COMMANDS; returns what Asterisk sends at once (STATUS, XOFF)."""
        out: list[ctl.Event] = []
        if cmd.name == ctl.FLUSH_MEDIA:
            self._items.clear()
            self.length = 0
            self.bulk = False
            self._leftover = b""
        elif cmd.name == ctl.START_MEDIA_BUFFERING:
            self.bulk = True
        elif cmd.name == ctl.STOP_MEDIA_BUFFERING:
            self.bulk = False
            if self._leftover:
                out += self._push(self._leftover)  # a short last frame
                self._leftover = b""
            done = ctl.MediaBufferingCompleted(cmd.correlation_id or "", self.channel_id)
            self._items.append(_Queued(done))
        elif cmd.name == ctl.MARK_MEDIA:
            mark = ctl.MediaMarkProcessed(cmd.correlation_id or "", self.channel_id)
            self._items.append(_Queued(mark))
        elif cmd.name == ctl.REPORT_QUEUE_DRAINED:
            self.report_drained = True
        elif cmd.name == ctl.GET_STATUS:
            out.append(self.status())
        elif cmd.name in (ctl.PAUSE_MEDIA, ctl.CONTINUE_MEDIA):
            self.paused = cmd.name == ctl.PAUSE_MEDIA
        else:
            raise ValueError(f"{cmd.name} is not a queue command")
        return out

    def status(self) -> ctl.Status:
        return ctl.Status(
            self.length,
            self.xon_level,
            self.xoff_level,
            self.full,
            self.bulk,
            self.paused,
            self.channel_id,
        )

    def tick(self) -> tuple[bytes | None, list[ctl.Event]]:
        """One timer tick: the frame to play (None: nothing) and the events to send."""
        out: list[ctl.Event] = []
        frame = self._dequeue(out)
        if frame is None and self._leftover:  # mid-buffering: play what there is of a frame
            frame, self._leftover = self._leftover, b""
        return frame, out

    def _dequeue(self, out: list[ctl.Event]) -> bytes | None:
        if self.paused:
            return None
        if self.full and self.length < self.xon_level:
            self.full = False
            out.append(ctl.MediaXon(self.channel_id))
        if not self._items:
            if self.report_drained:
                self.report_drained = False
                out.append(ctl.QueueDrained(self.channel_id))
            return None
        item = self._items.popleft()
        while isinstance(item, _Queued):
            out.append(item.event)
            if not self._items:
                return None
            item = self._items.popleft()
        self.length -= 1
        return item
