"""Text tokenizer of the `tiny` model: UTF-8 bytes. Real models bring their own."""

from __future__ import annotations

from typing import Protocol

RESERVED = 3


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    vocab_size = 256 + RESERVED

    def encode(self, text: str) -> list[int]:
        return [b + RESERVED for b in text.encode("utf-8")]
