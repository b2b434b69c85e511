"""Keys/values of a voice's LM prompt prefix, kept across requests.

A CosyVoice2 LM prompt is `[sos, prompt text + segment text, task_id, prompt speech]`:
the segment's text sits between the voice's transcript and its speech tokens, so only
`[sos, prompt text]` is the same in every request of a voice. Those positions' keys and
values are computed once and copied into each new request's KV slot; the prefill then
starts after them. The prompt's speech tokens (most of a prompt) come after the segment
text and attend to it, so they cannot be reused.

The copy is of exactly what a first prefill of the prefix wrote, and every request of
a voice (the first one too) prefills its remainder from that copy, so a request's
tokens do not depend on whether the prefix was cached before it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor

from ..model.lm import DecoderLayer, KVPool, SpeechLM

MAX_PREFIXES = 256  # distinct prefixes kept (least recently used dropped)


class PrefixCache:
    def __init__(self, max_entries: int = MAX_PREFIXES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], tuple[Tensor, Tensor]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._entries.values())

    def fill(
        self,
        lm: SpeechLM,
        key: tuple[int, ...],
        prompt: Tensor,
        pool: KVPool,
        slot: int,
        layers: Sequence[DecoderLayer] | None = None,
    ) -> tuple[int, bool]:
        """Put the keys/values of `prompt`'s first len(key) + 1 positions (sos + the
        voice's text ids `key`) into `slot`, from the cache or computed there and kept;
        return how many positions are filled, and whether they came from the cache."""
        n = len(key) + 1
        cached = self._entries.get(key)
        hit = cached is not None
        if cached is None:
            self.misses += 1
            ids = torch.tensor([slot], device=prompt.device)
            start = torch.zeros(1, dtype=torch.long, device=prompt.device)
            lm.forward_embeds(prompt[:, :n], pool, ids, start, layers)
            cached = (pool.k[:, slot, :, :n].clone(), pool.v[:, slot, :, :n].clone())
            self._entries[key] = cached
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        else:
            self.hits += 1
            self._entries.move_to_end(key)
            pool.k[:, slot, :, :n] = cached[0]
            pool.v[:, slot, :, :n] = cached[1]
        return n, hit
