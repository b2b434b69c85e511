"""Semantic speech-token LM: a Qwen2-style decoder with a speech head.

Module names follow CosyVoice2's `llm.pt` (`llm.model.model.layers.N.self_attn.q_proj`,
`speech_embedding`, `llm_embedding`, `llm_decoder`) so the released weights load into
the same classes. KV state lives in a slot pool owned by the engine, so decode steps of
many turns run as one batch while each turn keeps its own cache rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .contract import SPEECH_CODES, STOP_TOKENS

SOS_ROW, TASK_ROW = 0, 1  # rows of `llm_embedding`


@dataclass(frozen=True)
class LMConfig:
    """The LM's hyper-parameters; the defaults are the tiny model's (CosyVoice2's are read
    from its files by cosyvoice2/lm_config.py)."""

    text_vocab: int = 259  # byte tokenizer: 256 bytes + 3 reserved
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    max_positions: int = 4096
    # Decode length bounds, relative to the number of text tokens of the segment.
    min_tokens_per_text_token: float = 0.5
    max_tokens_per_text_token: float = 2.0

    @property
    def speech_vocab(self) -> int:
        return SPEECH_CODES + len(STOP_TOKENS)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class KVPool:
    """Preallocated key/value rows: [layers, slots, kv_heads, max_len, head_dim], in the
    LM's weight type."""

    def __init__(
        self,
        cfg: LMConfig,
        slots: int,
        max_len: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (cfg.layers, slots, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len


def _rotate_half(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * hd, bias=True)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=True)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=True)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        pool: KVPool,
        layer: int,
        slots: Tensor,
        start: Tensor,
        span: int | None = None,
    ) -> Tensor:
        cfg = self.cfg
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = rope  # [b, 1, t, hd]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin

        pk, pv = pool.k[layer], pool.v[layer]
        if t == 1:  # decode: each row writes one position of its own slot
            pk[slots, :, start] = k[:, :, 0]
            pv[slots, :, start] = v[:, :, 0]
            if span is not None:
                return self.o_proj(_decode_attention(q, pk, pv, slots, start, span))
        else:
            for i in range(b):
                s, p = int(slots[i]), int(start[i])
                pk[s, :, p : p + t] = k[i]
                pv[s, :, p : p + t] = v[i]
        total = int((start + t).max())
        keys, values = pk[slots, :, :total], pv[slots, :, :total]
        rep = cfg.heads // cfg.kv_heads
        keys = keys.repeat_interleave(rep, dim=1)
        values = values.repeat_interleave(rep, dim=1)
        # Row i, query j may see key positions <= start[i] + j (causal, own length only).
        qpos = start[:, None] + torch.arange(t, device=x.device)[None, :]
        mask = torch.arange(total, device=x.device)[None, None, :] <= qpos[:, :, None]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def _decode_attention(
    q: Tensor, pk: Tensor, pv: Tensor, slots: Tensor, start: Tensor, span: int
) -> Tensor:
    """One query per row over its slot's first `span` positions, masked past its own
    (`start`): shapes fixed by `span` alone and no value read back to the host, so the
    step can be captured as a CUDA graph (engine/lm_graphs.py). A key/value head's
    query heads are its queries (grouped-query attention without copying keys)."""
    b, heads, _, hd = q.shape
    kv_heads = pk.shape[1]
    keys, values = pk[slots, :, :span], pv[slots, :, :span]  # [b, kv, span, hd]
    mask = torch.arange(span, device=q.device)[None, :] <= start[:, None]  # [b, span]
    grouped = q.view(b, kv_heads, heads // kv_heads, hd)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask[:, None, None])
    return out.reshape(b, 1, heads * hd)


class MLP(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)


class Backbone(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.text_vocab, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)


class CausalLM(nn.Module):
    """Same key layout as a Hugging Face `Qwen2ForCausalLM` (`model.*`, `lm_head`)."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.model = Backbone(cfg)
        # The text head is part of the released layout; speech decoding never computes it.
        self.lm_head = nn.Linear(cfg.hidden, cfg.text_vocab, bias=False)


class QwenEncoder(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.model = CausalLM(cfg)


class SpeechLM(nn.Module):
    inv_freq: Tensor

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.llm = QwenEncoder(cfg)
        self.llm_embedding = nn.Embedding(2, cfg.hidden)  # sos, task_id
        self.speech_embedding = nn.Embedding(cfg.speech_vocab, cfg.hidden)
        self.llm_decoder = nn.Linear(cfg.hidden, cfg.speech_vocab, bias=True)
        hd = cfg.head_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def prompt_embeds(self, text_ids: list[int], prompt_speech: list[int]) -> Tensor:
        """`[sos, text, task_id, prompt speech tokens]` as embeddings, shape [1, P, H]."""
        dev = self.llm_embedding.weight.device
        sos = self.llm_embedding.weight[SOS_ROW : SOS_ROW + 1]
        task = self.llm_embedding.weight[TASK_ROW : TASK_ROW + 1]
        text = self.llm.model.model.embed_tokens(torch.tensor(text_ids, device=dev))
        speech = self.speech_embedding(torch.tensor(prompt_speech, dtype=torch.long, device=dev))
        return torch.cat([sos, text, task, speech], dim=0)[None]

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freqs = positions[..., None].float() * self.inv_freq  # [b, t, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward_embeds(
        self,
        x: Tensor,
        pool: KVPool,
        slots: Tensor,
        start: Tensor,
        layers: Sequence[DecoderLayer] | None = None,
        span: int | None = None,
    ) -> Tensor:
        """Run new positions of each row through the decoder; returns speech logits of the
        last position of each row, [b, speech_vocab]. `layers`: stand-ins for the decoder
        layers (reduced-precision copies, model/quantize.py). `span` (decode steps only):
        attend over that many slot positions, masked, instead of the rows' longest
        length (`_decode_attention`)."""
        t = x.shape[1]
        rope = self._rope(start[:, None] + torch.arange(t, device=x.device)[None, :], x.dtype)
        backbone = self.llm.model.model
        if layers is None:
            layers = cast(list[DecoderLayer], backbone.layers)
        for i, layer in enumerate(layers):
            h = layer.input_layernorm(x)
            x = x + layer.self_attn(h, rope, pool, i, slots, start, span)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.llm_decoder(backbone.norm(x[:, -1]))

    def embed_speech(self, tokens: Tensor) -> Tensor:
        return self.speech_embedding(tokens)[:, None]
