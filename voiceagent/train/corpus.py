"""The text corpus: English sentences in written and spoken form, split into train and
held-out, the same for the same parameters on any machine.

Sources:
- the transcripts of Debian's Asterisk prompts (`asterisk-core-sounds-en`, CC-BY-SA 3.0),
  when that file is installed; without it the corpus is ours alone (a logged note);
- WordNet's example sentences (Debian `wordnet-base`, the WordNet 3.0 license), `wordnet`
  of them in a seeded order, when installed: everyday English of every kind, which the
  templates are not; they are not counted in `hours`;
- sentences from our own templates (templates.py), drawn with a seeded generator until
  the Asterisk and template sentences hold about `hours` of train speech.

On disk (DIR/corpus/): train.tsv and heldout.tsv (columns id, text, written; text is the
spoken form the teacher speaks and the LM reads), SOURCES.md (provenance, licenses,
counts) and stage.json (the parameters; written last, so it marks a complete corpus).
An id is `<source>-<hash of the text>`: the same text keeps its id, and so its WAV,
when the corpus is made again with other parameters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..bench.phone_speech import TRANSCRIPTS, transcripts
from ..text.normalize import normalize_english
from . import templates
from .files import read_marker, write_json
from .spoken import is_speakable

log = logging.getLogger(__name__)

VERSION = 3  # bump when the same parameters would give other sentences (3: shared readings)
MIN_WORDS, MAX_WORDS = 3, 20  # spoken words: spelled codes make spoken forms longer
# Spoken seconds per sentence, about: a least-squares fit of the joe voice's WAV lengths
# to spoken word counts (50 sentences, docs/training.md). Only to size the corpus; the
# teacher's manifest has the real lengths.
WORDS_PER_SECOND = 3.6
PAUSE_SECONDS = 0.33  # Piper's leading and trailing silence, about
COLUMNS = ("id", "text", "written")
WORDNET = Path("/usr/share/wordnet")  # Debian's wordnet-base


@dataclass(frozen=True)
class Sentence:
    id: str
    text: str  # spoken form: what the teacher says and the LM reads
    written: str  # as a person would type it

    @property
    def words(self) -> int:
        return len(self.text.split())


@dataclass(frozen=True)
class Params:
    hours: float = 1.0  # train speech to generate, about
    seed: int = 0
    heldout: int = 200  # held-out sentences (the WER benchmark needs 100 or more)
    asterisk: bool = True  # include the Asterisk prompt transcripts (CC-BY-SA 3.0)
    wordnet: int = 0  # WordNet example sentences to add (not counted in hours)


def estimate_seconds(text: str) -> float:
    return len(text.split()) / WORDS_PER_SECOND + PAUSE_SECONDS


def _key(text: str) -> str:
    """Two sentences that differ only in case and punctuation are one sentence."""
    return " ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split())


def _sentence(source: str, written: str, spoken: str) -> Sentence:
    digest = hashlib.sha1(spoken.encode()).hexdigest()[:10]
    return Sentence(f"{source}-{digest}", spoken, written)


def _clean_prompt(text: str) -> str:
    """An Asterisk transcript as speakable text: no stage directions ([tone], (pause),
    <beep>), keypad symbols as said, no quotes."""
    text = re.sub(r"\[[^]]*\]|\([^)]*\)|<[^>]*>", " ", text)
    text = text.replace("*", " star ").replace("#", " pound ").replace('"', "")
    text = re.sub(r"\.{2,}", ".", text)
    text = re.sub(r"(\d)([A-Za-z])", r"\1 \2", text)  # '3D' -> '3 D' -> 'three D'

    return " ".join(text.split())


def asterisk_sentences(path: Path = TRANSCRIPTS) -> list[tuple[str, str]]:
    """(written, spoken) of each sentence of the Asterisk prompt transcripts, in prompt
    name order; long prompts (menus) are cut into sentences. Empty when not installed."""
    found: list[tuple[str, str]] = []
    for _, text in sorted(transcripts(path).items()):
        for piece in re.split(r"(?<=[.!?;])\s+", _clean_prompt(text)):
            piece = piece.rstrip(";").strip()
            if not piece:
                continue
            if piece[-1] not in ".!?":
                piece += "."  # a final stop: Piper ends the sentence as a statement
            found.append((piece, normalize_english(piece)))
    return found


def wordnet_sentences(path: Path = WORDNET) -> list[tuple[str, str]]:
    """(written, spoken) of each example sentence of WordNet's glosses (the quoted parts
    after `|` in data.noun, data.verb, data.adj, data.adv), in file order, with a capital
    and a final stop. Only those of plain letters and punctuation (no digits, symbols or
    foreign letters); empty when WordNet is not installed."""
    found: list[tuple[str, str]] = []
    for part in ("noun", "verb", "adj", "adv"):
        data = path / f"data.{part}"
        if not data.is_file():
            return []
        for line in data.read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or "|" not in line:  # the license header; no gloss
                continue
            for quote in re.findall(r'"([^"]+)"', line.split("|", 1)[1]):
                text = " ".join(quote.split()).strip(" ;,")
                if not re.fullmatch(r"[A-Za-z][A-Za-z ,.'?!;:-]*", text):
                    continue
                if text[-1] not in ".!?":
                    text += "."
                text = text[0].upper() + text[1:]
                found.append((text, normalize_english(text)))
    return found


class _Pool:
    """Sentences in the order they were found, one per distinct text."""

    def __init__(self) -> None:
        self.sentences: list[Sentence] = []
        self.seconds = 0.0  # of the sentences counted in `hours`
        self.counted = 0
        self._seen: set[str] = set()
        self.rejected = 0

    def add(self, source: str, written: str, spoken: str, counted: bool = True) -> bool:
        key = _key(spoken)
        if key in self._seen:
            return False
        if not (MIN_WORDS <= len(spoken.split()) <= MAX_WORDS and is_speakable(spoken)):
            self.rejected += 1
            return False
        self._seen.add(key)
        self.sentences.append(_sentence(source, written, spoken))
        if counted:
            self.seconds += estimate_seconds(spoken)
            self.counted += 1
        return True


def build(
    params: Params, transcript: Path = TRANSCRIPTS, wordnet: Path = WORDNET
) -> tuple[list[Sentence], list[Sentence]]:
    """(train, held-out). Held-out sentences are the ones whose seeded hash is smallest,
    so they are a random mix of every source; no held-out text occurs in train."""
    pool = _Pool()
    if params.asterisk:
        prompts = asterisk_sentences(transcript)
        if not prompts:
            log.info("no Asterisk transcripts at %s: template sentences only", transcript)
        for written, spoken in prompts:
            pool.add("ast", written, spoken)
    if params.wordnet:
        examples = wordnet_sentences(wordnet)
        if not examples:
            log.info("no WordNet at %s (Debian wordnet-base): no WordNet sentences", wordnet)
        random.Random(f"wordnet:{params.seed}").shuffle(examples)
        added = 0
        for written, spoken in examples:
            if added == params.wordnet:
                break
            added += pool.add("wordnet", written, spoken, counted=False)
    rng = random.Random(params.seed)
    target = params.hours * 3600
    misses = 0

    def train_seconds() -> float:
        n = pool.counted
        return pool.seconds * (1 - params.heldout / n) if n > params.heldout else 0.0

    while train_seconds() < target or pool.counted <= params.heldout:
        kind, written, spoken = templates.generate(rng)
        if pool.add(kind, written, spoken):
            misses = 0
        else:
            misses += 1
            # the templates ran out of new sentences: the word lists are too small
            if misses > 10_000:
                raise RuntimeError(
                    f"templates give no new sentences after {len(pool.sentences)}: "
                    f"{params.hours} hours is more than they can fill"
                )

    def rank(s: Sentence) -> str:
        return hashlib.sha1(f"{params.seed}:{_key(s.text)}".encode()).hexdigest()

    held = {s.id for s in sorted(pool.sentences, key=rank)[: params.heldout]}
    train = [s for s in pool.sentences if s.id not in held]
    heldout = [s for s in pool.sentences if s.id in held]
    return train, heldout


# -- files ------------------------------------------------------------------------------


def write_tsv(path: Path, sentences: list[Sentence]) -> None:
    rows = ["\t".join(COLUMNS)] + [f"{s.id}\t{s.text}\t{s.written}" for s in sentences]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(rows) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_tsv(path: Path) -> list[Sentence]:
    """The sentences of a train.tsv or heldout.tsv (the header row names the columns)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = tuple(lines[0].split("\t"))
    if header[:3] != COLUMNS:
        raise ValueError(f"{path}: expected columns {COLUMNS}, got {header}")
    return [Sentence(*line.split("\t")[:3]) for line in lines[1:] if line]


