"""CosyVoice2 flow encoder: speech-token embeddings -> mel-rate features, chunk by chunk.

The layout (and every parameter name) is that of the released UpsampleConformerEncoder:
at the token rate a linear embedding, the pre-lookahead convolutions and conformer layers
with relative-position self-attention; then a x2 upsampling convolution, a second linear
embedding and conformer layers at the mel rate, and a final LayerNorm. The released model
has no convolution module and no macaron feed-forward in its conformer layers.

Every layer reads the past through a `Cache`: left context of the causal convolutions and
the keys/values of all earlier positions for attention. Offline, the cache is empty and
keeps nothing, which is exactly the zero left padding of the reference.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..contract import State


class Cache:
    """The streaming state seen by one pass. `st=None` is an offline pass: no past, no
    writes. Writes replace dict entries with new tensors, and what a state's tensors hold
    never changes (keys/values grow into buffer room no tensor covers yet, `append`), so
    a caller's state stays valid (a primed voice state can be reused by many turns)."""

    def __init__(self, st: State | None, reserve: int | None = None) -> None:
        self.st = st
        # Time steps to reserve for the estimator's keys/values (a windowed flow keeps at
        # most a window of them); None: grow as needed.
        self.reserve = reserve

    def conv(self, key: str, conv: nn.Module, x: Tensor) -> Tensor:
        """Causal convolution (a Conv1d, or a module with its `kernel_size` that computes
        one): the last kernel-1 inputs of earlier chunks are the left context."""
        ctx = cast(tuple[int, ...], conv.kernel_size)[0] - 1
        if self.st is None:
            full = F.pad(x, (ctx, 0))
        else:
            full = torch.cat([self.st[key], x], dim=2)
            self.st[key] = full[:, :, full.shape[2] - ctx :]
        return cast(Tensor, conv(full))

    def kv(self, key: str, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys/values [rows, heads, time, dim] of the past followed by those of this chunk."""
        if self.st is None:
            return k, v
        reserve = None if key.startswith("enc.") else self.reserve
        k, v = append(self.st[key + ".k"], k, reserve), append(self.st[key + ".v"], v, reserve)
        self.st[key + ".k"], self.st[key + ".v"] = k, v
        return k, v

    def shared(self, key: str) -> tuple[Tensor, Tensor] | None:
        """Keys/values that come before `kv`'s and are never copied or written: a voice
        prompt's, shared by every turn of the voice (`.pk`, `.pv`); None if there are
        none (they are then part of `kv`'s)."""
        if self.st is None or key + ".pk" not in self.st:
            return None
        return self.st[key + ".pk"], self.st[key + ".pv"]


class _Room:
    """A buffer along time that keys/values grow into; `end`: the furthest step any
    tensor cut from it reaches (steps after it belong to nobody yet)."""

    def __init__(self, buf: Tensor, end: int) -> None:
        self.buf, self.end = buf, end


def append(past: Tensor, new: Tensor, reserve: int | None = None) -> Tensor:
    """`past` followed by `new` along dim 2 (time), without changing `past`.

    A chunk's keys/values are written after the past's in spare room of one buffer, so
    appending costs the chunk, not the whole past (a plain torch.cat copied ~10 MB per
    past token per chunk at full size). Tensors cut from a buffer never see a write:
    only steps past every earlier cut's end are written. So a state stays valid after a
    later chunk ran from it, and a second chunk run from the same state (a primed voice
    reused by many turns, a retry) finds the room taken and copies instead. Tensors
    that did not come from here (sliced, batched, padded) are copied once, then grow.

    A new buffer has a quarter more room than needed, the past then copied once per
    quarter of growth; with a `reserve` (a windowed flow's most steps), twice what is
    needed, up to the reserve: a few copies while a turn grows to its window. (A buffer
    of the whole reserve at once relied on untouched room costing no memory; but freed
    buffers come back from the allocator already touched, so a server's RSS grew with
    every turn: 1 MB per soak cycle with our voice and a 20 s window, measured.)
    """
    n = new.shape[2]
    room, start = getattr(past, "_room", (None, 0))
    end = start + past.shape[2]
    if room is None or room.end != end or end + n > room.buf.shape[2]:
        size = past.shape[2] + n
        capacity = size + max(n, size // 4)
        if reserve is not None:
            capacity = max(capacity, min(reserve, 2 * size))
        buf = past.new_empty(*past.shape[:2], capacity, past.shape[3])
        buf[:, :, : past.shape[2]] = past
        room, start, end = _Room(buf, 0), 0, past.shape[2]
    room.buf[:, :, end : end + n] = new
    room.end = end + n
    return keep_room(room.buf[:, :, start : end + n], room, start)


def keep_room(t: Tensor, room: _Room, start: int) -> Tensor:
    """Mark `t` (steps start.. of room's buffer) as growable in place by `append`."""
    t._room = (room, start)  # type: ignore[attr-defined]
    return t


def drop_front(t: Tensor, steps: int) -> Tensor:
    """`t` without its first `steps` time steps, still growable in place if `t` was."""
    room, start = getattr(t, "_room", (None, 0))
    out = t[:, :, steps:]
    return out if room is None else keep_room(out, room, start + steps)


def attention_mask(
    pad: Tensor, past: int, n: int, block: Tensor | None, valid: Tensor | None = None
) -> Tensor | None:
    """Which keys each of n new queries may read: [rows, 1, n, past + n] (True = read).

    `pad` [rows]: leading cache slots that are padding (states of different lengths
    batched together). `block` [n, n]: restriction among the new positions (offline block
    masks); None lets a chunk read all of itself. `valid` [rows]: new positions of each
    row that are real, the rest trailing padding (training batches of utterances of
    different lengths); None: all. None when nothing is masked.
    """
    if block is None and not bool(pad.any()) and valid is None:
        return None
    keys = torch.arange(past + n, device=pad.device)
    read = keys[None, :] >= pad[:, None]
    if valid is not None:
        read = read & (keys[None, :] < past + valid[:, None])
    mask = read[:, None, None, :].expand(-1, 1, n, -1)
    if block is not None:
        head = torch.ones(n, past, dtype=torch.bool, device=pad.device)
        mask = mask & torch.cat([head, block], dim=1)[None, None]
    return mask


def rel_position_table(rel: Tensor, dim: int) -> Tensor:
    """ESPnet sinusoid of each relative distance in `rel` (query - key): [len(rel), dim]."""
    div = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=rel.device) * -(math.log(10000.0) / dim)
    )
    angle = rel.to(torch.float32)[:, None] * div
    table = torch.zeros(rel.shape[0], dim, device=rel.device)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table


class RelPositionSelfAttention(nn.Module):
    """Transformer-XL style attention: content term (q + u)·k plus position term
    (q + v)·W p(i - j), with p the sinusoid of the relative distance."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.d_k = heads, dim // heads
        self.linear_q = nn.Linear(dim, dim)
        self.linear_k = nn.Linear(dim, dim)
        self.linear_v = nn.Linear(dim, dim)
        self.linear_out = nn.Linear(dim, dim)
        self.linear_pos = nn.Linear(dim, dim, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.d_k))

    def forward(self, x: Tensor, cache: Cache, key: str, mask: Tensor | None) -> Tensor:
        b, n, dim = x.shape
        q = self.linear_q(x).view(b, n, self.heads, self.d_k)
        k, v = cache.kv(
            key,
            self.linear_k(x).view(b, n, self.heads, self.d_k).transpose(1, 2),
            self.linear_v(x).view(b, n, self.heads, self.d_k).transpose(1, 2),
        )
        past = k.shape[2] - n
        # Distances from past + n - 1 down to -(n - 1), in the reference's (descending) order:
        # query i, key j sit at column j + n - 1 - i.
        rel = torch.arange(past + n - 1, -n, -1, device=x.device)
        p = self.linear_pos(rel_position_table(rel, dim).to(x.dtype)).view(-1, self.heads, self.d_k)
        content = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        position = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.permute(1, 2, 0))
        cols = (
            torch.arange(past + n, device=x.device)[None, :]
            + (n - 1 - torch.arange(n, device=x.device))[:, None]
        )
        position = position.gather(3, cols.expand(b, self.heads, n, past + n))
        scores = (content + position) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, -float("inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return cast(Tensor, self.linear_out(out.transpose(1, 2).reshape(b, n, dim)))


class FeedForward(nn.Module):
    def __init__(self, dim: int, units: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(dim, units)
        self.w_2 = nn.Linear(units, dim)

    def forward(self, x: Tensor) -> Tensor:
        return cast(Tensor, self.w_2(F.silu(self.w_1(x))))


class ConformerLayer(nn.Module):
    """Pre-norm attention and feed-forward, each with a residual (no conv module)."""

    def __init__(self, dim: int, heads: int, units: int) -> None:
        super().__init__()
        self.self_attn = RelPositionSelfAttention(dim, heads)
        self.feed_forward = FeedForward(dim, units)
        self.norm_ff = nn.LayerNorm(dim, eps=1e-12)
        self.norm_mha = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: Tensor, cache: Cache, key: str, mask: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.norm_mha(x), cache, key, mask)
        return x + self.feed_forward(self.norm_ff(x))


class LinearEmbed(nn.Module):
    """Linear + LayerNorm, scaled by sqrt(dim) (the positional part is relative)."""

    def __init__(self, din: int, dim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(din, dim), nn.LayerNorm(dim, eps=1e-5))
        self.xscale = math.sqrt(dim)

    def forward(self, x: Tensor) -> Tensor:
        return cast(Tensor, self.out(x)) * self.xscale


class PreLookahead(nn.Module):
    """conv1 reads each token and the next `lookahead`; conv2 is causal; residual."""

    def __init__(self, dim: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(dim, dim, lookahead + 1)
        self.conv2 = nn.Conv1d(dim, dim, 3)

    def forward(self, x: Tensor, cache: Cache) -> Tensor:
        """x [b, dim, m + lookahead] -> [b, dim, m]."""
        y = F.leaky_relu(self.conv1(x))
        return cache.conv("enc.look", self.conv2, y) + x[:, :, : x.shape[2] - self.lookahead]


class Upsample(nn.Module):
    """Nearest-neighbour repeat, then a causal convolution of kernel 2 * stride + 1."""

    def __init__(self, dim: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(dim, dim, 2 * stride + 1)

    def forward(self, x: Tensor, cache: Cache) -> Tensor:
        return cache.conv("enc.up", self.conv, x.repeat_interleave(self.stride, dim=2))


class FlowEncoder(nn.Module):
    def __init__(
        self, dim: int, heads: int, units: int, blocks: int, up_blocks: int, look: int, ratio: int
    ) -> None:
        super().__init__()
        self.embed = LinearEmbed(dim, dim)
        self.after_norm = nn.LayerNorm(dim, eps=1e-5)
        self.pre_lookahead_layer = PreLookahead(dim, look)
        self.encoders = nn.ModuleList(ConformerLayer(dim, heads, units) for _ in range(blocks))
        self.up_layer = Upsample(dim, ratio)
        self.up_embed = LinearEmbed(dim, dim)
        self.up_encoders = nn.ModuleList(
            ConformerLayer(dim, heads, units) for _ in range(up_blocks)
        )

    def cache_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-session state entries; K/V entries have time (size 0 when empty) at dim 2."""
        dim = self.after_norm.normalized_shape[0]
        shapes: dict[str, tuple[int, ...]] = {
            "enc.look": (dim, self.pre_lookahead_layer.conv2.kernel_size[0] - 1),
            "enc.up": (dim, self.up_layer.conv.kernel_size[0] - 1),
        }
        for name, layers in (("enc", self.encoders), ("up", self.up_encoders)):
            for i, layer in enumerate(layers):
                attn = cast(ConformerLayer, layer).self_attn
                for kv in ("k", "v"):
                    shapes[f"{name}.{i}.{kv}"] = (attn.heads, 0, attn.d_k)
        return shapes

    def forward(
        self,
        x: Tensor,
        keep: Tensor,
        cache: Cache,
        token_mask: Tensor | None,
        frame_mask: Tensor | None,
    ) -> Tensor:
        """x [b, m + lookahead, dim] token embeddings, keep [b, m + lookahead] (False: past
        the end) -> [b, ratio * m, dim]."""
        # Past the end, the reference pads the embedded sequence (after the LayerNorm) with
        # zeros; a PAD token must reproduce that, not embed a zero vector.
        h = self.embed(x) * keep[..., None].to(x.dtype)
        h = self.pre_lookahead_layer(h.transpose(1, 2), cache).transpose(1, 2)
        for i, layer in enumerate(self.encoders):
            h = layer(h, cache, f"enc.{i}", token_mask)
        h = self.up_layer(h.transpose(1, 2), cache).transpose(1, 2)
        h = self.up_embed(h)
        for i, layer in enumerate(self.up_encoders):
            h = layer(h, cache, f"up.{i}", frame_mask)
        return cast(Tensor, self.after_norm(h))
