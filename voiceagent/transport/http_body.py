"""An HTTP request's body, read no further than its limit: a client cannot make the
server buffer (and parse) a body of any size."""

from __future__ import annotations

from starlette.requests import Request


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body; BodyTooLarge as soon as it passes `limit` bytes (by its
    Content-Length, or while it streams in)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise BodyTooLarge(limit)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