T = TypeVar("T")


def spread(items: list[T], n: int) -> list[T]:
    """`n` of `items`, evenly spaced from the first, in order: a held-out sample with
    every source in it (the corpus writes its sources one after another)."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def corpus_dir(work: Path) -> Path:
    return work / "corpus"


def is_complete(work: Path, params: Params | None = None) -> bool:
    """A corpus is there (and was made with `params`, when given)."""
    done = read_marker(corpus_dir(work) / "stage.json")
    if done is None:
        return False
    if params is None:
        return True
    return bool(done.get("params") == _params_json(params) and done.get("version") == VERSION)


def _params_json(params: Params) -> dict[str, object]:
    return {
        "hours": params.hours,
        "seed": params.seed,
        "heldout": params.heldout,
        "asterisk": params.asterisk,
        "wordnet": params.wordnet,
    }


def load(work: Path) -> tuple[list[Sentence], list[Sentence]]:
    d = corpus_dir(work)
    return read_tsv(d / "train.tsv"), read_tsv(d / "heldout.tsv")


def write(
    work: Path, params: Params, transcript: Path = TRANSCRIPTS, wordnet: Path = WORDNET
) -> dict[str, object]:
    """Build the corpus and write it under work/corpus; returns what stage.json holds."""
    d = corpus_dir(work)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stage.json").unlink(missing_ok=True)  # incomplete until the end
    train, heldout = build(params, transcript, wordnet)
    write_tsv(d / "train.tsv", train)
    write_tsv(d / "heldout.tsv", heldout)
    sources = Counter(s.id.split("-")[0] for s in train + heldout)
    summary: dict[str, object] = {
        "version": VERSION,
        "params": _params_json(params),
        "train": len(train),
        "heldout": len(heldout),
        "train_hours_estimate": round(sum(estimate_seconds(s.text) for s in train) / 3600, 3),
        "words": sum(s.words for s in train + heldout),
        "sources": dict(sorted(sources.items())),
    }
    (d / "SOURCES.md").write_text(sources_md(summary, transcript), encoding="utf-8")
    write_json(d / "stage.json", summary)
    return summary


WORDNET_NOTICE = """WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved.
THIS SOFTWARE AND DATABASE IS PROVIDED "AS IS" AND PRINCETON UNIVERSITY MAKES NO
REPRESENTATIONS OR WARRANTIES, EXPRESS OR IMPLIED. BY WAY OF EXAMPLE, BUT NOT LIMITATION,
PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES OF MERCHANTABILITY OR FITNESS
FOR ANY PARTICULAR PURPOSE OR THAT THE USE OF THE LICENSED SOFTWARE, DATABASE OR
DOCUMENTATION WILL NOT INFRINGE ANY THIRD PARTY PATENTS, COPYRIGHTS, TRADEMARKS OR OTHER
RIGHTS."""


def sources_md(summary: dict[str, object], transcript: Path) -> str:
    sources = summary["sources"]
    assert isinstance(sources, dict)
    ast, wn = sources.get("ast", 0), sources.get("wordnet", 0)
    ours = {k: n for k, n in sources.items() if k not in ("ast", "wordnet")}
    kinds = ", ".join(f"`{k}` {n}" for k, n in ours.items())
    asterisk_row = (
        "| Asterisk core prompts' transcripts (Debian `asterisk-core-sounds-en`, "
        f"`{transcript}`; recorded by Allison Smith, 2003-2010), cut into sentences, "
        f"stage directions dropped | `ast-` | {ast} | CC-BY-SA 3.0: attribution, "
        "share-alike for derived text |"
    )
    wordnet_row = (
        "| WordNet 3.0's example sentences (Debian `wordnet-base`, the quoted examples of "
        "the glosses in `/usr/share/wordnet/data.*`), plain letters only, a capital and a "
        f"final stop added | `wordnet-` | {wn} | the WordNet 3.0 license (permissive; its "
        "notice below goes with every copy) |"
    )
    own_row = (
        "| voiceagent's own templates and word lists (voiceagent/train/templates.py), "
        f"seeded: {kinds} | `<kind>-` | {sum(ours.values())} | Apache-2.0, as voiceagent |"
    )
    return f"""# Corpus sources

Made by `voiceagent train corpus` (voiceagent/train/corpus.py), version {summary["version"]},
parameters {json.dumps(summary["params"])}: {summary["train"]} train and
{summary["heldout"]} held-out sentences, about {summary["train_hours_estimate"]} hours of
train speech (an estimate from word counts; teacher/manifest.tsv has the real lengths).

Files: `train.tsv` and `heldout.tsv`, UTF-8, tab-separated, a header row, columns
`id` (`<source>-<hash>`, also the WAV's name), `text` (the spoken form: numbers, codes
and abbreviations as words; what the teacher says and the LM reads) and `written` (the
same sentence as typed). No held-out text occurs in train.

| source | ids | sentences | license |
| --- | --- | --- | --- |
{asterisk_row}
{wordnet_row}
{own_row}

Rows with `ast-` ids come from a CC-BY-SA 3.0 work: keep this file with the corpus, and
make it again with `--no-asterisk` for a corpus of our own text alone.

Rows with `wordnet-` ids come from WordNet, whose license asks that this notice appear
on all copies:

{WORDNET_NOTICE}
"""
