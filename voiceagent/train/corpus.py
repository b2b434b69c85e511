"""The text corpus: English sentences in written and spoken form, split into train and
held-out, the same for the same parameters on any machine.

Sources:
- the transcripts of Debian's Asterisk prompts (`asterisk-core-sounds-en`, CC-BY-SA 3.0),
  when that file is installed; without it the corpus is ours alone (a logged note);
- sentences from our own templates (templates.py), drawn with a seeded generator until
  the train set holds about `hours` of speech.

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

from ..bench.phone_speech import TRANSCRIPTS, transcripts
from ..text.normalize import normalize_english
from . import templates
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


class _Pool:
    """Sentences in the order they were found, one per distinct text."""

    def __init__(self) -> None:
        self.sentences: list[Sentence] = []
        self.seconds = 0.0
        self._seen: set[str] = set()
        self.rejected = 0

    def add(self, source: str, written: str, spoken: str) -> bool:
        key = _key(spoken)
        if key in self._seen:
            return False
        if not (MIN_WORDS <= len(spoken.split()) <= MAX_WORDS and is_speakable(spoken)):
            self.rejected += 1
            return False
        self._seen.add(key)
        self.sentences.append(_sentence(source, written, spoken))
        self.seconds += estimate_seconds(spoken)
        return True


def build(params: Params, transcript: Path = TRANSCRIPTS) -> tuple[list[Sentence], list[Sentence]]:
    """(train, held-out). Held-out sentences are the ones whose seeded hash is smallest,
    so they are a random mix of every source; no held-out text occurs in train."""
    pool = _Pool()
    if params.asterisk:
        prompts = asterisk_sentences(transcript)
        if not prompts:
            log.info("no Asterisk transcripts at %s: template sentences only", transcript)
        for written, spoken in prompts:
            pool.add("ast", written, spoken)
    rng = random.Random(params.seed)
    target = params.hours * 3600
    misses = 0

    def train_seconds() -> float:
        n = len(pool.sentences)
        return pool.seconds * (1 - params.heldout / n) if n > params.heldout else 0.0

    while train_seconds() < target or len(pool.sentences) <= params.heldout:
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


def corpus_dir(work: Path) -> Path:
    return work / "corpus"


def is_complete(work: Path, params: Params | None = None) -> bool:
    """A corpus is there (and was made with `params`, when given)."""
    marker = corpus_dir(work) / "stage.json"
    if not marker.is_file():
        return False
    if params is None:
        return True
    done = json.loads(marker.read_text())
    return bool(done.get("params") == _params_json(params) and done.get("version") == VERSION)


def _params_json(params: Params) -> dict[str, object]:
    return {
        "hours": params.hours,
        "seed": params.seed,
        "heldout": params.heldout,
        "asterisk": params.asterisk,
    }


def load(work: Path) -> tuple[list[Sentence], list[Sentence]]:
    d = corpus_dir(work)
    return read_tsv(d / "train.tsv"), read_tsv(d / "heldout.tsv")


def write(work: Path, params: Params, transcript: Path = TRANSCRIPTS) -> dict[str, object]:
    """Build the corpus and write it under work/corpus; returns what stage.json holds."""
    d = corpus_dir(work)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stage.json").unlink(missing_ok=True)  # incomplete until the end
    train, heldout = build(params, transcript)
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
    (d / "stage.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def sources_md(summary: dict[str, object], transcript: Path) -> str:
    sources = summary["sources"]
    assert isinstance(sources, dict)
    ast = sources.get("ast", 0)
    made = sum(n for k, n in sources.items() if k != "ast")
    kinds = ", ".join(f"`{k}` {n}" for k, n in sources.items() if k != "ast")
    asterisk_row = (
        "| Asterisk core prompts' transcripts (Debian `asterisk-core-sounds-en`, "
        f"`{transcript}`; recorded by Allison Smith, 2003-2010), cut into sentences, "
        f"stage directions dropped | `ast-` | {ast} | CC-BY-SA 3.0: attribution, "
        "share-alike for derived text |"
    )
    own_row = (
        "| voiceagent's own templates and word lists (voiceagent/train/templates.py), "
        f"seeded: {kinds} | `<kind>-` | {made} | Apache-2.0, as voiceagent |"
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
{own_row}

Rows with `ast-` ids come from a CC-BY-SA 3.0 work: keep this file with the corpus, and
make it again with `--no-asterisk` for a corpus of our own text alone.
"""
