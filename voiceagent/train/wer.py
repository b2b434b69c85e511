"""An intelligibility meter: transcribe speech with pocketsphinx and score the word error
rate against what was meant to be said.

pocketsphinx (BSD) ships an English acoustic model, language model and dictionary in its
wheel, so the meter runs offline on the CPU. It is a test and bench dependency only
(`pip install .[test]`): imported here lazily, so the server never needs it. It is a
weak recognizer (about 0.1 WER on clean Piper speech of call-center sentences): a
meter for comparing voices on the same sentences, not an absolute measure.
"""

from __future__ import annotations

import re
import threading
from functools import cache
from typing import Any

import numpy as np

from ..audio.resample import StreamResampler
from ..text.normalize import normalize_english

ASR_RATE = 16000  # the rate of pocketsphinx's en-us acoustic model
# words a recognizer writes in their short form: the same word as the spoken form's
SAME_WORD = {"mr": "mister", "mrs": "missus", "ms": "miz", "dr": "doctor"}


def words(text: str) -> list[str]:
    """Lower-case words with digits spelled out, hyphenated numbers split ('twenty-one'
    is two words, as a recognizer writes it), punctuation dropped ('P.M.' -> 'p m') and
    titles in full ('Mrs.' -> 'missus')."""
    text = normalize_english(text).lower().replace("-", " ")
    text = re.sub(r"[^a-z' ]", " ", text)
    found = (w.strip("'") for w in text.split())
    return [SAME_WORD.get(w, w) for w in found if w]


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Substitutions + deletions + insertions turning `ref` into `hyp` (Levenshtein)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def word_error_rate(ref: str, hyp: str) -> float:
    """Word edits over reference words. An empty reference scores 0.0 against an empty
    hypothesis and 1.0 against anything else (there is nothing to divide by)."""
    r, h = words(ref), words(hyp)
    if not r:
        return 0.0 if not h else 1.0
    return edit_distance(r, h) / len(r)


def corpus_wer(pairs: list[tuple[str, str]]) -> float:
    """WER over many (ref, hyp) pairs: all edits over all reference words, so long
    sentences weigh more than short ones (the usual way to pool WER)."""
    edits = sum(edit_distance(words(r), words(h)) for r, h in pairs)
    total = sum(len(words(r)) for r, _ in pairs)
    return edits / total if total else 0.0


_lock = threading.Lock()  # one decoder, one utterance at a time


@cache
def _decoder() -> Any:
    from pocketsphinx import Decoder  # lazy: a test/bench dependency, not a server one

    # the wheel's default en-us model, LM and dictionary; no log lines on stderr
    return Decoder(samprate=ASR_RATE, loglevel="FATAL")


def transcribe(pcm: np.ndarray, rate: int) -> str:
    """What pocketsphinx hears in mono float PCM in [-1, 1] at `rate` Hz (lower case)."""
    resampler = StreamResampler(rate, ASR_RATE)
    x = np.concatenate([resampler.process(pcm), resampler.flush()])
    data = (np.clip(x, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    with _lock:
        decoder = _decoder()
        # Its features' running state (the cepstral mean) would carry the last clip into
        # this one: the same clip was heard otherwise after another (measured).
        decoder.reinit_feat()
        decoder.start_utt()
        decoder.process_raw(data, full_utt=True)
        decoder.end_utt()
        hyp = decoder.hyp()
    return hyp.hypstr if hyp is not None else ""
