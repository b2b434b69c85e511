"""Cut streamed text into segments the LM can start on.

The first segment of a turn is cut early (at a clause mark once it has a few words) so
the first audio does not wait for a whole sentence; later segments end at sentence
marks. A mark only counts once the character after it is known (so "3.5" is not cut),
except for CJK marks, which need no following space.
"""

from __future__ import annotations

from dataclasses import dataclass

SENTENCE_END = ".!?;…"
CJK_SENTENCE_END = "。！？；\n"  # marks that end a sentence without a following space
CLAUSE = ",:—"
CJK_CLAUSE = "，、："


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
                return i + 1
        if len(buf) > cfg.max_chars:
            space = buf.rfind(" ", 0, cfg.max_chars)
            return space + 1 if space > 0 else cfg.max_chars
        return None
