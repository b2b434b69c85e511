"""Cut streamed text into segments the LM can start on.

The first segment of a turn is cut early (at a clause mark once it has a few words) so
the first audio does not wait for a whole sentence; later segments end at sentence
marks. A mark only counts once the character after it is known (so "3.5" is not cut),
except for CJK marks, which need no following space. Segments are normalized one by
one, so a cut must not split what is read as one: a title, a short month or weekday and
its full stop ("Dr. Jones", "Tue. Jan. 5"), an initialism before a small letter ("5 p.m. on"),
a date's or a number's comma ("July 13th, 1955").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .markup import BREAK_TAG

SENTENCE_END = ".!?;…"
CJK_SENTENCE_END = "。！？；\n"  # marks that end a sentence without a following space
CLAUSE = ",:—"
CJK_CLAUSE = "，、："
CLOSERS = "\"'”’»)]}*_"  # may stand between a mark and the space that makes it a cut
# Words whose full stop is an abbreviation's, never a sentence's: a name, a number or
# the rest of an address follows them (a sentence that does end there is cut later).
ABBREVIATIONS = frozenset(
    {"Mr", "Mrs", "Ms", "Dr", "St", "Apt", "Ste", "No", "vs", "ext", "Prof", "Jr", "Sr"}
    | {"approx", "Fig", "vol", "Ave", "Blvd", "Rd", "Ln", "Ct", "N", "S", "E", "W"}
    | {"Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"}
    | {"Mon", "Tue", "Tues", "Wed", "Thu", "Thur", "Thurs", "Fri", "Sat", "Sun"}
    | {"Dept", "Acct", "appt", "Appt", "Qty", "qty", "Mt", "Ch", "ch", "pp"}
)
# "p.m", "e.g", "U.S": an initialism before its last full stop
_INITIALISM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
# initialisms that name something, so a capital after them goes on with the name
_NAMING_INITIALISMS = frozenset({"P.O", "U.S", "U.K", "D.C"})
_OPENERS = "(\"'“‘«[{"


@dataclass(frozen=True)
class SegmenterConfig:
    first_min_chars: int = 12  # a first segment may end at a clause mark past this
    max_chars: int = 200  # a segment is cut at a space past this even without a mark


class Segmenter:
    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = config or SegmenterConfig()
        self._buf = ""
        self._emitted = 0

    def push(self, delta: str) -> list[str]:
        self._buf += delta
        out = []
        while (cut := self._find_cut()) is not None:
            seg, self._buf = self._buf[:cut].strip(), self._buf[cut:]
            if any(c.isalnum() for c in seg):  # marks alone (". . .") say nothing
                out.append(seg)
                self._emitted += 1
        return out

    @property
    def holding(self) -> bool:
        """Text is buffered that no segment has taken yet."""
        return bool(self._buf.strip())

    def flush(self) -> list[str]:
        seg, self._buf = self._buf.strip(), ""
        return [seg] if seg else []

    def _find_cut(self) -> int | None:
        """Where the next segment ends, or None until more text decides it. Only the
        first `max_chars` characters are read (the rest may be a whole message), so
        whole and streamed text are cut alike and a cut costs the same however much
        is buffered."""
        buf, cfg = self._buf, self.config
        lead = len(buf) - len(buf.lstrip())
        window = min(len(buf), lead + cfg.max_chars)
        first = self._emitted == 0
        for i in range(lead, window):
            ch = buf[i]
            if ch == "<" and (tag := BREAK_TAG.match(buf, i)):
                return tag.end()  # a pause: the turn adds its silence after this segment
            long_enough = i + 1 - lead >= cfg.first_min_chars
            if ch in CJK_SENTENCE_END or (first and ch in CJK_CLAUSE and long_enough):
                return i + 1
            if ch in SENTENCE_END or (first and ch in CLAUSE and long_enough):
                end = _past(buf, i + 1, CLOSERS)
                if end == len(buf) or not buf[end].isspace():
                    continue  # "3.5", "a.m", or the next character is not here yet
                keep = _joins_next(buf, i, end)
                if keep is None:  # the next word decides: wait for it
                    return None
                if not keep:
                    return end
        if len(buf) - lead > cfg.max_chars:
            return _forced_cut(buf, lead, window)
        return None


def _past(buf: str, i: int, chars: str) -> int:
    """The index of the first character from `i` on that is not in `chars`."""
    while i < len(buf) and buf[i] in chars:
        i += 1
    return i


def _word_before(buf: str, i: int) -> str:
    start = i
    while start > 0 and not buf[start - 1].isspace():
        start -= 1
    return buf[start:i].lstrip(_OPENERS)


def _joins_next(buf: str, i: int, end: int) -> bool | None:
    """Whether the mark at `i` (whitespace at `end`) belongs to what comes after it, so
    that no cut may fall there; None until the next word's first character is known
    (only asked where it matters: a plain sentence end is cut at once)."""
    ch, word = buf[i], _word_before(buf, i)
    if ch == "." and word in ABBREVIATIONS:
        return True
    initialism = ch == "." and _INITIALISM.fullmatch(word) is not None
    number_comma = ch == "," and any(c.isdigit() for c in word)
    if not initialism and not number_comma:
        return False
    nxt = end
    while nxt < len(buf) and buf[nxt].isspace():
        nxt += 1
    if nxt == len(buf):
        return None
    follows = buf[nxt]
    if initialism:  # ends a sentence before a capital, unless it names something
        return not follows.isupper() or word in _NAMING_INITIALISMS
    return follows.isdigit()  # a number's comma joins a number


def _forced_cut(buf: str, lead: int, window: int) -> int:
    """A cut in a text that reached `max_chars` without one: after the last clause mark
    in it, else at the last space with no digit on either side (so that "March 3, 2024"
    and "(332) 555-0163" stay whole), else at the last space, else at the limit."""
    spaces = [k for k in range(window - 1, lead, -1) if buf[k].isspace() and not _in_tag(buf, k)]
    for k in spaces:
        if buf[k - 1] in CLAUSE + ";" and not _joins_next(buf, k - 1, k):
            return k + 1
    for k in spaces:
        if not any(c.isdigit() for c in _word_before(buf, k) + _word_after(buf, k + 1)):
            return k + 1
    return spaces[0] + 1 if spaces else window


def _in_tag(buf: str, k: int) -> bool:
    """Whether `k` is inside a markup tag ('<break time="1s"/>'), which a cut would
    leave to be read as words."""
    return buf.rfind("<", 0, k) > buf.rfind(">", 0, k)


def _word_after(buf: str, i: int) -> str:
    end = i
    while end < len(buf) and not buf[end].isspace():
        end += 1
    return buf[i:end]
