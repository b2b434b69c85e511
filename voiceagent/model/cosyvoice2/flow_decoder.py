"""CosyVoice2 flow-matching estimator: the velocity field v(x_t, mu, spk, cond, t).

A 1-D UNet at the mel rate with one channel width (the released model's `channels: [256]`),
so no stage changes the time resolution: a down stage, `mid_blocks` middle stages and an
up stage that concatenates the down stage's output, each a causal ResNet block followed
by transformer blocks; then a causal output block and a 1x1 projection. Parameter names are
those of the released CausalConditionalDecoder; the transformer blocks follow the
diffusers BasicTransformerBlock layout it uses (self-attention without biases on q/k/v,
exact-GELU feed-forward of width 4 x dim, no cross-attention).

Every causal convolution and every attention reads the past through a `Cache`, so the
estimator can run on a chunk of new frames per Euler step.
"""

from __future__ import annotations

import copy
import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .flow_encoder import Cache


class CausalConv(nn.Conv1d):
    """A stride-1 Conv1d applied to [left context, x]; `cache_key` names its context."""

    def __init__(self, cin: int, cout: int, kernel: int) -> None:
        super().__init__(cin, cout, kernel)
        self.cache_key = ""

    def step(self, x: Tensor, cache: Cache, prefix: str) -> Tensor:
        return cache.conv(prefix + self.cache_key, self, x)


