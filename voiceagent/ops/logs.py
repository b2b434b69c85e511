"""Logging: one formatter (structlog) over the standard `logging` calls of every module.

Modules log with `logging.getLogger(__name__)` as usual; fields passed as `extra={...}`
and the ids bound for the current task (`bind(session_id=..., turn_id=...)`) appear as
keys: `key=value` in text lines, object members in JSON lines. Uvicorn's own lines go
through the same formatter.

What is never logged at INFO or above: text content, audio, reference-voice data.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any, Literal

import structlog
from structlog.contextvars import bind_contextvars

LogFormat = Literal["text", "json"]
LEVELS = ("debug", "info", "warning", "error")


class _Handler(logging.StreamHandler):
    """Ours, so that configuring again replaces it and leaves other handlers alone.
    Given no stream, it writes to `sys.stderr` as it is at each record: code that swaps
    stderr (a test runner's capture, an embedding program) never leaves it writing to a
    closed file, as a stream taken once did (the suite's server threads logged into a
    finished test's closed capture)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__(stream)
        self._follow_stderr = stream is None

    def emit(self, record: logging.LogRecord) -> None:
        if self._follow_stderr:
            self.stream = sys.stderr  # `handle` holds the handler's lock here
        super().emit(record)


def configure_logging(
    level: str = "info", fmt: LogFormat = "text", stream: IO[str] | None = None
) -> None:
    """Route every logger to `stream` (stderr) in `fmt`: `text` (one readable line per
    record) or `json` (one JSON object per line, for log shippers)."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        _drop_uvicorn_colors,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0, pad_level=False)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = _Handler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers = []
        uv.propagate = True


def _drop_uvicorn_colors(logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
    event.pop("color_message", None)  # uvicorn's ANSI copy of the message
    return event


def bind(**ids: str) -> None:
    """Attach ids (session_id, turn_id, call_id) to every record of the current task and
    of the tasks it starts from now on."""
    bind_contextvars(**ids)
