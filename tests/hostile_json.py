"""Hostile session-protocol messages built from bytes: structure-aware input for the fuzz
target `session_json` (the fuzzer's bytes steer the choices) and for the socket-level
fuzz (random bytes do).

A mutation-only fuzzer rarely writes a 400-digit number into a float setting or nests
JSON 1,000 deep, because nothing in the coverage rewards the steps towards it. Here each
byte picks one thing from a vocabulary that holds those shapes: every message type and
setting name (and near misses), every JSON kind, boundary and huge numbers, NaN and
Infinity, lone surrogates, long strings, deep nesting, truncation and trailing junk.
"""

from __future__ import annotations

import json
from typing import Any

TYPES = (
    "session.start",
    "session.update",
    "speak",
    "text.delta",
    "text.flush",
    "text.end",
    "cancel",
    "playback",
    "ping",
    "spek",
    "",
    "SPEAK",
    "session.start\x00",
)
GROUPS = {
    "sampling": ("temperature", "top_k", "top_p", "seed"),
    "format": ("codec", "sample_rate", "bitrate", "framing", "stream_sid"),
    "input": ("sample_rate", "vad_aggressiveness", "min_speech_ms", "hangover_ms"),
    "barge_in": ("mode", "guard_ms", "duck_gain"),
    "playback": ("reports", "timeout_ms"),
}
KEYS = (
    "type",
    "text",
    "turn_id",
    "voice",
    "played_ms",
    "stopped",
    "language",
    "speed",
    *GROUPS,
    "volume",
    "id",
    "format.codec",
    "",
)
WORDS = (
    "agent",
    "narrator",
    "nobody",
    "opus",
    "pcm16",
    "mulaw",
    "alaw",
    "mp3",
    "header",
    "raw",
    "twilio",
    "off",
    "cancel",
    "duck",
    "en",
    "auto",
    "a",
    "b",
    "c",
    "t1",
    "t2",
    "t1.2",
    "MZ1",
    "Hello there.",
    " ",
    "\u00e9\u4f60\U0001f600",
    "true",
    "0",
)
NUMBERS = (
    "0",
    "-0",
    "1",
    "-1",
    "0.5",
    "1.0",
    "2.0",
    "25",
    "25.0",
    "300",
    "5000",
    "5001",
    "6000",
    "8000",
    "16000",
    "16000.0",
    "24000",
    "44100",
    "48000",
    "510000",
    "2147483647",
    "2147483648",
    "-2147483649",
    "9223372036854775808",
    "1e308",
    "1.7976931348623157e308",
    "1e-320",
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "-Infinity",
)
NEST_DEPTHS = (2, 50, 900, 998, 999, 1000, 1001, 1500, 30_000)
LONG = (199, 200, 201, 4000, 5000, 70_000)
HUGE_DIGITS = (309, 400, 1000, 4300, 4301)


class Reader:
    """The input's bytes as a stream of choices; zeros once it runs out."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def pick(self, options: tuple[Any, ...]) -> Any:
        return options[self.byte() % len(options)]

    def raw(self, most: int) -> bytes:
        n = min(self.byte() % (most + 1), self.left)
        self.pos += n
        return self.data[self.pos - n : self.pos]


def value(r: Reader, depth: int = 0) -> str:
    """One JSON value (as text, so that it can be what json.dumps never writes)."""
    kind = r.byte() % 13
    if kind == 0:
        return str(r.byte() - 128)
    if kind == 1:
        return str(r.pick(NUMBERS))
    if kind == 2:
        return ("-" if r.byte() & 1 else "") + "9" * r.pick(HUGE_DIGITS)
    if kind == 3:
        return str(r.byte() / 64)
    if kind in (4, 5):
        return json.dumps(r.pick(WORDS))
    if kind == 6:  # any bytes as a string, lone surrogates and controls included
        units = r.raw(24)
        units = units[: len(units) // 2 * 2]
        return json.dumps(units.decode("utf-16-le", "surrogatepass"))
    if kind == 7:
        return str(r.pick(("true", "false", "null", '"\\ud800"', '"\\u0000"', '"\\udfff\\ud800"')))
    if kind == 8 and depth < 4:
        return "[" + ",".join(value(r, depth + 1) for _ in range(r.byte() % 4)) + "]"
    if kind == 9 and depth < 4:
        return obj(r, depth + 1)
    if kind == 10:
        n = r.pick(NEST_DEPTHS)
        return "[" * n + "]" * n if r.byte() & 1 else '{"a":' * n + "1" + "}" * n
    if kind == 11:
        return json.dumps("x" * r.pick(LONG))
    return json.dumps(r.pick(WORDS))


def obj(r: Reader, depth: int = 0) -> str:
    """An object with keys from the protocol's vocabulary (a settings group gets its own
    keys, some of the time)."""
    fields = []
    for _ in range(r.byte() % 5):
        key = r.pick(KEYS)
        if key in GROUPS and r.byte() % 4:
            names = GROUPS[key]
            inner = [
                f"{json.dumps(r.pick(names))}:{value(r, depth + 1)}"
                for _ in range(1 + r.byte() % 3)
            ]
            fields.append(f"{json.dumps(key)}:{{{','.join(inner)}}}")
        else:
            fields.append(f"{json.dumps(key)}:{value(r, depth + 1)}")
    return "{" + ",".join(fields) + "}"


def message(r: Reader) -> str:
    """One message: mostly an object with a `type`, sometimes anything else, sometimes
    cut short or followed by junk."""
    shape = r.byte() % 16
    if shape == 0:
        text = value(r)
    elif shape == 1:
        text = r.raw(64).decode("utf-8", "replace")
    else:
        body = obj(r)
        kind = json.dumps(r.pick(TYPES)) if shape != 2 else value(r)
        text = '{"type":' + kind + ("," + body[1:] if body != "{}" else "}")
    ending = r.byte() % 16 if r.left else 15
    if ending == 0 and text:
        text = text[: r.byte() * len(text) // 256]  # truncated
    elif ending == 1:
        text += r.pick(("}", ",", " ", "\n", "x", "{}", "\x00"))
    return text


def messages(data: bytes, most: int = 8) -> list[str]:
    r = Reader(data)
    out: list[str] = []
    while r.left and len(out) < most:
        out.append(message(r))
    return out
