"""Spoken forms of the things a call-center voice reads out: digit strings, codes, years,
house numbers, clock times, phone numbers, money.

The readings themselves are voiceagent/text/english.py's, the rules the server's
normaliser (voiceagent/text/normalize.py) applies before its LM: the corpus teaches the
LM the same readings the server gives it. Here they are paired with a written form, so
the corpus never leaves a digit to the teacher's own reading (Piper's espeak reads "1420"
as "one thousand four hundred twenty", a caller's agent says "fourteen twenty"). Letters
in a spoken form are single capitals ("K seven X"): one word per letter, read as its name.
"""

from __future__ import annotations

import re

from ..text import english
from ..text.english import digits, house_number, spell, year
from ..text.normalize import normalize_english

__all__ = ["clock", "digits", "house_number", "is_speakable", "money", "phone", "spell", "year"]


def clock(hour: int, minute: int, meridiem: str | None) -> tuple[str, str]:
    """(written, spoken) of a clock time: (2, 30, 'PM') -> ('2:30 PM', 'two thirty P M')."""
    written = f"{hour}:{minute:02d}"
    return (f"{written} {meridiem}" if meridiem else written), english.clock(hour, minute, meridiem)


def phone(area: str, exchange: str, line: str, country: str = "") -> tuple[str, str]:
    """A US number (555-01xx numbers are reserved for fiction): written '(555) 014-2398',
    or '1-800-555-0142' with a country code; spoken in the groups it is read in, a comma
    (a short pause) between groups."""
    written = f"{country}-{area}-{exchange}-{line}" if country else f"({area}) {exchange}-{line}"
    return written, english.phone(area, exchange, line, country)


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
