"""JSON from clients: nesting too deep for Python's parser is invalid JSON like any other."""

from __future__ import annotations

import json
from typing import Any


def parse_json(data: str | bytes) -> Any:
    """`json.loads`, raising ValueError (as for any invalid JSON, or an over-long integer)
    where the nesting is too deep for the parser, which would raise RecursionError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
