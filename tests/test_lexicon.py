"""A voice that reads phonemes (voiceagent/text/lexicon.py): its tokenizer turns each
word into CMUdict phones before the BPE sees it, words the dictionary lacks stay spelled,
and the LM stage trains such a voice, from scratch or from another LM's weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_train_lm import SMALL, small_trainer, write_work

from voiceagent.cli import main
from voiceagent.model.cosyvoice2.text_tokenizer import QwenTextTokenizer
from voiceagent.text.lexicon import FIRST, LETTER, PHONES, Lexicon
from voiceagent.text.normalize import normalize
from voiceagent.train import lm_train

DICTIONARY = """\
hold HH OW L D
hold(2) HH AA L D
please P L IY Z
call K AO L
your Y AO R
your(2) Y UH R
the DH AH
the(2) DH IY
"""


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return write_work(tmp_path)


def dictionary(path: Path) -> Path:
    path.write_text(DICTIONARY)
    return path


def phones(*names: str) -> str:
    return "".join(LETTER[n] for n in names)


def test_each_phone_is_one_letter_and_a_word_stays_one_run_of_letters() -> None:
    assert len(PHONES) == 39 and len(set(LETTER.values())) == 39
    assert all(c.isalpha() and ord(c) >= FIRST for c in LETTER.values())


def test_known_words_become_their_first_pronunciation_and_the_rest_passes(tmp_path) -> None:
    lex = Lexicon(dictionary(tmp_path / "dict"))
    assert lex.render("Please hold, your call!") == (
        f"{phones('P', 'L', 'IY', 'Z')} {phones('HH', 'OW', 'L', 'D')}, "
        f"{phones('Y', 'AO', 'R')} {phones('K', 'AO', 'L')}!"
    )
    assert lex.render("Hold Xyzzy") == f"{phones('HH', 'OW', 'L', 'D')} xyzzy"  # spelled
    assert lex.render("the call's") == f"{phones('DH', 'AH')} {phones('K', 'AO', 'L', 'Z')}"
    # CMUdict's own file marks stress; the phones are the same without it
    stressed = tmp_path / "stressed"
    stressed.write_text("please P L IY1 Z\n")
    assert Lexicon(stressed).render("please") == phones("P", "L", "IY", "Z")


def test_the_pocketsphinx_dictionary_knows_everyday_words() -> None:
    lex = Lexicon(lm_train.pocketsphinx_lexicon())
    assert len(lex.words) > 100_000
    text = "thank you for your patience while i transfer your call"
    assert all(not w.isascii() for w in lex.render(text).split())


def test_a_phoneme_tokenizer_is_learned_over_phones_and_read_back_by_the_loader(
    work: Path, tmp_path: Path
) -> None:
    tok = lm_train.text_tokenizer(work, SMALL, merges=40, lexicon=dictionary(tmp_path / "d"))
    folder = lm_train.tokenizer_dir(work)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert (folder / config["voiceagent_lexicon"]).is_file()  # the voice carries it
    served = QwenTextTokenizer(folder)  # as the loader reads an exported voice
    text = "Please hold while I transfer your call."
    ids = lm_train.encode(tok, text)
    assert ids == served.encode(normalize(text, "auto"))
    heard = served.decode(ids)
    assert heard.startswith(f"{phones('P', 'L', 'IY', 'Z')} {phones('HH', 'OW', 'L', 'D')} while")
    # the same text spelled is read otherwise: the ids are not the spelling's
    spelled = lm_train.write_tokenizer(tmp_path / "spelled", [text], SMALL, merges=40)
    assert spelled.decode(spelled.encode(normalize(text, "auto"))) == normalize(text, "auto")


def test_a_new_lm_starts_from_another_lms_weights_but_its_text_embedding(work: Path) -> None:
    other, _, _ = small_trainer(work)
    path = work / "other.pt"
    torch.save({"model": other.lm.state_dict()}, path)
    mine, _, _ = small_trainer(work, seed=1)
    rows = mine.lm.llm.model.model.embed_tokens.weight
    grown = torch.nn.Embedding(rows.shape[0] + 7, rows.shape[1])  # another tokenizer's size
    mine.lm.llm.model.model.embed_tokens = grown
    mine.lm.llm.model.lm_head.weight = grown.weight
    kept = lm_train.warm_started(mine.lm, path)
    theirs, own = other.lm.state_dict(), mine.lm.state_dict()
    assert kept == sum(1 for k in own if theirs[k].shape == own[k].shape)
    for name, value in own.items():
        if "embed_tokens" in name or "lm_head" in name:
            assert value.shape != theirs[name].shape
        else:
            assert torch.equal(value, theirs[name]), name


def test_the_lm_stage_trains_a_phoneme_voice_from_a_warm_start(work: Path, capsys) -> None:
    argv = ["train", "lm", "--out", str(work), "--budget-min", "0.03"]
    assert main([*argv, "--text", "spelling"]) == 0
    assert QwenTextTokenizer(lm_train.tokenizer_dir(work)).lexicon is None
    spelled = lm_train.checkpoint_path(work).rename(work / "spelled.pt")
    (work / "lm").rename(work / "lm-spelling")
    assert main([*argv, "--warm-start", str(spelled)]) == 0  # phonemes: the default
    assert f"tensors from {spelled}" in capsys.readouterr().out
    folder = lm_train.tokenizer_dir(work)
    assert QwenTextTokenizer(folder).lexicon is not None
    # the dictionary travels with the voice, and so do its source and license
    notice = (folder / lm_train.LEXICON_NOTICE).read_text()
    assert "pocketsphinx" in notice and "Carnegie Mellon University" in notice
