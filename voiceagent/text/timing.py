"""Where words fall on a turn's audio timeline, from the model's own clock.

The speech-token LM emits 25 tokens per second of audio; a segment's tokens therefore
give its span on the timeline exactly (`SpokenSegment`). Inside a segment the model says
nothing about word boundaries, so words share the span in proportion to their length in
characters. That is an approximation: leading and trailing silence and slow or fast words
shift the estimate (typically by a word or less); captions and word-timestamp APIs use it
as such (docs/protocol.md, docs/compat.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOKEN_MS = 40.0  # one speech token: 25 Hz

# One "word" is a run of non-space characters, except in scripts written without spaces
# (Chinese, Japanese kana, Korean syllables), where each character is one.
_UNSPACED = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = re.compile(rf"[{_UNSPACED}]|[^\s{_UNSPACED}]+")


@dataclass(frozen=True)
class WordTime:
    word: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class SpokenSegment:
    """One segment of a turn's text and where it sits in the turn's audio (ms from the
    turn's first sample)."""

    text: str
    start_ms: float
    end_ms: float

    @property
    def words(self) -> list[WordTime]:
        return word_times(self.text, self.start_ms, self.end_ms)

    def to_json(self) -> dict[str, object]:
        """As `turn.words` carries it (docs/protocol.md)."""
        words = [{"word": w.word, "start_ms": w.start_ms, "end_ms": w.end_ms} for w in self.words]
        span = {"start_ms": round(self.start_ms, 1), "end_ms": round(self.end_ms, 1)}
        return {"text": self.text, **span, "words": words}

    @classmethod
    def of_tokens(
        cls, text: str, first: int, end: int, speed: float, paused_ms: float = 0.0
    ) -> SpokenSegment:
        """The segment spoken by speech tokens [first, end) of a turn at `speed`, after
        `paused_ms` of silence the turn added while it waited for text."""
        per_token = TOKEN_MS / speed
        return cls(text, paused_ms + first * per_token, paused_ms + end * per_token)


def words_of(text: str) -> list[str]:
    return _WORD.findall(text)


def word_times(text: str, start_ms: float, end_ms: float) -> list[WordTime]:
    """Spread `text`'s words over [start_ms, end_ms] by their length in characters (a
    space's worth added to each, so one-letter words still take time)."""
    words = words_of(text)
    weights = [len(w) + 1 for w in words]
    total = sum(weights)
    out: list[WordTime] = []
    at = 0
    for word, weight in zip(words, weights, strict=True):
        begin = start_ms + (end_ms - start_ms) * at / total
        at += weight
        out.append(
            WordTime(word, round(begin, 1), round(start_ms + (end_ms - start_ms) * at / total, 1))
        )
    return out
