"""Spoken forms of the things a call-center voice reads out: digit strings, codes, years,
house numbers, clock times, money.

Each helper returns the words the teacher speaks and the LM reads, so the corpus never
leaves a digit to the teacher's own reading (Piper's espeak reads "1420" as "one
thousand four hundred twenty", a caller's agent says "fourteen twenty"). Letters in a
spoken form are single capitals ("K seven X"): one word per letter, read as its name.
Plain cardinals, ordinals and amounts go through voiceagent.text.normalize, the same
spelling the server applies before its LM.
"""

from __future__ import annotations

import re

from ..text.normalize import english_number, normalize_english

_DIGIT_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
)


def digits(s: str, zero: str = "zero") -> str:
    """'5550142' -> 'five five five zero one four two' (`zero` may be 'oh')."""
    return " ".join(zero if d == "0" else _DIGIT_WORDS[int(d)] for d in s)


def spell(code: str) -> str:
    """'K7X29Q' -> 'K seven X two nine Q': letters as capitals, digits as words."""
    out = []
    for ch in code:
        if ch.isdigit():
            out.append(_DIGIT_WORDS[int(ch)])
        elif ch.isalpha():
            out.append(ch.upper())
        else:
            raise ValueError(f"cannot spell {ch!r} in {code!r}")
    return " ".join(out)


def _two_digits(n: int) -> str:
    """The second half of a paired reading: 5 -> 'oh five', 0 -> 'hundred'."""
    if n == 0:
        return "hundred"
    return f"oh {english_number(n)}" if n < 10 else english_number(n)


def year(n: int) -> str:
    """1999 -> 'nineteen ninety-nine', 2005 -> 'two thousand five', 2024 -> 'twenty
    twenty-four' (the usual American readings)."""
    if 2000 <= n < 2010:
        return english_number(n)
    head, tail = divmod(n, 100)
    return f"{english_number(head)} {_two_digits(tail)}"


def house_number(n: int) -> str:
    """How an address's number is said: 12 -> 'twelve', 315 -> 'three fifteen',
    1420 -> 'fourteen twenty', 1405 -> 'fourteen oh five', 2008 -> 'two thousand eight',
    longer ones digit by digit."""
    if n < 100:
        return english_number(n)
    if n < 1000:
        head, tail = divmod(n, 100)
        return f"{english_number(head)} {_two_digits(tail)}"
    if n < 10000:
        if n % 1000 < 10 and n % 1000 != 0:  # 2008: 'two thousand eight'
            return english_number(n)
        head, tail = divmod(n, 100)
        return f"{english_number(head)} {_two_digits(tail)}"
    return digits(str(n))


def clock(hour: int, minute: int, meridiem: str | None) -> tuple[str, str]:
    """(written, spoken) of a clock time: (2, 30, 'PM') -> ('2:30 PM', 'two thirty P M')."""
    written = f"{hour}:{minute:02d}"
    if not meridiem:
        return written, normalize_english(written)  # 7:00 -> 'seven o'clock'
    # with AM/PM a full hour is 'one P M', not 'one o'clock P M'
    spoken = english_number(hour) if minute == 0 else normalize_english(written)
    return f"{written} {meridiem}", f"{spoken} {' '.join(meridiem)}"


def phone(area: str, exchange: str, line: str) -> tuple[str, str]:
    """A US number (555-01xx numbers are reserved for fiction): written '(555) 014-2398',
    spoken in the groups it is read in, a comma (a short pause) between groups."""
    written = f"({area}) {exchange}-{line}"
    return written, f"{digits(area)}, {digits(exchange)}, {digits(line)}"


def money(cents: int) -> tuple[str, str]:
    """(written, spoken) of an amount in dollars: 4899 -> ('$48.99', 'forty-eight dollars
    and ninety-nine cents')."""
    dollars, rest = divmod(cents, 100)
    written = f"${dollars:,}" + (f".{rest:02d}" if rest else "")
    return written, normalize_english(written)


_ALLOWED = re.compile(r"[A-Za-z ,.:;'?!-]+")


def is_speakable(spoken: str) -> bool:
    """Only letters, spaces and plain punctuation: no digit, symbol or bracket left for
    the teacher to guess at."""
    return bool(_ALLOWED.fullmatch(spoken)) and any(c.isalpha() for c in spoken)
