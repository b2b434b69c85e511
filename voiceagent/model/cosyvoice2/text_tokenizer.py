"""The Qwen2 text tokenizer of CosyVoice2, from the files in `CosyVoice-BlankEN/`.

It reads `tokenizer.json` when present, else builds the byte-level BPE from
`vocab.json` + `merges.txt` with Qwen2's pre-tokenizer split. Special tokens come from
`tokenizer_config.json` (with their ids), then CosyVoice2's own additions are appended
after the highest id, in the order CosyVoice2 registers them, so ids match the
embedding rows the released LM was trained with.

A voice of ours may read phonemes (text/lexicon.py): its `tokenizer_config.json` names a
pronouncing dictionary in the same folder (`voiceagent_lexicon`), and `encode` turns the
words into phones before the BPE sees them. The released CosyVoice2 has none.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from ...text.lexicon import Lexicon

LEXICON_KEY = "voiceagent_lexicon"  # tokenizer_config.json: the dictionary's file name

# Qwen2's pre-tokenizer pattern (contractions, letters, single digits, punctuation runs,
# newlines, whitespace).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added by CosyVoice2 on top of the Qwen2 vocabulary (non-speech events and markers).
COSYVOICE2_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endofprompt|>",
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
)


class QwenTextTokenizer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        if (directory / "tokenizer.json").is_file():
            self._tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        else:
            self._tok = _from_vocab_and_merges(directory)
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        lexicon = config.get(LEXICON_KEY)
        self.lexicon = Lexicon(directory / lexicon) if lexicon else None
        known = {int(i): t["content"] for i, t in config.get("added_tokens_decoder", {}).items()}
        # Register the configured specials at their ids, then CosyVoice2's additions.
        for token_id in sorted(known):
            if self._tok.token_to_id(known[token_id]) is None:
                self._tok.add_special_tokens([AddedToken(known[token_id], special=True)])
        for token in COSYVOICE2_SPECIALS:
            if self._tok.token_to_id(token) is None:
                self._tok.add_special_tokens([AddedToken(token, special=True)])

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(self.spelled(text), add_special_tokens=False).ids)

    def spelled(self, text: str) -> str:
        """The text as the BPE reads it: words as phones when the voice reads phonemes."""
        return self.lexicon.render(text) if self.lexicon is not None else text

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def token_id(self, token: str) -> int | None:
        found = self._tok.token_to_id(token)
        return None if found is None else int(found)


def _from_vocab_and_merges(directory: Path) -> Tokenizer:
    vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
    for path in (vocab_path, merges_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: required tokenizer file is missing")
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    merges = []
    for line in merges_path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#version"):
            a, b = line.split(" ")
            merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok
