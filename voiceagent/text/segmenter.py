"""Cut streamed text into segments the LM can start on.

The first segment of a turn is cut early (at a clause mark once it has a few words) so
the first audio does not wait for a whole sentence; later segments end at sentence
marks. A mark only counts once the character after it is known (so "3.5" is not cut),
except for CJK marks, which need no following space. Segments are normalized one by
one, so a cut must not split what is read as one: a title or a short month and its
full stop ("Dr. Jones", "Jan. 5"), an initialism before a small letter ("5 p.m. on"),
a date's or a number's comma ("July 13th, 1955").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SENTENCE_END = ".!?;…"
CJK_SENTENCE_END = "。！？；\n"  # marks that end a sentence without a following space
CLAUSE = ",:—"
CJK_CLAUSE = "，、："
# Words whose full stop is an abbreviation's, never a sentence's: a name, a day or a
# number follows them.
ABBREVIATIONS = frozenset(
    {"Mr", "Mrs", "Ms", "Dr", "St", "Apt", "Ste", "No", "vs"}
    | {"Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"}
)
# "p.m", "e.g", "U.S": an initialism before its last full stop
_INITIALISM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")


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
            seg, self._buf = self._buf[:cut], self._buf[cut:]
            if seg.strip():
                out.append(seg.strip())
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
        buf, cfg = self._buf, self.config
        marks = SENTENCE_END + (CLAUSE if self._emitted == 0 else "")
        cjk = CJK_SENTENCE_END + (CJK_CLAUSE if self._emitted == 0 else "")
        for i, ch in enumerate(buf):
            is_clause = ch in CLAUSE or ch in CJK_CLAUSE
            if is_clause and len(buf[: i + 1].strip()) < cfg.first_min_chars:
                continue
            if ch in cjk:
                return i + 1
            if ch in marks and i + 1 < len(buf) and buf[i + 1].isspace():
                keep = _joins_next(buf, i)
                if keep is None:  # the next word decides: wait for it
                    return None
                if not keep:
                    return i + 1
        if len(buf) > cfg.max_chars:
            space = buf.rfind(" ", 0, cfg.max_chars)
            return space + 1 if space > 0 else cfg.max_chars
        return None


def _joins_next(buf: str, i: int) -> bool | None:
    """Whether the mark at `i` (a space follows) belongs to what comes after it, so that
    no cut may fall there; None until the next word's first character is known."""
    ch, word = buf[i], buf[:i].split()[-1] if buf[:i].split() else ""
    if ch == "." and word.lstrip("(\"'") in ABBREVIATIONS:
        return True
    initialism = ch == "." and _INITIALISM.fullmatch(word) is not None
    if initialism or (ch == "," and any(c.isdigit() for c in word)):
        rest = buf[i + 1 :].lstrip()
        if not rest:
            return None
        # an initialism ends a sentence before a capital; a number's comma joins a number
        return not rest[0].isupper() if initialism else rest[0].isdigit()
    return False