class MatmulConv(nn.Module):
    """A stride-1 Conv1d computed as one matrix product over its `k` shifted inputs: the
    same function (float rounding apart), but a Linear layer, which a quantizer that
    knows Linear layers (`quantize_dynamic`) can make int8. Used by the fast estimator
    (`Estimator.fast_copy`): at the mel rate a chunk has few frames, where oneDNN's
    convolution cost several times the product (0.3-0.6 ms a call at full size)."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        cout, cin, k = conv.weight.shape
        self.kernel_size, self.in_channels = (k,), cin
        self.cache_key = getattr(conv, "cache_key", "")
        self.linear = nn.Linear(cin * k, cout, bias=conv.bias is not None).to(conv.weight)
        with torch.no_grad():  # weight[o, c, j] multiplies input c at shift j: column c*k + j
            self.linear.weight.copy_(conv.weight.reshape(cout, cin * k))
            if conv.bias is not None:
                self.linear.bias.copy_(conv.bias)

    def forward(self, x: Tensor) -> Tensor:
        """[rows, cin, frames + k - 1] -> [rows, cout, frames]."""
        k = self.kernel_size[0]
        cols = x.transpose(1, 2) if k == 1 else x.unfold(2, k, 1).transpose(1, 2).flatten(2)
        return cast(Tensor, self.linear(cols)).transpose(1, 2)

    def step(self, x: Tensor, cache: Cache, prefix: str) -> Tensor:
        return cache.conv(prefix + self.cache_key, self, x)


class _Mish(torch.autograd.Function):
    """F.mish with a backward of plain vectorized ops (training on CPU: aten's
    mish_backward took 14% of a training step, 13x the forward)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return F.mish(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        tsp = torch.tanh(F.softplus(x))
        return grad * (tsp + x * torch.sigmoid(x) * (1 - tsp * tsp))


def mish(x: Tensor) -> Tensor:
    """F.mish; the same values, with a faster backward when a gradient is needed."""
    if torch.is_grad_enabled() and x.requires_grad:
        return cast(Tensor, _Mish.apply(x))
    return F.mish(x)


class CausalBlock(nn.Module):
    """Causal conv -> LayerNorm over channels -> Mish. Only indices 0 and 2 hold weights,
    as in the released model's Sequential(conv, transpose, norm, transpose, mish)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [CausalConv(cin, cout, 3), nn.Identity(), nn.LayerNorm(cout), nn.Identity()]
        )

    def forward(self, x: Tensor, cache: Cache, prefix: str) -> Tensor:
        conv, norm = cast(CausalConv, self.block[0]), self.block[2]
        h = conv.step(x, cache, prefix)
        return mish(norm(h.transpose(1, 2)).transpose(1, 2))


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, time_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_dim, cout))
        self.block1 = CausalBlock(cin, cout)
        self.block2 = CausalBlock(cout, cout)
        self.res_conv = nn.Conv1d(cin, cout, 1)

    def forward(self, x: Tensor, t_emb: Tensor, cache: Cache, prefix: str) -> Tensor:
        h = self.block1(x, cache, prefix) + self.mlp(t_emb)[:, :, None]
        return cast(Tensor, self.block2(h, cache, prefix) + self.res_conv(x))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])
        self.to_qkv: nn.Linear | None = None  # `fuse_qkv`
        self.cache_key = ""

    def fuse_qkv(self) -> None:
        """One projection for q, k and v instead of three (a third of the calls, which at
        a chunk's few frames cost more than their arithmetic); the same values."""
        w = torch.cat([self.to_q.weight, self.to_k.weight, self.to_v.weight])
        self.to_qkv = nn.Linear(w.shape[1], w.shape[0], bias=False).to(w)
        with torch.no_grad():
            self.to_qkv.weight.copy_(w)
        del self.to_q, self.to_k, self.to_v

    def forward(self, x: Tensor, cache: Cache, prefix: str, mask: Tensor | None) -> Tensor:
        b, n, _ = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)

        if self.to_qkv is None:
            q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        else:
            q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        k, v = cache.kv(prefix + self.cache_key, heads(k), heads(v))
        # A cache kept in a narrower type (`CosyFlow.cache_dtype`) is read in that type.
        q = heads(q).to(k.dtype)
        shared = cache.shared(prefix + self.cache_key)
        if shared is None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            o = _two_part_attention(q, shared, (k, v), mask)
        o = o.to(x.dtype).transpose(1, 2).reshape(b, n, -1)
        return cast(Tensor, self.to_out[0](o))


def _two_part_attention(
    q: Tensor, first: tuple[Tensor, Tensor], second: tuple[Tensor, Tensor], mask: Tensor | None
) -> Tensor:
    """Softmax attention over the keys of `first` followed by those of `second`, without
    concatenating them: the first part is a voice prompt's cache, read by every turn and
    copied by none. On the CPU each part goes through torch's flash kernel, which also
    returns each query's log-sum-exp, and the two outputs are weighted by their parts'
    shares of the softmax (float32). Scores and softmax then never exist whole: with a
    turn's 1000 frames of past, a 50-frame chunk's attention took 2.1 ms instead of 5.4
    (float32; 1.5 ms with a bfloat16 cache). Elsewhere the scores are computed whole."""
    (k1, v1), (k2, v2) = first, second
    split = k1.shape[2]
    if split == 0:  # a voice without a prompt (the flash kernel must not see no keys)
        return F.scaled_dot_product_attention(
            q, k2, v2, attn_mask=None if mask is None else mask[..., split:]
        )
    if q.device.type == "cpu" and _flash_cpu is not None:
        extra = None
        if mask is not None:  # the kernel takes an additive mask of the query's type
            extra = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
            extra.masked_fill_(~mask, -float("inf"))
        o1, lse1 = _flash_cpu(q, k1, v1, attn_mask=None if extra is None else extra[..., :split])
        o2, lse2 = _flash_cpu(q, k2, v2, attn_mask=None if extra is None else extra[..., split:])
        top = torch.maximum(lse1, lse2)
        w1, w2 = (lse1 - top).exp()[..., None], (lse2 - top).exp()[..., None]
        return (o1.float() * w1 + o2.float() * w2) / (w1 + w2)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.cat([q @ k1.transpose(-2, -1), q @ k2.transpose(-2, -1)], dim=-1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -float("inf"))
    p = scores.softmax(dim=-1)
    return p[..., :split] @ v1 + p[..., split:] @ v2


# torch's CPU flash attention, which returns the log-sum-exp with the output (a private
# operator of torch 2.x; without it the scores are computed whole)
_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


class GeluProj(nn.Module):
    def __init__(self, din: int, dout: int) -> None:
        super().__init__()
        self.proj = nn.Linear(din, dout)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.ModuleList(
            [GeluProj(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)]
        )

    def forward(self, x: Tensor) -> Tensor:
        return cast(Tensor, self.net[2](self.net[0](x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: Tensor, cache: Cache, prefix: str, mask: Tensor | None) -> Tensor:
        x = x + self.attn1(self.norm1(x), cache, prefix, mask)
        return x + self.ff(self.norm3(x))


class TimestepEmbedding(nn.Module):
    def __init__(self, din: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(din, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return cast(Tensor, self.linear_2(F.silu(self.linear_1(x))))


class Estimator(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        channels: int,
        heads: int,
        head_dim: int,
        n_blocks: int,
        mid_blocks: int,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        time_dim = 4 * channels
        self.time_mlp = TimestepEmbedding(in_channels, time_dim)

        def stage(cin: int, sample: bool) -> nn.ModuleList:
            blocks = nn.ModuleList(
                TransformerBlock(channels, heads, head_dim) for _ in range(n_blocks)
            )
            parts: list[nn.Module] = [ResnetBlock(cin, channels, time_dim), blocks]
            if sample:  # the last (here: only) down/up stage keeps the rate: a causal conv
                parts.append(CausalConv(channels, channels, 3))
            return nn.ModuleList(parts)

        self.down_blocks = nn.ModuleList([stage(in_channels, True)])
        self.mid_blocks = nn.ModuleList(stage(channels, False) for _ in range(mid_blocks))
        self.up_blocks = nn.ModuleList([stage(2 * channels, True)])
        self.final_block = CausalBlock(channels, channels)
        self.final_proj = nn.Conv1d(channels, out_channels, 1)
        # Name each cache slot once, in a fixed order, so a state is a flat dict.
        self.convs: list[CausalConv | MatmulConv] = [
            m for m in self.modules() if isinstance(m, CausalConv)
        ]
        self.attns = [m for m in self.modules() if isinstance(m, Attention)]
        for i, c in enumerate(self.convs):
            c.cache_key = f"c{i}"
        for i, a in enumerate(self.attns):
            a.cache_key = f"a{i}"

    def fast_copy(self) -> Estimator:
        """A copy computing the same function in fewer, larger calls: every convolution
        a matrix product (`MatmulConv`) and each attention's q/k/v one projection. Its
        layers are all Linear, so `quantize_dynamic` can make the whole of it int8."""
        fast = copy.deepcopy(self)
        for a in fast.attns:
            a.fuse_qkv()
        for parent in list(fast.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Conv1d):
                    setattr(parent, name, MatmulConv(child))
        fast.convs = [m for m in fast.modules() if isinstance(m, MatmulConv) and m.cache_key]
        return fast

    def cache_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {
            c.cache_key: (c.in_channels, c.kernel_size[0] - 1) for c in self.convs
        }
        for a in self.attns:
            for kv in ("k", "v"):
                shapes[f"{a.cache_key}.{kv}"] = (a.heads, 0, a.head_dim)
        return shapes

    def time_embedding(self, t: Tensor) -> Tensor:
        """t [rows] -> [rows, 4 * channels] (sinusoid at scale 1000, then the MLP)."""
        half = self.in_channels // 2
        freqs = torch.exp(
            torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1))
        )
        angle = 1000 * t[:, None] * freqs[None, :]
        emb = torch.cat([angle.sin(), angle.cos()], dim=-1).to(t.dtype)
        return cast(Tensor, self.time_mlp(emb))

    def _transformers(
        self, blocks: nn.Module, h: Tensor, cache: Cache, prefix: str, mask: Tensor | None
    ) -> Tensor:
        x = h.transpose(1, 2)
        for block in cast(nn.ModuleList, blocks):
            x = block(x, cache, prefix, mask)
        return x.transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        mu: Tensor,
        spk: Tensor,
        cond: Tensor,
        t_emb: Tensor,
        cache: Cache,
        prefix: str,
        mask: Tensor | None,
    ) -> Tensor:
        """x, mu, cond [rows, mel, frames], spk [rows, mel] -> velocity [rows, mel, frames]."""
        h = torch.cat([x, mu, spk[:, :, None].expand(-1, -1, x.shape[2]), cond], dim=1)
        resnet, blocks, conv = cast(nn.ModuleList, self.down_blocks[0])
        h = self._transformers(blocks, resnet(h, t_emb, cache, prefix), cache, prefix, mask)
        skip = h
        h = cast(CausalConv, conv).step(h, cache, prefix)
        for stage in self.mid_blocks:
            resnet, blocks = cast(nn.ModuleList, stage)
            h = self._transformers(blocks, resnet(h, t_emb, cache, prefix), cache, prefix, mask)
        resnet, blocks, conv = cast(nn.ModuleList, self.up_blocks[0])
        h = resnet(torch.cat([h, skip], dim=1), t_emb, cache, prefix)
        h = cast(CausalConv, conv).step(
            self._transformers(blocks, h, cache, prefix, mask), cache, prefix
        )
        return cast(Tensor, self.final_proj(self.final_block(h, cache, prefix)))
