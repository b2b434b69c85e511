"""What every model provides the engine, whichever implementation (tiny/, cosyvoice2/):

- the speech-token vocabulary the LM emits and the flow reads, and `PAD_TOKEN`;
- `State`: a stage's streaming state, and how states of several sessions batch;
- `Voice`: the prompt and speaker conditioning of a role;
- `FlowStage` (tokens -> mel) and `VocoderStage` (mel -> PCM), chunk by chunk.

The LM stage is one class for every model, `lm.SpeechLM` (a Qwen2-style decoder);
`speech_model.SpeechModel` puts the three stages, voices and a text tokenizer together.

A stage's streaming state is a flat `dict[str, Tensor]` whose tensors all have the
session (or session x CFG branch) as their leading dimension. That one convention lets
the engine batch chunks of many turns by concatenating states and split them back after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

SPEECH_CODES = 6561  # FSQ codebook of the CosyVoice2 speech tokenizer
EOS_TOKEN = 6561  # first LM special after the codes
STOP_TOKENS = (6561, 6562, 6563)
PAD_TOKEN = -1  # embeds to zeros, like the end-of-utterance padding of an offline pass

State = dict[str, Tensor]


def cat_states(states: list[State]) -> State:
    return {k: torch.cat([s[k] for s in states], dim=0) for k in states[0]}


def split_state(state: State, n: int) -> list[State]:
    """Undo `cat_states` of n states (each tensor splits into n equal row blocks)."""
    parts = {k: torch.chunk(v, n, dim=0) for k, v in state.items()}
    return [{k: parts[k][i] for k in state} for i in range(n)]


@dataclass(frozen=True)
class Voice:
    """A role: the prompt the LM continues from and the speaker conditioning of the flow."""

    name: str
    prompt_text_ids: tuple[int, ...]  # the transcript of the prompt audio, as text tokens
    prompt_tokens: tuple[int, ...]  # speech tokens of the prompt audio
    embedding: Tensor  # speaker vector of the flow, [spk_dim]
    prompt_mel: Tensor | None = None  # [frames, 80] mel of the prompt audio, if the model uses it
    # False: the LM gets neither the prompt's text nor its speech tokens, only the flow
    # uses the prompt (CosyVoice2's "cross-lingual" mode: a voice made without the
    # transcript of its reference audio). True: the zero-shot prompt, as before.
    lm_prompt: bool = True

    @property
    def lm_text_ids(self) -> tuple[int, ...]:
        """The text tokens the LM's prompt starts with (before a segment's own)."""
        return self.prompt_text_ids if self.lm_prompt else ()

    @property
    def lm_speech_tokens(self) -> tuple[int, ...]:
        """The speech tokens the LM continues from."""
        return self.prompt_tokens if self.lm_prompt else ()


class FlowStage(nn.Module):
    """Speech tokens -> mel, chunk by chunk."""

    # Tokens per block of the static chunk grid the model was trained with (streamed
    # chunks that end on its lines reproduce its authors' streaming); None: no grid.
    grid: int | None = None

    def initial_state(self, voice: Voice, grid: bool = False) -> State:
        """Per-turn state of one session, primed with the voice's prompt if the model
        uses one; `grid`: for chunks on the grid (`grid_sizes`), if the model has one."""
        raise NotImplementedError

    def grid_sizes(self, prompt_len: int, n_tokens: int) -> list[int]:
        """Chunk sizes that keep a grid turn of n_tokens on the grid (no grid: one chunk)."""
        return [n_tokens]

    def forward_chunk(self, tokens: Tensor, spk: Tensor, state: State) -> tuple[Tensor, State]:
        """tokens [b, n + lookahead] (PAD_TOKEN past the end) -> mel [b, bins, frames] and
        the new state (the input state is not mutated)."""
        raise NotImplementedError

    def cat_states(self, states: Sequence[State]) -> State:
        """One batch state from several sessions' states (override for ragged caches)."""
        return cat_states(list(states))

    def split_states(self, state: State, n: int) -> list[State]:
        return split_state(state, n)

    def windowed(self, tokens: int) -> FlowStage:
        """This flow (the same weights) reading back at most `tokens` of a turn's own
        past, so that its per-turn state stops growing. A flow whose state does not grow
        returns itself."""
        return self

    def primed_tail(self) -> FlowStage:
        """This flow (the same weights) priming a voice prompt to its end, as a finished
        utterance: a turn's first chunk then runs its own tokens only, not again the
        prompt's last ones whose lookahead the turn's first tokens are (a smaller first
        chunk, approximate). A flow without a lookahead into the prompt returns itself."""
        return self

    def cache_in(self, dtype: torch.dtype) -> FlowStage:
        """This flow (the same weights) keeping its per-turn attention caches in `dtype`
        and reading them in it (bfloat16: half the bytes, approximate). A flow without
        such caches returns itself."""
        return self


class VocoderStage(nn.Module):
    """Mel -> 24 kHz PCM, chunk by chunk."""

    hold_back = 0  # mel frames whose audio waits for the frames after them

    def initial_state(self) -> State:
        raise NotImplementedError

    def forward_chunk(self, mel: Tensor, state: State, final: bool) -> tuple[Tensor, State]:
        """mel [b, bins, m] -> pcm [b, samples]; `final` flushes audio held back for
        right context. The input state is not mutated."""
        raise NotImplementedError

    def batch_key(self, state: State | None, frames: int, final: bool) -> object:
        """Chunks of several sessions run as one batch only when their keys are equal."""
        return (frames, final)

    def variant(self, hold_back: int, crossfade: int = 0) -> VocoderStage:
        """This vocoder (the same weights) holding back at most `hold_back` mel frames of
        audio for right context, crossfading seams over `crossfade` frames. A vocoder
        that holds nothing back returns itself."""
        return self

    def cat_states(self, states: Sequence[State]) -> State:
        return cat_states(list(states))

    def split_states(self, state: State, n: int) -> list[State]:
        return split_state(state, n)
