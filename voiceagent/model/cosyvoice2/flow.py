"""CosyVoice2 flow (CausalMaskedDiffWithXvec): speech tokens -> 80-bin mel at 50 Hz.

`CosyFlow` has the released parameter layout key for key (`loader.load_flow_state` loads a
released `flow.pt` state dict and refuses anything else), runs the released inference
offline (`synthesize`), and streams with caches (`initial_state`, `forward_chunk`) so a
chunk late in a turn costs about what an early one does.

Inference, as released: token embeddings -> conformer encoder (25 Hz, then upsampled to
50 Hz) -> a linear projection `mu`; then 10 Euler steps of conditional flow matching on a
cosine time schedule, starting from a fixed noise (seed 0) indexed by absolute mel frame
(our own voice starts part-way, `FlowConfig.start_t`), with classifier-free guidance
(rate 0.7: rows conditioned on mu, speaker and prompt mel, against rows where all
three are zero). The prompt's tokens precede the turn's tokens,
and the prompt's mel conditions the prompt's own frames; those frames are computed and
discarded, but every later frame attends to them.

Masking (the one choice that decides what "offline" means for streaming):
  Each frame attends to every earlier frame and to all frames of its own chunk, in the
  encoder and in the estimator. The released model was trained with full attention or
  with a static chunk mask (25 tokens = 50 frames, grid from the first prompt token),
  which is exactly this rule when chunk boundaries fall on that grid. So streamed chunks
  equal one offline pass whose block mask has the same boundaries (`stream_blocks`).
  Those boundaries include one at the prompt's length minus 3 (where priming stops, see
  below), on the grid only when that is a multiple of 25; otherwise no schedule puts
  every boundary on the grid (measured on small random weights, prompt 50: chunks of
  25 differ from the grid pass by up to 0.18 in log-mel, most in the first frames,
  0.003 later) — unless the state is a grid state (`initial_state(grid=True)`, chunk
  sizes from `grid_sizes`), which primes whole grid blocks only. Other chunkings
  give each frame more (larger chunks) or less (smaller) right context than the 25-token
  grid; a 1-token schedule is plain causal attention. `synthesize(blocks=None)` is the
  released non-streaming pass (full attention), which no streaming scheme can reproduce.
  (The released server also runs its *last* chunk with full attention over the whole
  turn; that needs everything again and is not reproduced here.)

Prompt and lookahead: the last `pre_lookahead` (3) prompt tokens read the first turn
tokens through the lookahead convolution, as in the reference. So `initial_state`
encodes the prompt except those tokens (in grid blocks of `static_chunk_size`) and keeps
them, with their mel, as fixed-size `pending*` entries that the first chunk prepends.
A `primed_tail()` flow instead primes the whole prompt as a finished utterance (its
last tokens read the end padding): the first chunk then runs only its own frames
(8 instead of 14 for 4 tokens), which makes it cheaper (measured at full size, one
thread: 13 % with the int8 estimator, 17 % in float32); the turn's mel moves by at
most 0.05 log-mel (0.6 % of its spread), in the first chunk, 0.006 after a second.

Training (`training_loss`): one pass of the encoder and one estimator call on x_t, with
the offline pass's caches (`Cache(None)`) and masks (full attention, or the static chunk
mask of `static_chunk_size` tokens), plus masked trailing padding; voiceagent/train/
flow_train.py draws the noise, times, prompts and CFG drops.

State layout and batching:
  Fixed-size entries have the session as dim 0 (`frame`, `pad`, `pending*`, the conv
  contexts `enc.look`, `enc.up`); estimator entries `s{step}.*` have the two CFG rows
  of each session (conditioned, unconditioned) at dim 0, interleaved per session.
  Attention keys/values (`*.k`, `*.v`, [rows, heads, time, dim]) hold all past positions
  (`enc.*` at the token rate, the rest at the mel rate), so they grow with the turn.
  A chunk's projections, convolutions and feed-forwards see only its own frames; its
  attention reads the cache, which grows linearly (attention scores and the relative-
  position table are the only work that grows with position).
  The estimator's keys/values of the voice prompt are kept apart (`*.pk`, `*.pv`, set by
  `initial_state`): every turn of the voice reads the same tensors and its own `*.k`,
  `*.v` hold only its frames, so the prompt (about 10 MB per prompt token at full size
  in float32) is neither copied at a turn's first chunk nor held once per turn.
  Attention then runs over the two parts without concatenating them. Batching and
  padding work on the one-part layout (`_merged`), which costs that copy.
  Batching: states with equal cache length concatenate with plain `torch.cat` along dim 0
  (the engine's `cat_states`, grouped by `cache_length`), and any batch splits back with
  `torch.chunk`. States of different lengths concatenate with `CosyFlow.cat_states`,
  which left-pads their caches; `pad` counts each session's padded token slots and those
  keys are masked out. (A fixed-capacity buffer was rejected: ~4.6 MB of estimator K/V per
  frame at full size makes a worst-case capacity unaffordable, and writing into a shared
  buffer would break reuse of a primed voice state by several turns.)

Over 500 lines: one module holds the flow's whole streaming contract (priming, chunks,
the grid, the window, batching) and its training loss, which share private passes.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..contract import PAD_TOKEN, FlowStage, State
from .flow_decoder import Estimator
from .flow_encoder import Cache, FlowEncoder, attention_mask, drop_front


@dataclass(frozen=True)
class FlowConfig:
    """Hyper-parameters; defaults are the released CosyVoice2-0.5B flow."""

    vocab_size: int = 6561
    encoder_dim: int = 512  # token embedding = encoder width (input_size = output_size)
    encoder_heads: int = 8
    encoder_linear_units: int = 2048
    encoder_blocks: int = 6
    up_encoder_blocks: int = 4
    pre_lookahead: int = 3
    token_mel_ratio: int = 2
    mel_bins: int = 80
    spk_embed_dim: int = 192
    decoder_channels: int = 256  # the released `channels: [256]`; one width only
    decoder_heads: int = 8
    attention_head_dim: int = 64
    decoder_blocks: int = 4  # transformer blocks per UNet stage
    mid_blocks: int = 12
    n_timesteps: int = 10
    cfg_rate: float = 0.7
    static_chunk_size: int = 25  # tokens of the released chunk mask; prompt priming grid
    # Where the Euler steps start: 0, the released way, from the noise alone; t0 > 0, a
    # shallow start from the noise and the encoder's mu mixed as the path has them at t0
    # (our own voice, whose encoder is trained to put mu on the mel: `start_t` in the
    # yaml's cfm_params, a key the released files do not have)
    start_t: float = 0.0
    noise_frames: int = 50 * 300  # fixed noise length (300 s); wraps past the end
    noise_seed: int = 0

    def __post_init__(self) -> None:
        if self.encoder_dim % self.encoder_heads:
            raise ValueError("encoder_dim must be a multiple of encoder_heads")
        if self.decoder_blocks < 1 or self.static_chunk_size < 1:
            raise ValueError("decoder_blocks and static_chunk_size must be >= 1")
        if not 0.0 <= self.start_t < 1.0:
            raise ValueError(f"start_t must be in [0, 1), got {self.start_t}")


@dataclass(frozen=True)
class FlowPrompt:
    """A voice's flow prompt: tokens [P], mel [ratio * P, mel_bins], speaker vector [192]
    (a leading batch dim of 1 is accepted on each)."""

    prompt_tokens: Sequence[int] | Tensor
    prompt_mel: Tensor | None
    embedding: Tensor


class VoiceLike(Protocol):
    """Anything with a voice's prompt fields (voiceagent's `Voice` qualifies)."""

    @property
    def prompt_tokens(self) -> Sequence[int] | Tensor: ...
    @property
    def prompt_mel(self) -> Tensor | None: ...
    @property
    def embedding(self) -> Tensor: ...


def _kv_rate(key: str, ratio: int) -> int | None:
    """Time steps per token of a K/V cache entry; None for fixed-size entries."""
    if not key.endswith((".k", ".v")):
        return None
    return 1 if key.startswith("enc.") else ratio


def _merged(st: State) -> State:
    """The state with each shared prompt part (`.pk`, `.pv`) put in front of its turn's
    own keys/values (a copy): the one-part layout batching and padding work on."""
    if "s0.a0.pk" not in st:
        return st
    out = {k: v for k, v in st.items() if not k.endswith((".pk", ".pv"))}
    for key in st:
        if key.endswith((".pk", ".pv")):
            own = key[:-3] + "." + key[-1]  # "x.pk" -> "x.k"
            out[own] = torch.cat([st[key], st[own]], dim=2)
    return out


SIGMA_MIN = 1e-6  # the released cfm_params' sigma_min


class FlowMatching(nn.Module):
    """Holds the estimator (`decoder.estimator.*`) and the fixed noise (not in the state
    dict, as in the reference: `torch.randn(1, 80, 15000)` right after seeding with 0)."""

    rand_noise: Tensor

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        m = cfg.mel_bins
        self.estimator = Estimator(
            4 * m,
            m,
            cfg.decoder_channels,
            cfg.decoder_heads,
            cfg.attention_head_dim,
            cfg.decoder_blocks,
            cfg.mid_blocks,
        )
        gen = torch.Generator().manual_seed(cfg.noise_seed)
        noise = torch.randn(1, m, cfg.noise_frames, generator=gen)
        self.register_buffer("rand_noise", noise, persistent=False)


class CosyFlow(FlowStage):
    # The estimator's keys/values of a turn's own frames kept for later chunks; None: all.
    # (The voice prompt's, shared, and the encoder's, at the token rate, are all kept.)
    window_frames: int | None = None
    # The whole voice prompt primed, its last tokens' lookahead the end padding
    # (`primed_tail`); False: they wait for the turn's first tokens (exact).
    prompt_primed_to_end: bool = False
    # The type the estimator's keys/values are kept (and attention runs) in; None: the
    # weights' type. (`quantize.reduced_flow`'s int8 flow keeps them in bfloat16.)
    cache_dtype: torch.dtype | None = None

    def __init__(self, cfg: FlowConfig = FlowConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.grid: int | None = cfg.static_chunk_size
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.encoder_dim)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.mel_bins)
        self.encoder = FlowEncoder(
            cfg.encoder_dim,
            cfg.encoder_heads,
            cfg.encoder_linear_units,
            cfg.encoder_blocks,
            cfg.up_encoder_blocks,
            cfg.pre_lookahead,
            cfg.token_mel_ratio,
        )
        self.encoder_proj = nn.Linear(cfg.encoder_dim, cfg.mel_bins)
        self.decoder = FlowMatching(cfg)

    @property
    def estimator(self) -> Estimator:
        return self.decoder.estimator

    # -- one pass over new tokens (shared by offline, priming and streaming) ---------------

    def _schedule(self, like: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(t, dt) per Euler step, accumulated in the reference's order and precision."""
        n, t0 = self.cfg.n_timesteps, self.cfg.start_t
        span = torch.linspace(0, 1, n + 1, device=like.device, dtype=like.dtype)
        span = 1 - torch.cos(span * 0.5 * torch.pi)
        if t0:  # the same cosine steps over [t0, 1]
            span = t0 + (1 - t0) * span
        t, dt = span[0], span[1] - span[0]
        steps = []
        for i in range(1, n + 1):
            steps.append((t, dt))
            t = t + dt
            if i < n:
                dt = span[i + 1] - t
        return steps

    def _speaker(self, spk: Tensor) -> Tensor:
        return cast(Tensor, self.spk_embed_affine_layer(F.normalize(spk, dim=1)))

    def _encode(
        self,
        tokens: Tensor,
        cache: Cache,
        pad: Tensor,
        past: int,
        block: Tensor | None,
        valid: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """mu [b, mel, ratio * m] of m new tokens (tokens [b, m + lookahead], PAD_TOKEN past
        the end) and the frame-rate attention mask the estimator uses with it. valid [b]:
        real tokens of each row (training batches), None: all m."""
        cfg, r = self.cfg, self.cfg.token_mel_ratio
        m = tokens.shape[1] - cfg.pre_lookahead
        frame_block = None
        if block is not None:
            frame_block = block.repeat_interleave(r, 0).repeat_interleave(r, 1)
        token_mask = attention_mask(pad, past, m, block, valid)
        frame_mask = attention_mask(
            pad * r, past * r, m * r, frame_block, None if valid is None else valid * r
        )
        emb = self.input_embedding(tokens.clamp(min=0))
        h = self.encoder(emb, tokens >= 0, cache, token_mask, frame_mask)
        return self.encoder_proj(h).transpose(1, 2), frame_mask

    def _advance(
        self,
        tokens: Tensor,
        spk: Tensor,
        cond: Tensor,
        cache: Cache,
        frame0: Tensor,
        pad: Tensor,
        past: int,
        block: Tensor | None,
    ) -> Tensor:
        """Mel of m new tokens. tokens [b, m + lookahead] (PAD_TOKEN past the end),
        spk [b, mel] (projected), cond [b, mel, ratio * m] (prompt mel or zeros),
        frame0 [b] absolute mel frame of the first new frame, pad [b] padded token slots
        and `past` token positions in the cache, block [m, m] offline token block mask."""
        cfg = self.cfg
        b = tokens.shape[0]
        mu, frame_mask = self._encode(tokens, cache, pad, past, block)
        frames = mu.shape[2]
        noise = self.decoder.rand_noise[0]
        idx = (frame0[:, None] + torch.arange(frames, device=mu.device)) % noise.shape[1]
        x = noise[:, idx].permute(1, 0, 2).to(mu.dtype)  # [b, mel, frames]
        if t0 := cfg.start_t:  # the flow's path at t0, with mu standing in for the mel
            x = (1 - (1 - SIGMA_MIN) * t0) * x + t0 * mu
        # CFG rows per session: (conditioned, unconditioned), interleaved.
        mu2 = torch.stack([mu, torch.zeros_like(mu)], 1).flatten(0, 1)
        spk2 = torch.stack([spk, torch.zeros_like(spk)], 1).flatten(0, 1)
        cond2 = torch.stack([cond, torch.zeros_like(cond)], 1).flatten(0, 1)
        mask2 = None if frame_mask is None else frame_mask.repeat_interleave(2, 0)
        w = cfg.cfg_rate
        for s, (t, dt) in enumerate(self._schedule(mu)):
            t_emb = self.estimator.time_embedding(t.expand(2 * b))
            v = self.estimator(
                x.repeat_interleave(2, 0), mu2, spk2, cond2, t_emb, cache, f"s{s}.", mask2
            )
            x = x + dt * ((1.0 + w) * v[0::2] - w * v[1::2])
        return x

    # -- offline ---------------------------------------------------------------------------

    def _block_mask(self, total: int, blocks: int | Sequence[int] | None) -> Tensor | None:
        if blocks is None:
            return None
        dev = self.encoder_proj.weight.device
        if isinstance(blocks, int):
            ids = torch.arange(total, device=dev) // blocks
        else:
            if sum(blocks) != total or min(blocks, default=1) < 1:
                raise ValueError(f"blocks {list(blocks)} must be >= 1 and sum to {total}")
            sizes = torch.tensor(list(blocks), device=dev)
            ids = torch.repeat_interleave(torch.arange(len(blocks), device=dev), sizes)
        return cast(Tensor, ids[None, :] <= ids[:, None])

    @torch.inference_mode()
    def synthesize(
        self,
        tokens: Tensor,
        prompt_tokens: Tensor,
        prompt_mel: Tensor,
        spk: Tensor,
        blocks: int | Sequence[int] | None = None,
    ) -> Tensor:
        """One pass as the released `inference(..., finalize=True)`.

        tokens [b, N], prompt_tokens [b, P], prompt_mel [b, ratio * P, mel] (time-major, as
        the reference's prompt_feat), spk [b, 192] -> mel [b, mel, ratio * N].
        blocks: None = full attention (released non-streaming); an int c = static chunk
        mask of c tokens from the first prompt token (released streaming, c = 25); a list
        = explicit token blocks summing to P + N (see `stream_blocks`).
        """
        cfg, r = self.cfg, self.cfg.token_mel_ratio
        b, p = prompt_tokens.shape
        if prompt_mel.shape != (b, r * p, cfg.mel_bins):
            raise ValueError(
                f"prompt_mel must be [{b}, {r * p}, {cfg.mel_bins}], got {tuple(prompt_mel.shape)}"
            )
        dev = self.encoder_proj.weight.device
        ahead = torch.full((b, cfg.pre_lookahead), PAD_TOKEN, device=dev, dtype=torch.long)
        all_tokens = torch.cat([prompt_tokens.to(dev).long(), tokens.to(dev).long(), ahead], 1)
        total = all_tokens.shape[1] - cfg.pre_lookahead
        cond = self.encoder_proj.weight.new_zeros(b, cfg.mel_bins, r * total)
        cond[:, :, : r * p] = prompt_mel.transpose(1, 2)
        zeros = torch.zeros(b, dtype=torch.long, device=dev)
        x = self._advance(
            all_tokens,
            self._speaker(spk.to(dev, cond.dtype)),
            cond,
            Cache(None),
            zeros,
            zeros,
            0,
            self._block_mask(total, blocks),
        )
        return x[:, :, r * p :]

    def grid_sizes(self, prompt_len: int, n_tokens: int) -> list[int]:
        """Chunk sizes of a grid turn (`initial_state(grid=True)`) of n_tokens that end on
        grid lines: the first fills the prompt's last grid block, then whole blocks."""
        sizes, pos = [], prompt_len
        while pos < prompt_len + n_tokens:
            n = min(
                self.cfg.static_chunk_size - pos % self.cfg.static_chunk_size,
                prompt_len + n_tokens - pos,
            )
            sizes.append(n)
            pos += n
        return sizes

    # -- training --------------------------------------------------------------------------

    def training_loss(
        self,
        tokens: Tensor,
        lengths: Tensor,
        mel: Tensor,
        cond: Tensor,
        spk: Tensor,
        t: Tensor,
        noise: Tensor,
        keep: Tensor,
        streaming: bool,
        sigma_min: float = SIGMA_MIN,
        prior: float = 0.0,
    ) -> Tensor:
        """The conditional flow matching loss of one batch, with gradients: the released
        training forward (CausalMaskedDiffWithXvec.forward, CausalConditionalCFM.compute_loss)
        through the modules and masks inference uses; the draws are the caller's.

        tokens [b, N + lookahead] (each row's `lengths` [b] tokens, then its lookahead:
        the tokens that follow, or PAD_TOKEN past the utterance's end, then PAD_TOKEN),
        mel [b, mel, ratio * N] the target, cond [b, mel, ratio * N] the prompt condition
        (a prefix of the target, zeros after it), spk [b, 192] speaker vectors, t [b] flow
        times in [0, 1], noise like mel (x at t = 0), keep [b] (False: mu, speaker and
        prompt condition all zero, the CFG training drop), streaming: the static chunk
        mask (`static_chunk_size` tokens from the first) instead of full attention.
        Returns the mean squared error of the predicted velocity over the real frames,
        plus `prior` times that of the encoder's output mu against the target mel (a
        training aid the reference does not have, Grad-TTS's and Matcha-TTS's prior loss:
        mu is already in mel space, and pulling it onto the mel makes the tokens' reading
        a plain regression that the decoder then only refines; inference is unchanged).
        """
        cfg, r = self.cfg, self.cfg.token_mel_ratio
        b, n = tokens.shape[0], tokens.shape[1] - cfg.pre_lookahead
        zeros = torch.zeros(b, dtype=torch.long, device=tokens.device)
        block = self._block_mask(n, cfg.static_chunk_size if streaming else None)
        mu, mask = self._encode(tokens, Cache(None), zeros, 0, block, lengths)
        on = keep.to(mu.dtype)
        tt = t.to(mu.dtype)[:, None, None]
        x_t = (1 - (1 - sigma_min) * tt) * noise + tt * mel
        target = mel - (1 - sigma_min) * noise
        v = self.estimator(
            x_t,
            mu * on[:, None, None],
            self._speaker(spk.to(mu.dtype)) * on[:, None],
            cond * on[:, None, None],
            self.estimator.time_embedding(t.to(mu.dtype)),
            Cache(None),
            "",
            mask,
        )
        real = torch.arange(r * n, device=mu.device)[None, :] < r * lengths[:, None]
        real = real[:, None, :].to(mu.dtype)
        per_value = real.sum() * cfg.mel_bins
        loss = ((v - target) ** 2 * real).sum() / per_value
        if prior:
            loss = loss + prior * ((mu - mel) ** 2 * real).sum() / per_value
        return loss

    def stream_blocks(self, prompt_len: int, schedule: Sequence[int], n_tokens: int) -> list[int]:
        """Token blocks of the offline pass that equals streaming `n_tokens` with chunk
        sizes `schedule` (its last size repeats) after `initial_state` of a prompt of
        `prompt_len` tokens."""
        grid, k = self.cfg.static_chunk_size, min(self.cfg.pre_lookahead, prompt_len)
        primed = prompt_len - k
        blocks = [min(grid, primed - a) for a in range(0, primed, grid)]
        done, i = 0, 0
        while done < n_tokens:
            n = min(schedule[min(i, len(schedule) - 1)], n_tokens - done)
            blocks.append(n + (k if i == 0 else 0))
            done, i = done + n, i + 1
        if n_tokens == 0 and k:
            blocks.append(k)
        return blocks

    # -- streaming -------------------------------------------------------------------------

    def empty_state(self, batch: int = 1) -> State:
        """A state with nothing cached (no prompt)."""
        cfg = self.cfg
        w = self.encoder_proj.weight
        st: State = {
            "frame": torch.zeros(batch, dtype=torch.long, device=w.device),
            "pad": torch.zeros(batch, dtype=torch.long, device=w.device),
            "pending": torch.full(
                (batch, cfg.pre_lookahead), PAD_TOKEN, dtype=torch.long, device=w.device
            ),
            "pending_n": torch.zeros(batch, dtype=torch.long, device=w.device),
            # > 0: chunks are masked on this token grid (`initial_state(grid=True)`)
            "grid": torch.zeros(batch, dtype=torch.long, device=w.device),
            "pending_cond": w.new_zeros(
                batch, cfg.mel_bins, cfg.token_mel_ratio * cfg.pre_lookahead
            ),
        }
        for key, shape in self.encoder.cache_shapes().items():
            st[key] = w.new_zeros(batch, *shape)
        for s in range(cfg.n_timesteps):
            for key, shape in self.estimator.cache_shapes().items():
                st[f"s{s}.{key}"] = w.new_zeros(2 * batch, *shape, dtype=self.cache_dtype)
        return st

    @torch.inference_mode()
    def initial_state(self, prompt: VoiceLike, grid: bool = False) -> State:
        """A one-session state primed with the voice's prompt (tokens, mel, speaker).

        The result only depends on the voice: compute it once per voice and reuse it for
        every turn (`forward_chunk` never modifies a state it is given).

        `grid`: the state of a turn whose chunks follow the released model's static
        chunk grid (25 tokens from the first prompt token): only whole grid blocks of
        the prompt are primed, the rest (3 to 27 tokens) waits for the first chunk, and
        a chunk that spans a grid line is masked as the grid's blocks are. Chunks that
        end on grid lines (`stream_sizes`) then give exactly the released streaming
        pass, `synthesize(blocks=25)`.
        """
        cfg, r, look = self.cfg, self.cfg.token_mel_ratio, self.cfg.pre_lookahead
        w = self.encoder_proj.weight
        tokens = torch.as_tensor(prompt.prompt_tokens, device=w.device).long().reshape(-1)
        p = tokens.shape[0]
        mel = prompt.prompt_mel
        if mel is None:
            mel = w.new_zeros(0, cfg.mel_bins)
        mel = mel.to(w.device, w.dtype).reshape(-1, cfg.mel_bins)
        if mel.shape[0] != r * p:
            raise ValueError(f"prompt mel has {mel.shape[0]} frames for {p} tokens (need {r * p})")
        spk = self._speaker(prompt.embedding.to(w.device, w.dtype).reshape(1, -1))
        cond = mel.t()[None]  # [1, mel, frames]
        st = self.empty_state(1)
        k = min(look, p)
        primed = p - k
        width = look
        if grid:
            primed = max(0, p - look) // self.cfg.static_chunk_size * self.cfg.static_chunk_size
            k, width = p - primed, look + self.cfg.static_chunk_size - 1
            st["pending"] = torch.full((1, width), PAD_TOKEN, dtype=torch.long, device=w.device)
            st["pending_cond"] = w.new_zeros(1, cfg.mel_bins, r * width)
            st["grid"] = torch.full_like(st["grid"], self.cfg.static_chunk_size)
        elif self.prompt_primed_to_end:
            primed, k = p, 0
            tokens = torch.cat([tokens, tokens.new_full((look,), PAD_TOKEN)])
        for a in range(0, primed, cfg.static_chunk_size):
            e = min(a + cfg.static_chunk_size, primed)
            self._advance_state(tokens[None, a : e + look], spk, cond[:, :, r * a : r * e], st)
        # The estimator's keys/values of the prompt become a shared part that turns read
        # and never copy (a turn's state holds its own frames only).
        for key in [k for k in st if k.startswith("s") and k.endswith((".k", ".v"))]:
            st[key[:-2] + ".p" + key[-1]] = st[key].clone()  # without `append`'s spare room
            st[key] = st[key].new_empty(*st[key].shape[:2], 0, st[key].shape[3])
        st["pending"] = torch.cat([st["pending"][:, k:], tokens[None, primed : primed + k]], 1)
        st["pending_cond"] = torch.cat(
            [st["pending_cond"][:, :, r * k :], cond[:, :, r * primed :]], 2
        )
        st["pending_n"] = st["pending_n"] + k
        return st

    def _advance_state(
        self, tokens: Tensor, spk: Tensor, cond: Tensor, st: State, block: Tensor | None = None
    ) -> Tensor:
        """Run new tokens against a state (updated in the dict, tensors replaced)."""
        past = self.cache_length(st)
        w = self.window_frames
        # Room for a window and a quarter: the kept window is copied once per quarter.
        cache = Cache(st, None if w is None else w + w // 4)
        x = self._advance(tokens, spk, cond, cache, st["frame"], st["pad"], past, block)
        st["frame"] = st["frame"] + x.shape[2]
        return x

    @torch.inference_mode()
    def forward_chunk(self, tokens: Tensor, spk: Tensor, state: State) -> tuple[Tensor, State]:
        """tokens [b, n + 3] (the chunk's n tokens, then 3 lookahead tokens or PAD_TOKEN past
        the end), spk [b, 192] -> (mel [b, mel, ratio * n], new state). The input state is
        not modified."""
        cfg, r = self.cfg, self.cfg.token_mel_ratio
        b, n = tokens.shape[0], tokens.shape[1] - cfg.pre_lookahead
        tokens = tokens.to(self.encoder_proj.weight.device).long()
        if n <= 0:
            return self.encoder_proj.weight.new_zeros(b, cfg.mel_bins, 0), dict(state)
        pending, grid = state["pending_n"], state["grid"]
        apart = bool((pending != pending[0]).any() or (grid != grid[0]).any())
        if b > 1 and (apart or bool(grid.any() and state["pad"].any())):
            # First chunks (prompt tail pending) and later chunks, or chunks on the grid
            # at different positions: run apart, rejoin in order.
            sessions = self.split_states(state, b)
            outs = [
                self.forward_chunk(tokens[i : i + 1], spk[i : i + 1], s)
                for i, s in enumerate(sessions)
            ]
            return torch.cat([o[0] for o in outs]), self.cat_states([o[1] for o in outs])
        st = dict(state)
        if bool(st["pad"].any()):  # padded slots are dropped from the one-part layout
            st = self._trim(_merged(st))
        k, width = int(pending[0]), st["pending"].shape[1]
        cond = self.encoder_proj.weight.new_zeros(b, cfg.mel_bins, r * n)
        if k:
            tokens = torch.cat([st["pending"][:, width - k :], tokens], 1)
            cond = torch.cat([st["pending_cond"][:, :, r * (width - k) :], cond], 2)
            st["pending"] = torch.full_like(st["pending"], PAD_TOKEN)
            st["pending_cond"] = torch.zeros_like(st["pending_cond"])
            st["pending_n"] = torch.zeros_like(st["pending_n"])
        block = None
        if int(grid[0]):  # the grid's blocks among this chunk's positions
            first = int(st["frame"][0]) // r  # token position (the window may drop keys)
            ids = (first + torch.arange(k + n, device=tokens.device)) // int(grid[0])
            block = ids[None, :] <= ids[:, None] if ids[0] != ids[-1] else None
        x = self._advance_state(
            tokens, self._speaker(spk.to(cond.device, cond.dtype)), cond, st, block
        )
        if self.window_frames is not None:
            self._forget(st, self.window_frames)
        return x[:, :, r * k :], st

    def windowed(self, tokens: int) -> CosyFlow:
        """The same flow (shared weights and buffers) whose estimator attends to at most
        the last `tokens` of a turn's own past (and the whole voice prompt): the state's
        largest part, ~9 MB per token at full size in float32, stops growing there. Frames
        further back are no longer read, so the mel of a longer turn moves a little
        (`voiceagent bench --scenario first-packet` measures how much). Needs the
        two-part layout: with `acoustic_batching = "batched"` nothing is forgotten."""
        other = copy.copy(self)  # shallow: parameters and buffers are the same tensors
        other.window_frames = tokens * self.cfg.token_mel_ratio
        return other

    def primed_tail(self) -> CosyFlow:
        """The same flow (shared weights and buffers) whose `initial_state` primes the
        whole prompt, its last 3 tokens reading the end padding instead of the turn's
        first tokens: a turn's first chunk runs its own frames only (see the module
        docstring for the cost and the error). Grid states are unchanged."""
        other = copy.copy(self)  # shallow: parameters and buffers are the same tensors
        other.prompt_primed_to_end = True
        return other

    def cache_in(self, dtype: torch.dtype) -> CosyFlow:
        """The same flow (shared weights and buffers) keeping the estimator's keys/values
        in `dtype`, its attention computed in it. At full size in bfloat16: 4.6 MB per
        token instead of 9.2, a long turn's chunks a little quicker (less to read), the
        streamed mel within 0.002 of float32's."""
        other = copy.copy(self)  # shallow: parameters and buffers are the same tensors
        other.cache_dtype = dtype
        return other

    def _forget(self, st: State, frames: int) -> None:
        if "s0.a0.pk" not in st:  # one-part layout (a padded batch): the prompt is in .k
            return
        for key, v in st.items():
            if key.startswith("s") and key.endswith((".k", ".v")) and v.shape[2] > frames:
                st[key] = drop_front(v, v.shape[2] - frames)

    # -- batching --------------------------------------------------------------------------

    def cache_length(self, state: State) -> int:
        """Token positions held by the attention caches (padding included): states with
        equal lengths concatenate with plain torch.cat."""
        shared = state["s0.a0.pk"].shape[2] if "s0.a0.pk" in state else 0
        return (shared + state["s0.a0.k"].shape[2]) // self.cfg.token_mel_ratio

    def _trim(self, st: State) -> State:
        """Drop cache slots that are padding in every row (views, no copy)."""
        drop = int(st["pad"].min()) if st["pad"].numel() else 0
        if drop:
            for key, v in st.items():
                rate = _kv_rate(key, self.cfg.token_mel_ratio)
                if rate is not None:
                    st[key] = v[:, :, rate * drop :]
            st["pad"] = st["pad"] - drop
        return st

    def cat_states(self, states: Sequence[State]) -> State:
        """Concatenate session states of any cache lengths (shorter ones are left-padded
        and masked); undo with `split_states` or torch.chunk along dim 0."""
        trimmed = [self._trim(_merged(dict(s))) for s in states]
        longest = max(self.cache_length(s) for s in trimmed)
        out: State = {}
        for key in trimmed[0]:
            rate = _kv_rate(key, self.cfg.token_mel_ratio)
            parts = []
            for s in trimmed:
                v = s[key]
                extra = longest - self.cache_length(s)
                if rate is not None and extra:
                    v = F.pad(v, (0, 0, rate * extra, 0))
                elif key == "pad":
                    v = v + extra
                parts.append(v)
            out[key] = torch.cat(parts)
        return out

    def split_states(self, state: State, n: int) -> list[State]:
        parts = {k: torch.chunk(v, n, dim=0) for k, v in state.items()}
        return [{k: parts[k][i] for k in state} for i in range(n)]
