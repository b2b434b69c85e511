"""The embedded LM's decode step as CUDA graphs.

A decode step of a 24-layer LM is a few hundred small kernels; on a GPU their launch
cost, not the arithmetic, sets its time at small batches. A CUDA graph records one
step's kernels once and replays them with a single launch. A graph's shapes and
addresses are fixed, so the step is written with fixed shapes
(`SpeechLM.forward_embeds(span=...)`: attention over a fixed number of slot positions,
masked per row, with nothing read back to the host) and one graph is captured per
(batch bucket, span bucket): a step of 3 requests whose longest has 300 positions
replays the (4, 512) graph. The bucket's spare rows decode into a scratch KV slot that
no request owns; their logits are dropped.

Inputs are copied into the graphs' own tensors before each replay; the logits are read
from the graph's output tensor, which the next replay overwrites. Every graph shares
one memory pool (only one replays at a time, on the LM thread).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..model.lm import DecoderLayer, KVPool, SpeechLM

MIN_SPAN = 128


def buckets(limit: int, first: int = 1) -> list[int]:
    """Powers of two from `first` up to `limit`, and `limit` itself."""
    out, n = [], first
    while n < limit:
        out.append(n)
        n *= 2
    return [*out, limit]


def bucket(n: int, sizes: Sequence[int]) -> int:
    """The smallest of `sizes` (ascending) that holds `n`."""
    return next(s for s in sizes if s >= n)


class DecodeGraphs:
    """`step(tokens, slots, lengths)`: one decode step, as `SpeechLM.forward_embeds` with
    a span, replayed from a captured graph. `scratch`: a KV slot of `pool` no request
    uses. On CUDA it captures every graph when made (on the LM thread, at start); on the
    CPU, which has no graphs, each step runs the same bucketed computation eagerly
    (what the tests check the bucketing and padding with)."""

    def __init__(
        self,
        lm: SpeechLM,
        pool: KVPool,
        scratch: int,
        max_batch: int,
        layers: Sequence[DecoderLayer] | None = None,
    ) -> None:
        self.lm, self.pool, self.scratch, self.layers = lm, pool, scratch, layers
        self.batches = buckets(max_batch)
        self.spans = buckets(pool.max_len, min(MIN_SPAN, pool.max_len))
        dev = pool.k.device
        top = self.batches[-1]
        self._tokens = torch.zeros(top, dtype=torch.long, device=dev)
        self._slots = torch.full((top,), scratch, dtype=torch.long, device=dev)
        self._start = torch.zeros(top, dtype=torch.long, device=dev)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        if dev.type == "cuda":
            self._pool_handle = torch.cuda.graph_pool_handle()
            # Largest first: later graphs fit in the memory the first one's pool reserved.
            for b in reversed(self.batches):
                for span in reversed(self.spans):
                    self._graphs[(b, span)] = self._capture(b, span)

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def _run(self, b: int, span: int) -> Tensor:
        x = self.lm.embed_speech(self._tokens[:b])
        args = (self.pool, self._slots[:b], self._start[:b], self.layers, span)
        return self.lm.forward_embeds(x, *args)

    def _capture(self, b: int, span: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        # The inputs point at the scratch slot: the warm-up runs really write there.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # first calls (cuBLAS handles, kernels' set-up)
            for _ in range(2):
                self._run(b, span)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool_handle):
            out = self._run(b, span)
        return graph, out

    def step(self, tokens: Sequence[int], slots: Sequence[int], lengths: Sequence[int]) -> Tensor:
        """Logits [len(tokens), speech_vocab] of one decode step: row i's token written
        at position lengths[i] of slot slots[i]. Valid until the next step."""
        n = len(tokens)
        b = bucket(n, self.batches)
        span = bucket(max(lengths) + 1, self.spans)
        pad = b - n
        self._tokens[:b].copy_(torch.tensor([*tokens, *[0] * pad]))
        self._slots[:b].copy_(torch.tensor([*slots, *[self.scratch] * pad]))
        self._start[:b].copy_(torch.tensor([*lengths, *[0] * pad]))
        captured = self._graphs.get((b, span))
        if captured is None:
            return self._run(b, span)[:n]
        graph, out = captured
        graph.replay()
        return out[:n]
