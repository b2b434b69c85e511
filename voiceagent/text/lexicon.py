"""Words to phonemes, for a voice whose LM reads phonemes rather than spelling.

English spelling says little about sound for a word the LM has rarely seen, and a voice
trained on hours (not thousands of hours) of speech meets such words in every generic
sentence. A pronouncing dictionary (CMUdict's 39 ARPAbet phones, no stress marks, as
pocketsphinx ships it) turns each known word into its phones before the text tokenizer
sees it. Each phone is written as one letter of Latin Extended-A (U+0100 up), so a word
stays one run of letters for the tokenizer's pre-split and its BPE merges phones into
syllables; a word the dictionary lacks stays in plain lower-case letters, which the LM
also learns to read. Everything that is not a word (spaces, punctuation) passes as it is.

The dictionary file: one `word PH PH ...` line per pronunciation, `word(2)` for the
alternatives (the first is taken), stress digits allowed and dropped, optionally gzipped.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

# CMUdict's phones, in a fixed order: a phone's letter is chr(FIRST + its index).
# fmt: off
PHONES = (
    "AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F", "G",
    "HH", "IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH", "T",
    "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH",
)
# fmt: on
FIRST = 0x100
LETTER = {p: chr(FIRST + i) for i, p in enumerate(PHONES)}

WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


class Lexicon:
    def __init__(self, path: Path) -> None:
        opener = gzip.open if path.suffix == ".gz" else open
        self.words: dict[str, str] = {}
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                word, *phones = line.split()
                if not phones or "(" in word:
                    continue
                # stress marks (CMUdict's own AH0, AH1) dropped: pocketsphinx's copy has none
                letters = "".join(LETTER[p.rstrip("012")] for p in phones)
                self.words.setdefault(word.lower(), letters)

    def word(self, word: str) -> str:
        """`word`'s phone letters, or the word in lower case when the dictionary lacks it."""
        low = word.lower()
        found = self.words.get(low)
        if found is None and low.endswith("'s") and low[:-2] in self.words:
            found = self.words[low[:-2]] + LETTER["Z"]  # a possessive the file does not list
        return found if found is not None else low

    def render(self, text: str) -> str:
        """`text` with each word replaced by `word(word)`."""
        return WORD.sub(lambda m: self.word(m.group(0)), text)
