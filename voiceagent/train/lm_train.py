"""Stage `lm`: train the speech-token LM (`model.lm.SpeechLM`) from scratch on our speech
tokens: text -> tokens of the teacher's speech.

What the LM sees in training is what it is fed when serving:

- text ids: `normalize(text)` through the model directory's own text tokenizer
  (`cosyvoice2.text_tokenizer.QwenTextTokenizer`), as `pipeline/turn.py` encodes a
  segment. The tokenizer is a byte-level BPE whose merges are learned here from the
  train text (`write_tokenizer`): with bytes alone an English sentence has about 1.4
  speech tokens per text token, under the decoder's minimum of 2 per text token
  (`cosyvoice2.lm_config.MIN_TOKEN_TEXT_RATIO`), which would force every utterance to
  run on past its end.
- the sequence `[sos, text, task id, speech tokens]` (`SpeechLM.prompt_embeds` and then
  one speech token per decode step); the targets are the next speech token at the task
  id and every speech position, and the end token (6561, the speech vocabulary's first
  stop token) after the last. Text positions have no target.
- a voice's prompt: the engine puts the prompt's text ids before the segment's and the
  prompt's speech tokens after the task id. With probability `join` an example is two
  train utterances joined the same way (text ids a + b, tokens a + b), so a prompted
  voice is in distribution.

The training forward (`sequence_logits`) runs the same modules as
`SpeechLM.forward_embeds` over whole padded sequences with a causal mask; a test checks
that its logits equal the serving path's.

On disk (DIR/lm/): CosyVoice-BlankEN/ (tokenizer files and the Qwen2 config, copied as
they are into a model directory), ckpt.pt (model, optimizer, step, data position;
written to a temporary file and renamed), log.tsv (one row per `log_every` steps; at
each checkpoint the cross-entropy per speech target on 100 train and all held-out
utterances, and `text_gain`: how much worse held-out speech is predicted after another
sentence's text, a measure of how much the LM has learned to read its text).

Over 500 lines: the whole LM stage (tokenizer, examples, batches, the training forward,
the loop, checkpoints, evaluation) in the order it runs.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import itertools
import json
import math
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.contract import EOS_TOKEN, FlowStage, VocoderStage, Voice
from ..model.cosyvoice2.lm_config import read_lm_setup
from ..model.cosyvoice2.loader import EMBED, HEAD, QWEN_DIR
from ..model.cosyvoice2.random_checkpoint import qwen_config, write_bpe_files, yaml_text
from ..model.cosyvoice2.text_tokenizer import (
    COSYVOICE2_SPECIALS,
    LEXICON_KEY,
    QwenTextTokenizer,
)
from ..model.cosyvoice2.yaml_config import read_yaml
from ..model.lm import SOS_ROW, TASK_ROW, DecoderLayer, LMConfig, SpeechLM, _rotate_half
from ..model.sampling import COSYVOICE2, SamplingParams
from ..model.speech_model import SpeechModel
from ..text.lexicon import Lexicon
from ..text.normalize import normalize
from ..text.tokenizer import TextTokenizer
from . import corpus, inherit, tokens
from .files import save_torch
from .sizes import RAS_TAU, TEMPERATURE, TOP_K, VOICE
from .update import anneal_factor, anneal_span, anneal_stop, step_precision, update

IGNORE = -100
MERGES = 400  # BPE merges learned from the train text (see `write_tokenizer`)
MIN_PAIR_COUNT = 8  # a merge must occur this often in the train text
LANGUAGE = "auto"  # the protocol's default `language` of a turn


def lm_dir(work: Path) -> Path:
    return work / "lm"


def tokenizer_dir(work: Path) -> Path:
    """The `CosyVoice-BlankEN/` folder the export copies into the model directory."""
    return lm_dir(work) / QWEN_DIR


def checkpoint_path(work: Path) -> Path:
    return lm_dir(work) / "ckpt.pt"


# -- text ---------------------------------------------------------------------------------


def encode(tokenizer: TextTokenizer, text: str, language: str = LANGUAGE) -> list[int]:
    """Text -> LM text ids, exactly as a turn encodes a segment (pipeline/turn.py)."""
    return tokenizer.encode(normalize(text, language))


LEXICON_FILE = "lexicon.txt.gz"  # a phoneme voice's dictionary, in CosyVoice-BlankEN/
LEXICON_NOTICE = "LEXICON-NOTICE.txt"  # beside it: where it comes from, its license


def pocketsphinx_lexicon() -> Path:
    """CMUdict as the pocketsphinx wheel ships it (no stress marks; BSD-style license,
    Carnegie Mellon University): the dictionary a phoneme voice is trained with."""
    import pocketsphinx

    return Path(pocketsphinx.get_model_path()) / "en-us" / "cmudict-en-us.dict"


def pocketsphinx_notice() -> str:
    """What a voice carrying pocketsphinx's dictionary says about it: the source and the
    wheel's license text (Carnegie Mellon University's, first in the file)."""
    from importlib.metadata import distribution

    dist = distribution("pocketsphinx")
    license_text = dist.read_text("licenses/LICENSE") or dist.read_text("LICENSE") or ""
    return (
        "lexicon.txt.gz: the CMU Pronouncing Dictionary (cmudict-en-us.dict) as shipped in "
        f"the pocketsphinx {dist.version} wheel (PyPI), gzipped, unchanged.\n"
        "Its license, as that wheel states it:\n\n" + license_text
    )


def _pieces(texts: Sequence[str], language: str, lexicon: Lexicon | None) -> Counter[str]:
    """Pre-tokenized pieces of `texts` (Qwen2's split, then bytes as characters), counted:
    the units BPE merges work within, split by the serving tokenizer itself."""
    with tempfile.TemporaryDirectory() as tmp:
        write_bpe_files(Path(tmp), [])
        tok = QwenTextTokenizer(Path(tmp))._tok
    counts: Counter[str] = Counter()
    for text in texts:
        norm = normalize(text, language)
        norm = tok.normalizer.normalize_str(lexicon.render(norm) if lexicon else norm)
        for piece, _ in tok.pre_tokenizer.pre_tokenize_str(norm):
            counts[piece] += 1
    return counts


def learn_merges(
    texts: Sequence[str],
    merges: int,
    min_count: int = MIN_PAIR_COUNT,
    language: str = LANGUAGE,
    lexicon: Lexicon | None = None,
) -> list[tuple[str, str]]:
    """Byte-level BPE merges, most frequent pair first, from the normalized `texts` (as
    phones, with a `lexicon`); stops early when no pair occurs `min_count` times (so
    every merged token is trained on)."""
    words = {tuple(piece): n for piece, n in _pieces(texts, language, lexicon).items()}
    learned: list[tuple[str, str]] = []
    while len(learned) < merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, n in words.items():
            for a, b in itertools.pairwise(word):
                pairs[a, b] += n
        if not pairs:
            break
        best, count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < min_count:
            break
        learned.append(best)
        joined = best[0] + best[1]
        merged: dict[tuple[str, ...], int] = {}
        for word, n in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return learned


def write_tokenizer(
    directory: Path,
    texts: Sequence[str],
    sizes: dict[str, int],
    merges: int = MERGES,
    language: str = LANGUAGE,
    lexicon: Path | None = None,
    lexicon_notice: str = "",
) -> QwenTextTokenizer:
    """`CosyVoice-BlankEN/`: the BPE learned from `texts` and the Qwen2 config with the
    backbone `sizes`; returns the tokenizer as the loader reads it. With a `lexicon`
    (a pronouncing dictionary, text/lexicon.py), the voice reads phonemes: the
    dictionary goes into the folder, gzipped, with `lexicon_notice` beside it, and the
    BPE is learned over phones."""
    words = Lexicon(lexicon) if lexicon else None
    n = write_bpe_files(directory, learn_merges(texts, merges, language=language, lexicon=words))
    if lexicon:
        with lexicon.open("rb") as src, gzip.open(directory / LEXICON_FILE, "wb") as dst:
            shutil.copyfileobj(src, dst)
        (directory / LEXICON_NOTICE).write_text(lexicon_notice or f"{LEXICON_FILE}: {lexicon}\n")
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) | {LEXICON_KEY: LEXICON_FILE}
        config_path.write_text(json.dumps(config))
    vocab = sizes["text_vocab"] or n + len(COSYVOICE2_SPECIALS)
    config = qwen_config(sizes, vocab)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tok = QwenTextTokenizer(directory)
    if tok.vocab_size != vocab:
        raise ValueError(f"{directory}: tokenizer has {tok.vocab_size} ids, config {vocab}")
    for text in texts:  # byte-level: every text comes back as it went in (or as phones)
        norm = tok.spelled(normalize(text, language))
        if tok.decode(tok.encode(norm)) != norm:
            raise ValueError(f"tokenizer does not round-trip {norm!r}")
    return tok


def text_tokenizer(
    work: Path,
    sizes: dict[str, int],
    merges: int = MERGES,
    language: str = LANGUAGE,
    lexicon: Path | None = None,
    lexicon_notice: str = "",
) -> QwenTextTokenizer:
    """The tokenizer in DIR/lm/, learned from the corpus' train text the first time
    (later runs reuse it, `lexicon` or not: the checkpoint's text embedding is indexed by
    its ids)."""
    directory = tokenizer_dir(work)
    if (directory / "config.json").is_file():
        return QwenTextTokenizer(directory)
    texts = [s.text for s in corpus.load(work)[0]]
    staging = directory.with_name(directory.name + ".tmp")
    tok = write_tokenizer(staging, texts, sizes, merges, language, lexicon, lexicon_notice)
    staging.replace(directory)
    tok.directory = directory
    return tok


def lm_config(sizes: dict[str, int], qwen: Path) -> LMConfig:
    """The LM's config as the loader builds it from a model directory with these sizes
    and this `CosyVoice-BlankEN/` folder."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cosyvoice2.yaml"
        path.write_text(yaml_text(sizes))
        return read_lm_setup(read_yaml(path), qwen).config


# -- data ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    text: tuple[int, ...]  # LM text ids
    speech: tuple[int, ...]  # speech tokens

    @property
    def positions(self) -> int:
        """Sequence length: sos, text, task id, speech (the end token is a target only)."""
        return len(self.text) + len(self.speech) + 2

    def joined(self, other: Example) -> Example:
        """`self` as the voice prompt of `other`: the way the engine prefixes a prompt."""
        return Example(self.text + other.text, self.speech + other.speech)


def load_examples(
    work: Path, tokenizer: QwenTextTokenizer, language: str = LANGUAGE
) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples: every corpus sentence that has speech tokens, whether
    its speech is on this machine or only its tokens are (an export's, `train seed`):
    the LM reads text and tokens, never audio."""
    speech = tokens.load_tokens(work)
    train_text, heldout_text = corpus.load(work)

    def examples(sentences: Sequence[corpus.Sentence]) -> list[Example]:
        return [
            Example(tuple(encode(tokenizer, s.text, language)), tuple(int(t) for t in speech[s.id]))
            for s in sentences
            if s.id in speech
        ]

    return examples(train_text), examples(heldout_text)


def batches_by_length(items: Sequence[Example], max_positions: int) -> list[list[Example]]:
    """Consecutive runs of `items` (sort them first) whose padded size stays within
    `max_positions` (a longer single item is a batch of its own)."""
    out: list[list[Example]] = []
    cur: list[Example] = []
    longest = 0
    for ex in items:
        longest_then = max(longest, ex.positions)
        if cur and longest_then * (len(cur) + 1) > max_positions:
            out.append(cur)
            cur, longest_then = [], ex.positions
        cur.append(ex)
        longest = longest_then
    if cur:
        out.append(cur)
    return out


def epoch_batches(
    train: Sequence[Example], join: float, max_positions: int, seed: int
) -> list[list[Example]]:
    """One pass over `train`: each example, with probability `join`, gets another train
    utterance as its prompt; batches of similar length, in a random order."""
    rng = random.Random(seed)
    items = []
    for ex in train:
        items.append(rng.choice(train).joined(ex) if rng.random() < join else ex)
    keyed = sorted(items, key=lambda e: (e.positions, rng.random()))
    batches = batches_by_length(keyed, max_positions)
    rng.shuffle(batches)
    return batches


@dataclass
class Batch:
    inputs: Tensor  # [b, L, hidden] embeddings (not yet made: see `embed`)
    targets: Tensor  # [b, L] next speech token, EOS_TOKEN, or IGNORE


def targets_of(ex: Example) -> list[int]:
    """Per input position: nothing at sos and text, then the first speech token at the
    task id, each next one at each speech token, and the end token at the last."""
    return [IGNORE] * (1 + len(ex.text)) + list(ex.speech) + [EOS_TOKEN]


def embed(lm: SpeechLM, examples: Sequence[Example]) -> tuple[Tensor, Tensor]:
    """(inputs [b, L, hidden], targets [b, L]) of a batch, right-padded: each row is
    `SpeechLM.prompt_embeds(text, speech)`, the serving prompt with all speech given."""
    dev = lm.llm_decoder.weight.device
    rows = []
    for ex in examples:
        sos = lm.llm_embedding.weight[SOS_ROW : SOS_ROW + 1]
        task = lm.llm_embedding.weight[TASK_ROW : TASK_ROW + 1]
        text = lm.llm.model.model.embed_tokens(torch.tensor(ex.text, dtype=torch.long, device=dev))
        sp = lm.speech_embedding(torch.tensor(ex.speech, dtype=torch.long, device=dev))
        rows.append(torch.cat([sos, text, task, sp], dim=0))
    inputs = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    targets = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(targets_of(ex), dtype=torch.long) for ex in examples],
        batch_first=True,
        padding_value=IGNORE,
    ).to(dev)
    return inputs, targets


@dataclass
class Prior:
    """An alignment prior for training (a guided-attention loss, as in DC-TTS): in
    `layers`, each head's attention from a speech position over the text, renormalized
    over the text alone, is penalized off the diagonal. Where attention goes between
    text and the speech so far is left free; only where in the text it reads is not.
    Speech query n of N and text key t of T cost 1 - exp(-(n/N - t/T)^2 / 2 width^2)."""

    layers: tuple[int, ...]
    cost: Tensor  # [b, L, L]; 0 wherever the query is not speech or the key not text
    text: Tensor  # [b, L] bool, the text keys
    queries: Tensor  # [b, L] bool, the speech queries (task id and speech)
    losses: list[Tensor] = field(default_factory=list)

    @classmethod
    def of(cls, examples: Sequence[Example], length: int, layers: tuple[int, ...], width: float):
        b = len(examples)
        cost = torch.zeros(b, length, length)
        text = torch.zeros(b, length, dtype=torch.bool)
        queries = torch.zeros(b, length, dtype=torch.bool)
        for i, ex in enumerate(examples):
            t, n = len(ex.text), len(ex.speech) + 1  # queries: the task id and each token
            q = torch.arange(n, dtype=torch.float32)[:, None] / n
            k = torch.arange(t, dtype=torch.float32)[None, :] / t
            cost[i, t + 1 : t + 1 + n, 1 : 1 + t] = 1 - torch.exp(-((q - k) ** 2) / (2 * width**2))
            text[i, 1 : 1 + t] = True
            queries[i, t + 1 : t + 1 + n] = True
        return cls(layers, cost, text, queries)

    def add(self, q: Tensor, k: Tensor) -> None:
        """One layer's loss from its rotated queries and keys [b, heads, L, d]."""
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~self.text[:, None, None, :].to(q.device), -math.inf)
        att = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no text key: 0
        per_query = (att * self.cost[:, None].to(q.device)).sum(-1)  # [b, heads, L]
        mask = self.queries[:, None].to(q.device).expand_as(per_query)
        self.losses.append(per_query[mask].mean())

    @property
    def loss(self) -> Tensor:
        return torch.stack(self.losses).mean()


def hidden_states(
    lm: SpeechLM, x: Tensor, dropout: float = 0.0, prior: Prior | None = None
) -> Tensor:
    """The decoder over whole sequences [b, L, hidden] with a causal mask (the modules and
    arithmetic of `SpeechLM.forward_embeds`, without a KV pool); returns the final-normed
    hidden states [b, L, hidden]. Right padding never reaches a real position. With a
    `prior`, its layers' attention adds to `prior.losses`."""
    cfg = lm.cfg
    b, t, _ = x.shape
    cos, sin = lm._rope(torch.arange(t, device=x.device)[None], x.dtype)
    backbone = lm.llm.model.model
    rep = cfg.heads // cfg.kv_heads
    for i, layer in enumerate(cast(list[DecoderLayer], backbone.layers)):
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q = att.q_proj(h).view(b, t, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = att.k_proj(h).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = att.v_proj(h).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if prior is not None and i in prior.layers:
            prior.add(q, k)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = att.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        x = x + F.dropout(a, dropout, lm.training)
        m = layer.mlp(layer.post_attention_layernorm(x))
        x = x + F.dropout(m, dropout, lm.training)
    return backbone.norm(x)


def loss_of(
    lm: SpeechLM, examples: Sequence[Example], dropout: float = 0.0, prior: Prior | None = None
) -> tuple[Tensor, int]:
    """(mean cross-entropy over the batch's targets, number of targets). The speech head
    is computed at target positions only."""
    inputs, targets = embed(lm, examples)
    h = hidden_states(lm, inputs, dropout, prior)
    keep = targets != IGNORE
    logits = lm.llm_decoder(h[keep])
    return F.cross_entropy(logits, targets[keep]), int(keep.sum())


@torch.no_grad()
def cross_entropy(lm: SpeechLM, examples: Sequence[Example], max_positions: int) -> float:
    """Mean cross-entropy per target (speech tokens and end tokens) over `examples`."""
    was = lm.training
    lm.eval()
    total, count = 0.0, 0
    ordered = sorted(examples, key=lambda e: e.positions)
    for batch in batches_by_length(ordered, max_positions):
        loss, n = loss_of(lm, batch)
        total += float(loss) * n
        count += n
    lm.train(was)
    return total / max(count, 1)


# -- model --------------------------------------------------------------------------------


def new_lm(cfg: LMConfig, seed: int) -> SpeechLM:
    """A fresh LM, text embedding and text head tied (as the released Qwen config says),
    GPT-style initialised: N(0, 0.02), residual outputs scaled by 1/sqrt(2 layers)."""
    torch.manual_seed(seed)
    lm = SpeechLM(cfg)
    lm.llm.model.lm_head.weight = lm.llm.model.model.embed_tokens.weight
    std = 0.02
    for name, p in lm.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.zeros_(p)
        elif "norm" in name:
            torch.nn.init.ones_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            torch.nn.init.normal_(p, 0.0, std / math.sqrt(2 * cfg.layers))
        else:
            torch.nn.init.normal_(p, 0.0, std)
    return lm


@dataclass(frozen=True)
class Hyper:
    lr: float = 1e-3
    warmup: int = 100  # steps of linear warm-up
    decay_steps: int = 0  # 0: constant after warm-up; else cosine to lr / 10 by this step
    # An anneal (`train lm --anneal`): from step `anneal_from` the rate falls linearly to
    # update.ANNEAL_FLOOR of itself over `anneal_steps` steps; 0: none.
    anneal_from: int = 0
    anneal_steps: int = 0
    weight_decay: float = 0.1  # on matrices only (not norms, biases, embeddings)
    clip: float = 1.0
    batch_positions: int = 2000  # padded sequence positions per batch
    join: float = 0.3  # probability that an example has another utterance as its prompt
    dropout: float = 0.2
    # the alignment prior (`Prior`): its weight, the layers it holds, its width
    prior: float = 1.0
    prior_layers: tuple[int, ...] = (1, 2)
    prior_width: float = 0.2
    bf16: bool = True  # bfloat16 autocast in training steps (`update.step_precision`)
    seed: int = 0
    checkpoint_s: float = 300.0  # seconds between checkpoints (and held-out evaluations)
    log_every: int = 10  # steps per log row
    eval_train: int = 100  # train utterances whose cross-entropy is logged with held-out's


def learning_rate(h: Hyper, step: int) -> float:
    lr = h.lr * min(1.0, (step + 1) / max(h.warmup, 1))
    if h.decay_steps:
        frac = min(1.0, step / h.decay_steps)
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
    return lr * anneal_factor(step, h.anneal_from, h.anneal_steps)


def optimizer(lm: SpeechLM, h: Hyper) -> torch.optim.AdamW:
    decay = [p for n, p in lm.named_parameters() if p.dim() == 2 and "embed" not in n]
    rest = [p for n, p in lm.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    groups = [
        {"params": decay, "weight_decay": h.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=h.lr, betas=(0.9, 0.95), eps=1e-8)


@dataclass
class Trainer:
    """An LM, its optimizer and where training stands."""

    lm: SpeechLM
    hyper: Hyper
    opt: torch.optim.AdamW
    step: int = 0
    epoch: int = 0
    index: int = 0  # next batch of this epoch
    seconds: float = 0.0  # training time so far, over all runs
    targets_seen: int = 0
    positions_seen: int = 0
    skipped: int = 0  # batches whose loss or gradient was not finite (`update`)
    extra: dict[str, Any] = field(default_factory=dict)
    last_prior: float = 0.0  # the alignment prior's loss at the last step

    @classmethod
    def fresh(cls, cfg: LMConfig, hyper: Hyper, device: torch.device | None = None) -> Trainer:
        lm = new_lm(cfg, hyper.seed).to(device or "cpu")
        return cls(lm, hyper, optimizer(lm, hyper))

    @property
    def device(self) -> torch.device:
        return self.lm.llm_decoder.weight.device

    def train_step(self, examples: Sequence[Example]) -> float:
        # Dropout draws from torch's global generator: seeded by the step, a run stopped
        # and resumed takes the same masks as one that never stopped, on any device.
        torch.manual_seed(self.hyper.seed * 1_000_003 + self.step)
        lr = learning_rate(self.hyper, self.step)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.lm.train()
        h = self.hyper
        prior = None
        layers = tuple(i for i in h.prior_layers if i < self.lm.cfg.layers)
        if h.prior > 0 and layers:
            length = max(e.positions for e in examples)
            prior = Prior.of(examples, length, layers, h.prior_width)
        with step_precision(h.bf16, self.device):
            loss, n = loss_of(self.lm, examples, h.dropout, prior)
        self.last_prior = float(prior.loss.detach()) if prior else 0.0
        total = loss + h.prior * prior.loss if prior else loss
        if update(self.opt, self.lm.parameters(), total, h.clip) is None:
            self.skipped += 1
        self.step += 1
        self.targets_seen += n
        self.positions_seen += sum(e.positions for e in examples)
        return float(loss.detach())

    def save(self, path: Path) -> None:
        """Atomically: a temporary file renamed over the checkpoint."""
        state = {
            "model": self.lm.state_dict(),
            "optimizer": self.opt.state_dict(),
            "config": asdict(self.lm.cfg),
            "hyper": asdict(self.hyper),
            "step": self.step,
            "epoch": self.epoch,
            "index": self.index,
            "seconds": self.seconds,
            "targets_seen": self.targets_seen,
            "positions_seen": self.positions_seen,
            "extra": self.extra,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        save_torch(state, path)

    @classmethod
    def load(
        cls, path: Path, hyper: Hyper | None = None, device: torch.device | None = None
    ) -> Trainer:
        """Resume from a checkpoint (its own hyper-parameters unless `hyper` is given), on
        `device` (default the CPU) whatever device wrote it."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        cfg = LMConfig(**state["config"])
        h = hyper or Hyper(**state["hyper"])
        lm = new_lm(cfg, h.seed)
        lm.load_state_dict(state["model"])
        lm.llm.model.lm_head.weight = lm.llm.model.model.embed_tokens.weight
        lm.to(device or "cpu")  # before the optimizer, whose state follows its parameters
        opt = optimizer(lm, h)
        if "optimizer" in state:  # a seeded checkpoint has none (train/snapshot.py)
            opt.load_state_dict(state["optimizer"])
        return cls(
            lm,
            h,
            opt,
            step=state["step"],
            epoch=state["epoch"],
            index=state["index"],
            seconds=state["seconds"],
            targets_seen=state["targets_seen"],
            positions_seen=state["positions_seen"],
            extra=state["extra"],
        )

    def batches(self, train: Sequence[Example]) -> Iterator[list[Example]]:
        """The batches from where training stands, epoch after epoch (each epoch's order
        and joins follow from the seed and the epoch's number)."""
        while True:
            epoch = epoch_batches(
                train,
                self.hyper.join,
                self.hyper.batch_positions,
                self.hyper.seed * 1000 + self.epoch,
            )
            while self.index < len(epoch):
                self.index += 1  # counted before it is trained: a save after resumes after it
                yield epoch[self.index - 1]
            self.epoch += 1
            self.index = 0


# -- the stage ----------------------------------------------------------------------------


LOG_COLUMNS = (
    "step",
    "epoch",
    "seconds",
    "lr",
    "loss",
    "prior",
    "positions_per_s",
    "speech_tokens_per_s",
    "train_ce",
    "heldout_ce",
    "text_gain",
)


def _log_row(path: Path, row: dict[str, object]) -> None:
    new = not path.is_file()
    with path.open("a", encoding="utf-8") as f:
        if new:
            f.write("\t".join(LOG_COLUMNS) + "\n")
        f.write("\t".join(str(row.get(c, "")) for c in LOG_COLUMNS) + "\n")


def train(
    work: Path,
    budget_s: float,
    sizes: dict[str, int] | None = None,
    hyper: Hyper | None = None,
    threads: int | Callable[[], int] = 1,
    merges: int = MERGES,
    say: Any = print,
    max_steps: int | None = None,
    lexicon: Path | None = None,
    lexicon_notice: str = "",
    warm_start: Path | None = None,
    parent: np.ndarray | None = None,
    anneal: int | None = None,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Train for `budget_s` seconds of wall time (evaluations and saves included), or
    until step `max_steps` when given, continuing from DIR/lm/ckpt.pt if there is one;
    returns a summary. A new LM reads phonemes with a `lexicon` (`write_tokenizer`), and
    starts from the weights of another LM's checkpoint, `warm_start`, where their shapes
    agree (`warm_started`; `parent`: the checkpoint's codes are another codebook's, and
    each of ours inherits its parent's rows, `inherit.py`). `anneal` steps end the
    training of a trained LM with a falling learning rate (`Hyper.anneal_steps`); the LM
    before them is kept in `before_anneal_path`. `device`: where it trains (default the
    CPU; `update.train_device`); checkpoints load anywhere. `threads`: torch's threads,
    or a function asked again between steps (`train all --side-by-side`: all of them
    once the flow and the vocoder are trained)."""
    wall0 = time.monotonic()
    torch.set_num_threads(threads() if callable(threads) else threads)
    sizes = sizes or VOICE
    out = lm_dir(work)
    out.mkdir(parents=True, exist_ok=True)
    tok = text_tokenizer(work, sizes, merges, lexicon=lexicon, lexicon_notice=lexicon_notice)
    train_set, heldout = load_examples(work, tok)
    if not train_set:
        raise ValueError(f"{work}: no train utterance has speech tokens")
    ckpt = checkpoint_path(work)
    if ckpt.is_file():
        tr = Trainer.load(ckpt, hyper, device)
        say(f"lm: resuming at step {tr.step} (epoch {tr.epoch})")
        # best.pt holds its own score: a stop between writing it and the checkpoint
        # leaves the checkpoint's record behind the weights kept
        tr.extra |= best_record(work)
    else:
        tr = Trainer.fresh(lm_config(sizes, tokenizer_dir(work)), hyper or Hyper(), device)
        if warm_start is not None:
            kept = warm_started(tr.lm, warm_start, parent)
            say(f"lm: {kept} tensors from {warm_start}; the others start fresh")
    annealed = anneal_span(
        (tr.hyper.anneal_from, tr.hyper.anneal_steps),
        tr.step,
        anneal,
        ckpt,
        before_anneal_path(work),
    )
    tr.hyper = replace(tr.hyper, anneal_from=annealed[0], anneal_steps=annealed[1])
    if anneal:
        before = before_anneal_path(work)
        say(f"lm: annealing over steps {tr.step}-{sum(annealed)} (the LM before: {before})")
    max_steps = anneal_stop(annealed, max_steps)
    h = tr.hyper
    eval_train = random.Random(0).sample(train_set, min(h.eval_train, len(train_set)))
    log = out / "log.tsv"

    # A best score counts only against the held-out set it was measured on: a grown
    # corpus (more held-out sentences spoken) or remade speech is a new set.
    held_set = hashlib.sha256(repr([(e.text, e.speech) for e in heldout]).encode()).hexdigest()
    # Held-out speech after another held-out sentence's text: how much the LM reads its text.
    others = heldout[1:] + heldout[:1]
    mismatched = [Example(o.text, e.speech) for e, o in zip(heldout, others, strict=True)]

    def evaluate() -> tuple[float, float, float]:
        n = 4 * h.batch_positions
        ce_train = cross_entropy(tr.lm, eval_train, n)
        if not heldout:
            return ce_train, math.nan, math.nan
        ce_held = cross_entropy(tr.lm, heldout, n)
        return ce_train, ce_held, cross_entropy(tr.lm, mismatched, n) - ce_held

    def checkpoint() -> tuple[float, float, float]:
        """Evaluate, log and save; returns the two cross-entropies and the time taken."""
        t0 = time.monotonic()
        ce_train, ce_held, gain = evaluate()
        row = {"step": tr.step, "epoch": tr.epoch, "seconds": f"{tr.seconds:.1f}"}
        row |= {"train_ce": f"{ce_train:.4f}", "heldout_ce": f"{ce_held:.4f}"}
        row |= {"text_gain": f"{gain:.4f}"}
        _log_row(log, row)
        same_set = tr.extra.get("best_heldout_set") == held_set
        if ce_held < (tr.extra.get("best_heldout_ce", math.inf) if same_set else math.inf):
            # The weights the export takes: 2 hours of speech overfit an 8 M model within
            # a few epochs (held-out CE rose from 2.32 at epoch 5 to 2.44 at epoch 9
            # while the train CE fell from 1.63 to 0.98).
            tr.extra["best_heldout_ce"] = ce_held
            tr.extra["best_heldout_set"] = held_set
            record = {"model": tr.lm.state_dict(), "step": tr.step}
            save_torch(record | _record_keys(tr.extra), best_path(work))
        tr.save(ckpt)
        return ce_train, ce_held, time.monotonic() - t0

    first = tr.step
    start_ce: tuple[float, float] | None = None
    reserve = 1.0  # time kept for the last checkpoint: as long as the one before
    if tr.step == 0:
        ce_train, ce_held, reserve = checkpoint()
        start_ce = (round(ce_train, 4), round(ce_held, 4))
    last_save = time.monotonic()
    window: list[float] = []
    priors: list[float] = []
    w_t0, w_pos, w_tgt = time.monotonic(), tr.positions_seen, tr.targets_seen
    run_pos0, run_tgt0, run_t = tr.positions_seen, tr.targets_seen, 0.0
    batches = tr.batches(train_set)
    dt = 0.0
    while time.monotonic() - wall0 + reserve + dt < budget_s:
        if max_steps is not None and tr.step >= max_steps:
            break
        if callable(threads) and (n := threads()) != torch.get_num_threads():
            torch.set_num_threads(n)
            say(f"lm: {n} threads from step {tr.step}")
        t0 = time.monotonic()
        window.append(tr.train_step(next(batches)))
        priors.append(tr.last_prior)
        dt = time.monotonic() - t0
        tr.seconds += dt
        run_t += dt
        if tr.step % h.log_every == 0:
            span = time.monotonic() - w_t0
            row = {"step": tr.step, "epoch": tr.epoch, "seconds": f"{tr.seconds:.1f}"}
            row |= {
                "lr": f"{learning_rate(h, tr.step - 1):.2e}",
                "loss": f"{sum(window) / len(window):.4f}",
                "prior": f"{sum(priors) / len(priors):.4f}",
                "positions_per_s": f"{(tr.positions_seen - w_pos) / span:.0f}",
                "speech_tokens_per_s": f"{(tr.targets_seen - w_tgt) / span:.0f}",
            }
            _log_row(log, row)
            window, priors = [], []
            w_t0, w_pos, w_tgt = time.monotonic(), tr.positions_seen, tr.targets_seen
        if time.monotonic() - last_save > h.checkpoint_s:
            _, _, reserve = checkpoint()
            last_save = time.monotonic()
    ce_train, ce_held, _ = checkpoint()
    params = sum(p.numel() for p in tr.lm.parameters())
    summary = {
        "step": tr.step,
        "steps_this_run": tr.step - first,
        "epoch": tr.epoch,
        "train_seconds_total": round(tr.seconds, 1),
        "wall_s": round(time.monotonic() - wall0, 1),
        "parameters": params,
        "positions_per_s": round((tr.positions_seen - run_pos0) / max(run_t, 1e-9), 1),
        "speech_tokens_per_s": round((tr.targets_seen - run_tgt0) / max(run_t, 1e-9), 1),
        "start_ce": start_ce,
        "train_ce": round(ce_train, 4),
        "heldout_ce": round(ce_held, 4),
        "text_vocab": tok.vocab_size,
        "device": str(tr.device),
    }
    say(f"lm: {json.dumps(summary)}")
    return summary


def warm_started(lm: SpeechLM, path: Path, parent: np.ndarray | None = None) -> int:
    """Copy into `lm` each tensor of the checkpoint at `path` (a `ckpt.pt` or `best.pt`)
    whose name and shape it shares; returns how many. Another tokenizer's LM gives all but
    the text embedding (and the text head tied to it): what it learned of speech, of
    the task and of attending along the text is kept, its text ids are not. With
    `parent`, its speech rows are carried to our codes first (`inherit.lm_state`)."""
    theirs = torch.load(path, map_location="cpu", weights_only=True)["model"]
    if parent is not None:
        theirs = inherit.lm_state(theirs, parent)
    own = lm.state_dict()
    same = {k: v for k, v in theirs.items() if k in own and own[k].shape == v.shape}
    lm.load_state_dict(same, strict=False)
    return len(same)


def progress(work: Path) -> tuple[int, tuple[int, int]] | None:
    """The LM checkpoint's step and its anneal's (start, steps) ((0, 0): none), read
    without copying its tensors; None before the first checkpoint."""
    if not checkpoint_path(work).is_file():
        return None
    state = torch.load(checkpoint_path(work), map_location="cpu", weights_only=True, mmap=True)
    hyper = state["hyper"]
    return state["step"], (hyper.get("anneal_from", 0), hyper.get("anneal_steps", 0))


def before_anneal_path(work: Path) -> Path:
    """The checkpoint an anneal started from: to train on at the full rate instead."""
    return lm_dir(work) / "ckpt-before-anneal.pt"


def best_path(work: Path) -> Path:
    """The weights with the lowest held-out cross-entropy so far."""
    return lm_dir(work) / "best.pt"


_RECORD = ("best_heldout_ce", "best_heldout_set")


def _record_keys(extra: dict[str, Any]) -> dict[str, Any]:
    return {k: extra[k] for k in _RECORD if k in extra}


def best_record(work: Path) -> dict[str, Any]:
    """The held-out score best.pt was kept for and the set it was measured on (none for
    a best.pt of earlier runs, or none at all)."""
    if not best_path(work).is_file():
        return {}
    return _record_keys(torch.load(best_path(work), map_location="cpu", weights_only=True))


def export_state(work: Path) -> dict[str, Tensor]:
    """The trained LM's state dict (the best held-out weights if kept, else the last) in
    `llm.pt`'s key layout (text embedding and text head one tensor, as the tied Qwen
    config says)."""
    path = best_path(work) if best_path(work).is_file() else checkpoint_path(work)
    state = torch.load(path, map_location="cpu", weights_only=True)["model"]
    state = {k: v.clone() for k, v in state.items()}
    state[HEAD] = state[EMBED]
    return state


# -- checks -------------------------------------------------------------------------------


def lm_model(work: Path, sizes: dict[str, int] | None = None) -> SpeechModel:
    """The trained LM with its tokenizer, as a SpeechModel the engine's LM thread can run
    (no flow and no vocoder: for checking speech tokens only)."""
    qwen = tokenizer_dir(work)
    cfg = lm_config(sizes or VOICE, qwen)
    lm = SpeechLM(cfg).eval()
    lm.load_state_dict(export_state(work))
    lm.llm.model.lm_head.weight = lm.llm.model.model.embed_tokens.weight
    return SpeechModel(
        name="lm-check",
        random_weights=False,
        lm=lm,
        flow=FlowStage(),
        vocoder=VocoderStage(),
        voices={},
        tokenizer=QwenTextTokenizer(qwen),
        pre_lookahead=3,
        mel_bins=80,
        token_ratio=(cfg.min_tokens_per_text_token, cfg.max_tokens_per_text_token),
        spk_dim=192,
        # as the exported yaml says
        sampling=replace(COSYVOICE2, temperature=TEMPERATURE, top_k=TOP_K, ras_tau=RAS_TAU),
    )


def no_prompt_voice(spk_dim: int = 192) -> Voice:
    return Voice(name="plain", prompt_text_ids=(), prompt_tokens=(), embedding=torch.zeros(spk_dim))


def speak_tokens(
    model: SpeechModel,
    text: str,
    voice: Voice,
    params: SamplingParams | None = None,
    language: str = LANGUAGE,
) -> list[int]:
    """The speech tokens the server's LM thread (`engine.lm_engine.EmbeddedLM`) makes for
    `text` as one segment: encoded, length-bounded and sampled as a turn does."""
    from ..engine.lm_engine import EmbeddedLM

    params = params or SamplingParams()
    text_ids = encode(model.tokenizer, text, language)
    lo, hi = model.token_ratio
    n = len(text_ids)

    async def run() -> list[int]:
        engine = EmbeddedLM(model, max_batch=1)
        engine.start()
        try:
            gen = torch.Generator().manual_seed(params.seed)
            stream = engine.generate(
                text_ids, voice, params, gen, min_len=int(n * lo), max_len=max(1, int(n * hi))
            )
            out: list[int] = []
            async for new in stream:
                out += new
            return out
        finally:
            engine.stop()

    return asyncio.run(run())
