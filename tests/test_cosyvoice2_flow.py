"""CosyVoice2 flow: released layout, reference numerics, cached streaming == offline.

Data files (facts about the released model, produced outside this repo from the
reference implementation):
  flow_keys.txt   every state-dict key of the released flow with its shape.
  flow_golden.pt  reference outputs for `GOLDEN_CONFIG` with the weights of
                  `seeded_weights(..., seed=0)` and the stored inputs: non-streaming
                  inference, streaming-mask inference, and the reference's chunked
                  streaming loop (prompt 28 tokens, chunks of 22 and 25 tokens).

Tolerances: 1e-4 absolute on mel values of magnitude ~1-5; float32 rounding of
differently shaped matmuls (chunked vs whole-sequence attention) measures ~2e-6.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from voiceagent.model.cosyvoice2.flow import (
    PAD_TOKEN,
    CosyFlow,
    FlowConfig,
    FlowPrompt,
)
from voiceagent.model.cosyvoice2.flow_encoder import append
from voiceagent.model.cosyvoice2.loader import load_flow_state

DATA = Path(__file__).parent / "data" / "cosyvoice2"
TOL = 1e-4

# Scaled down so CPU tests stay fast; every size is a FlowConfig field.
SMALL = FlowConfig(
    encoder_dim=32,
    encoder_heads=2,
    encoder_linear_units=64,
    encoder_blocks=2,
    up_encoder_blocks=2,
    decoder_channels=32,
    decoder_heads=2,
    attention_head_dim=16,
    decoder_blocks=1,
    mid_blocks=2,
    static_chunk_size=8,
)
# The reference fixes the encoder width (512) and its 4 upsampled layers, so the golden
# configuration only shrinks the rest.
GOLDEN_CONFIG = FlowConfig(
    encoder_linear_units=256,
    encoder_blocks=1,
    decoder_channels=64,
    attention_head_dim=16,
    decoder_heads=4,
    decoder_blocks=1,
    mid_blocks=1,
)


def seeded_weights(module: nn.Module, seed: int) -> dict[str, Tensor]:
    """Deterministic random weights of O(1) activations for every key of `module`."""
    out = {}
    for i, (key, v) in enumerate(module.state_dict().items()):
        g = torch.Generator().manual_seed(seed * 100003 + i)
        if v.dim() >= 2:
            out[key] = torch.randn(v.shape, generator=g) / math.sqrt(math.prod(v.shape[1:]))
        elif ("norm" in key and key.endswith("weight")) or key.endswith(
            (".out.1.weight", "block.2.weight")
        ):
            out[key] = 1 + 0.1 * torch.randn(v.shape, generator=g)  # LayerNorm gains
        else:
            out[key] = 0.1 * torch.randn(v.shape, generator=g)
    return out


def make_flow(cfg: FlowConfig = SMALL, seed: int = 0) -> CosyFlow:
    flow = CosyFlow(cfg).eval()
    load_flow_state(flow, seeded_weights(flow, seed))
    return flow


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: thread hand-offs cost more than they save (100x on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def flow() -> CosyFlow:
    return make_flow()


def voice(p: int, seed: int, cfg: FlowConfig = SMALL) -> FlowPrompt:
    g = torch.Generator().manual_seed(seed)
    return FlowPrompt(
        prompt_tokens=torch.randint(0, cfg.vocab_size, (p,), generator=g),
        prompt_mel=torch.randn(cfg.token_mel_ratio * p, cfg.mel_bins, generator=g),
        embedding=torch.randn(cfg.spk_embed_dim, generator=g),
    )


def turn_tokens(n: int, seed: int) -> Tensor:
    return torch.randint(0, 6561, (n,), generator=torch.Generator().manual_seed(seed))


def chunk_ids(tokens: Tensor, start: int, n: int, look: int) -> Tensor:
    """The chunk's n tokens, then `look` lookahead tokens or PAD past the end."""
    ids = tokens[start : start + n + look].tolist()
    return torch.tensor([ids + [PAD_TOKEN] * (n + look - len(ids))])


def stream(flow: CosyFlow, v: FlowPrompt, tokens: Tensor, schedule: list[int]) -> Tensor:
    state = flow.initial_state(v)
    look, out, done, i = flow.cfg.pre_lookahead, [], 0, 0
    while done < len(tokens):
        n = min(schedule[min(i, len(schedule) - 1)], len(tokens) - done)
        mel, state = flow.forward_chunk(chunk_ids(tokens, done, n, look), v.embedding[None], state)
        assert mel.shape == (1, flow.cfg.mel_bins, flow.cfg.token_mel_ratio * n)
        out.append(mel)
        done, i = done + n, i + 1
    return torch.cat(out, dim=2)


def offline(flow: CosyFlow, v: FlowPrompt, tokens: Tensor, blocks: object) -> Tensor:
    mel = v.prompt_mel
    assert mel is not None and isinstance(v.prompt_tokens, Tensor)
    return flow.synthesize(
        tokens[None],
        v.prompt_tokens[None],
        mel[None],
        v.embedding[None],
        blocks=blocks,  # type: ignore[arg-type]
    )


# -- layout and loading ----------------------------------------------------------------------


def test_full_size_keys_and_shapes_equal_released_manifest():
    with torch.device("meta"):
        full = CosyFlow(FlowConfig())
    ours = [f"{k} {','.join(map(str, v.shape))}" for k, v in full.state_dict().items()]
    released = (DATA / "flow_keys.txt").read_text().split("\n")
    released = [line for line in released if line]
    assert len(released) == 1121
    assert ours == released


def test_loader_accepts_exact_and_refuses_mismatches(flow):
    good = seeded_weights(flow, seed=5)
    other = CosyFlow(SMALL).eval()
    load_flow_state(other, good)
    assert torch.equal(other.encoder_proj.weight, good["encoder_proj.weight"])

    missing = dict(good)
    del missing["decoder.estimator.mid_blocks.1.1.0.attn1.to_k.weight"]
    with pytest.raises(ValueError, match=r"missing: decoder\.estimator\.mid_blocks\.1\.1\.0"):
        load_flow_state(other, missing)

    extra = dict(good)
    extra["encoder.up_layer.conv.weight_g"] = torch.zeros(1)
    extra["decoder.rand_noise"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"unexpected: encoder\.up_layer\.conv\.weight_g"):
        load_flow_state(other, extra)

    shaped = dict(good)
    shaped["encoder_proj.weight"] = torch.zeros(80, 33)
    with pytest.raises(ValueError, match=r"wrong shape: encoder_proj\.weight \(80, 33\)"):
        load_flow_state(other, shaped)
    # A refused load leaves the module as it was.
    assert torch.equal(other.encoder_proj.weight, good["encoder_proj.weight"])


# -- reference numerics --------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden() -> dict[str, Tensor]:
    data: dict[str, Tensor] = torch.load(DATA / "flow_golden.pt", weights_only=True)
    return data


@pytest.fixture(scope="module")
def golden_flow() -> CosyFlow:
    return make_flow(GOLDEN_CONFIG, seed=0)


def test_offline_matches_reference_non_streaming(golden, golden_flow):
    g = golden
    mel = golden_flow.synthesize(g["tokens"], g["prompt_tokens"], g["prompt_mel"], g["spk"])
    assert mel.shape == g["ref_full"].shape == (1, 80, 2 * g["tokens"].shape[1])
    assert (mel - g["ref_full"]).abs().max() < TOL


def test_offline_matches_reference_streaming_mask(golden, golden_flow):
    g = golden
    mel = golden_flow.synthesize(
        g["tokens"], g["prompt_tokens"], g["prompt_mel"], g["spk"], blocks=25
    )
    assert (mel - g["ref_static25"]).abs().max() < TOL
    assert (mel - g["ref_full"]).abs().max() > 1e-3  # the two masks really differ


def test_cached_streaming_matches_reference_streaming_loop(golden, golden_flow):
    """Prompt of 28 tokens: 25 primed, 3 pending; chunks 22 + 25 land on the 25-grid."""
    g = golden
    v = FlowPrompt(g["prompt_tokens"][0], g["prompt_mel"][0], g["spk"][0])
    mel = stream(golden_flow, v, g["tokens"][0], [22, 25])
    assert (mel - g["ref_stream"]).abs().max() < TOL


# -- streaming == offline with the same blocks ------------------------------------------------


@pytest.mark.parametrize("schedule", [[4, 8, 16, 25], [25], [1], [7]])
@pytest.mark.parametrize("prompt_len", [11, 2, 0])
def test_streaming_equals_offline_with_same_blocks(flow, schedule, prompt_len):
    v, tokens = voice(prompt_len, seed=1), turn_tokens(41, seed=2)
    streamed = stream(flow, v, tokens, schedule)
    blocks = flow.stream_blocks(prompt_len, schedule, len(tokens))
    reference = offline(flow, v, tokens, blocks)
    assert streamed.shape == reference.shape == (1, 80, 82)
    assert (streamed - reference).abs().max() < TOL
    # Sensitive: full attention is a different computation.
    assert (streamed - offline(flow, v, tokens, None)).abs().max() > 1e-3


@pytest.mark.parametrize("prompt_len", [5, 10, 11, 12, 13, 30])
def test_grid_turns_equal_the_released_streaming_pass(flow, prompt_len):
    """A grid state (`initial_state(grid=True)`) streamed in `grid_sizes` chunks gives
    the released streaming inference: one pass with the static chunk mask from the
    first prompt token. Prompt lengths cover a tail of 3 to 27 tokens left for the first
    chunk, which then spans one or two grid blocks."""
    grid = flow.grid
    v, tokens = voice(prompt_len, seed=2), turn_tokens(70, seed=5)
    sizes = flow.grid_sizes(prompt_len, len(tokens))
    assert sum(sizes) == 70 and all(
        (prompt_len + sum(sizes[: i + 1])) % grid == 0 for i in range(len(sizes) - 1)
    )
    state, out, done = flow.initial_state(v, grid=True), [], 0
    for n in sizes:
        mel, state = flow.forward_chunk(chunk_ids(tokens, done, n, 3), v.embedding[None], state)
        out.append(mel)
        done += n
    streamed = torch.cat(out, 2)
    assert (streamed - offline(flow, v, tokens, grid)).abs().max() < TOL
    # The default state with the same chunks is not on the grid when its priming, which
    # stops 3 tokens before the prompt's end, does not.
    if (prompt_len - 3) % grid:
        assert (stream(flow, v, tokens, [*sizes[:1], grid]) - streamed).abs().max() > 1e-3


def test_primed_state_is_reusable_and_not_mutated(flow):
    v, tokens = voice(11, seed=1), turn_tokens(12, seed=3)
    primed = flow.initial_state(v)
    snapshot = {k: t.clone() for k, t in primed.items()}
    ids = chunk_ids(tokens, 0, 9, 3)
    a, after = flow.forward_chunk(ids, v.embedding[None], primed)
    b, _ = flow.forward_chunk(ids, v.embedding[None], primed)
    assert torch.equal(a, b)
    assert all(torch.equal(primed[k], snapshot[k]) for k in primed)
    c, _ = flow.forward_chunk(chunk_ids(tokens, 9, 3, 3), v.embedding[None], after)
    assert c.shape == (1, 80, 6)


def test_a_state_continued_twice_gives_each_branch_its_own_past(flow):
    """Chunks grow the keys/values in place into spare room (no copy of the past); a
    second continuation of the same state must find that room taken and copy: neither
    the state it started from nor the first continuation may change."""
    v, tokens, other = voice(11, seed=1), turn_tokens(30, seed=3), turn_tokens(30, seed=4)
    spk = v.embedding[None]
    _, after = flow.forward_chunk(chunk_ids(tokens, 0, 9, 3), spk, flow.initial_state(v))
    snapshot = {k: t.clone() for k, t in after.items()}
    _, later = flow.forward_chunk(chunk_ids(tokens, 9, 6, 3), spk, after)
    expected, _ = flow.forward_chunk(chunk_ids(tokens, 15, 6, 3), spk, later)
    flow.forward_chunk(chunk_ids(other, 9, 6, 3), spk, after)  # a second branch
    again, _ = flow.forward_chunk(chunk_ids(tokens, 15, 6, 3), spk, later)
    assert torch.equal(expected, again)
    assert all(torch.equal(after[k], snapshot[k]) for k in after)


def test_appending_grows_in_place_and_never_changes_what_was_handed_out():
    past = torch.randn(2, 3, 5, 4)
    parts, buffers = [past], set()
    for i in range(100):
        parts.append(append(parts[-1], torch.full((2, 3, 1, 4), float(i))))
        buffers.add(parts[-1].untyped_storage().data_ptr())
    assert torch.equal(
        parts[-1], torch.cat([past] + [torch.full((2, 3, 1, 4), float(i)) for i in range(100)], 2)
    )
    assert len(buffers) < 20  # a copy of the past once per quarter of growth, not per step
    # Every earlier result still holds exactly what it held: a branch from one of them
    # copies rather than writing over the steps a later result owns.
    branch = append(parts[50], torch.zeros(2, 3, 1, 4))
    assert torch.equal(parts[51][:, :, -1], torch.full((2, 3, 4), 50.0))
    assert torch.equal(branch[:, :, :-1], parts[50]) and not branch[:, :, -1].any()
    assert branch.untyped_storage().data_ptr() not in buffers


def test_a_windowed_buffer_grows_into_its_reserve_rather_than_taking_it_at_once():
    """A turn's keys/values take at most twice what they hold, up to the reserve (a
    window and a quarter): freed buffers come back from the allocator already touched,
    so a whole reserve per turn made a server's memory grow with every turn."""
    step = torch.zeros(1, 1, 4, 2)
    kv, capacities = append(torch.zeros(1, 1, 4, 2), step, reserve=200), []
    for _ in range(40):  # up to 168 steps held, under the reserve
        kv = append(kv, step, reserve=200)
        capacities.append((kv.untyped_storage().nbytes() // (2 * 4), kv.shape[2]))
    assert capacities[0] == (16, 12)  # not the 200 reserved
    assert all(held <= cap <= min(200, 2 * held) for cap, held in capacities)
    assert len({cap for cap, _ in capacities}) <= 5  # a few copies on the way


def test_turns_share_the_prompt_cache_and_keep_only_their_own_frames(flow):
    """The estimator's keys/values of the voice prompt are one set of tensors read by
    every turn (never copied into a turn's state); a turn's own entries grow with its
    frames only."""
    v, tokens = voice(11, seed=1), turn_tokens(12, seed=3)
    primed = flow.initial_state(v)
    _, after = flow.forward_chunk(chunk_ids(tokens, 0, 9, 3), v.embedding[None], primed)
    shared = [k for k in primed if k.endswith((".pk", ".pv"))]
    assert shared and all(after[k] is primed[k] for k in shared)
    own = after["s0.a0.k"]
    assert primed["s0.a0.k"].shape[2] == 0 and own.shape[2] == 2 * (9 + 3)  # + prompt tail
    assert flow.cache_length(after) == 11 + 9


def test_batched_sessions_equal_each_alone(flow):
    """Different prompt lengths (so different cache lengths) and a first chunk batched
    with a later one; states split back with torch.chunk, as the engine does."""
    va, vb = voice(11, seed=1), voice(5, seed=4)
    ta, tb = turn_tokens(30, seed=5), turn_tokens(30, seed=6)
    alone_a, alone_b = stream(flow, va, ta, [6]), stream(flow, vb, tb, [6])

    sa, sb = flow.initial_state(va), flow.initial_state(vb)
    first, sa = flow.forward_chunk(chunk_ids(ta, 0, 6, 3), va.embedding[None], sa)
    outs_a, outs_b = [first], []
    spk = torch.stack([va.embedding, vb.embedding])
    for i in range(4):
        ids = torch.cat([chunk_ids(ta, 6 * (i + 1), 6, 3), chunk_ids(tb, 6 * i, 6, 3)])
        mel, state = flow.forward_chunk(ids, spk, flow.cat_states([sa, sb]))
        mel_a, mel_b = torch.chunk(mel, 2)
        outs_a.append(mel_a)
        outs_b.append(mel_b)
        sa, sb = ({k: t.chunk(2)[j] for k, t in state.items()} for j in range(2))
    assert (torch.cat(outs_a, 2) - alone_a[:, :, :60]).abs().max() < TOL
    assert (torch.cat(outs_b, 2) - alone_b[:, :, :48]).abs().max() < TOL

    # Equal cache lengths concatenate with a plain torch.cat along dim 0.
    s1, s2 = flow.initial_state(voice(11, seed=1)), flow.initial_state(voice(11, seed=7))
    assert flow.cache_length(s1) == flow.cache_length(s2)
    joined = {k: torch.cat([s1[k], s2[k]]) for k in s1}
    ids = torch.cat([chunk_ids(ta, 0, 6, 3), chunk_ids(tb, 0, 6, 3)])
    mel, _ = flow.forward_chunk(ids, torch.stack([va.embedding, va.embedding]), joined)
    one, _ = flow.forward_chunk(chunk_ids(ta, 0, 6, 3), va.embedding[None], s1)
    assert (mel[:1] - one).abs().max() < TOL


# -- cost and state size ------------------------------------------------------------------


def _layer_input_shapes(flow: CosyFlow, ids: Tensor, spk: Tensor, state) -> list[tuple]:
    """Input shapes of every Linear/Conv1d call in a chunk, except the relative-position
    projection (its table spans the cached distances)."""
    shapes: list[tuple] = []
    hooks = [
        m.register_forward_hook(lambda mod, inp, out: shapes.append(tuple(inp[0].shape)))
        for name, m in flow.named_modules()
        if isinstance(m, nn.Linear | nn.Conv1d) and not name.endswith("linear_pos")
    ]
    try:
        flow.forward_chunk(ids, spk, state)
    finally:
        for h in hooks:
            h.remove()
    return shapes


def test_chunk_work_does_not_grow_with_position(flow):
    v, tokens = voice(11, seed=1), turn_tokens(200, seed=8)
    spk, look, n = v.embedding[None], 3, 8
    state = flow.initial_state(v)
    _, state = flow.forward_chunk(chunk_ids(tokens, 0, n, look), spk, state)  # prompt tail
    fixed = {k: t.shape for k, t in state.items() if not k.endswith((".k", ".v"))}
    kv = {k: t.shape[2] for k, t in state.items() if k.endswith((".k", ".v"))}
    early = _layer_input_shapes(flow, chunk_ids(tokens, n, n, look), spk, state)
    for c in range(1, 20):
        _, state = flow.forward_chunk(chunk_ids(tokens, c * n, n, look), spk, state)
    late = _layer_input_shapes(flow, chunk_ids(tokens, 20 * n, n, look), spk, state)
    assert early == late and len(early) > 50
    # Fixed-size entries keep their shapes; K/V caches grew by exactly 19 chunks.
    assert {k: t.shape for k, t in state.items() if k in fixed} == fixed
    for k, length in kv.items():
        rate = 1 if k.startswith("enc.") else 2
        assert state[k].shape[2] == length + 19 * n * rate, k
    assert int(state["frame"]) == 2 * (11 + 20 * n)


# -- outputs are not trivial ---------------------------------------------------------------


def test_outputs_depend_on_tokens_prompt_and_lookahead(flow):
    v, tokens = voice(11, seed=1), turn_tokens(20, seed=9)
    base = stream(flow, v, tokens, [10])
    assert base.std() > 0.3 and torch.isfinite(base).all()

    other = turn_tokens(20, seed=10)
    assert (stream(flow, v, other, [10]) - base).abs().max() > 1e-2

    mel = v.prompt_mel
    assert mel is not None
    louder = FlowPrompt(v.prompt_tokens, mel + 1.0, v.embedding)
    assert (stream(flow, louder, tokens, [10]) - base).abs().max() > 1e-2

    # Lookahead tokens change the chunk they follow, never an earlier one.
    state = flow.initial_state(v)
    ids = chunk_ids(tokens, 0, 10, 3)
    a, _ = flow.forward_chunk(ids, v.embedding[None], state)
    ids[0, -3:] = PAD_TOKEN
    b, _ = flow.forward_chunk(ids, v.embedding[None], state)
    assert (a - b).abs().max() > 1e-3


# -- the primed prompt tail (a cheaper first chunk) ------------------------------------------


def _estimator_frames(flow: CosyFlow, ids: Tensor, spk: Tensor, state) -> set[int]:
    """Mel frames each estimator call of a chunk ran on."""
    frames: set[int] = set()
    hook = flow.decoder.estimator.register_forward_hook(
        lambda mod, inp, out: frames.add(inp[0].shape[2])
    )
    try:
        flow.forward_chunk(ids, spk, state)
    finally:
        hook.remove()
    return frames


def test_a_primed_tail_first_chunk_runs_only_its_own_frames(flow):
    """The exact first chunk runs the prompt's last 3 tokens again (their lookahead is
    the turn's first tokens); with `primed_tail()` the prompt was primed to its end, so
    a 4-token first chunk is 8 frames instead of 14, and later chunks are alike."""
    v, tokens = voice(11, seed=1), turn_tokens(20, seed=3)
    spk, ids = v.embedding[None], chunk_ids(tokens, 0, 4, 3)
    fast = flow.primed_tail()
    exact_state, fast_state = flow.initial_state(v), fast.initial_state(v)
    assert int(exact_state["pending_n"]) == 3 and int(fast_state["pending_n"]) == 0
    assert int(exact_state["frame"]) == int(fast_state["frame"]) - 6 == 16
    assert _estimator_frames(flow, ids, spk, exact_state) == {14}
    assert _estimator_frames(fast, ids, spk, fast_state) == {8}
    mel, fast_state = fast.forward_chunk(ids, spk, fast_state)
    assert mel.shape == (1, 80, 8) and int(fast_state["frame"]) == 22 + 8
    assert not flow.prompt_primed_to_end  # a variant: the flow itself stays exact


def test_a_primed_tail_moves_the_mel_a_little_and_less_after_the_first_chunk(flow):
    """The price: the prompt's last frames were computed without the turn's first tokens,
    and the turn attends to them. These small random weights (an 11-token prompt, of
    which the tail is 3) are a worst case: 0.7-1.0 at most, in the first chunk (of a
    spread of about 10; relative RMS 6 %), about 0.1 after a second of speech (three
    prompts measured). Full size: 0.05 (docs/operations.md, First packet)."""
    v, tokens = voice(11, seed=1), turn_tokens(60, seed=2)
    exact = stream(flow, v, tokens, [4, 8, 16, 25])
    fast = stream(flow.primed_tail(), v, tokens, [4, 8, 16, 25])
    err = (fast - exact).abs()
    assert 1e-4 < float(err.max()) < 1.5
    assert float(err[:, :, 50:].max()) < 0.2 * float(err[:, :, :8].max())


def test_a_primed_tail_leaves_grid_states_and_promptless_voices_alone(flow):
    fast = flow.primed_tail()
    v = voice(30, seed=2)
    exact, primed = flow.initial_state(v, grid=True), fast.initial_state(v, grid=True)
    assert exact.keys() == primed.keys() and all(torch.equal(exact[k], primed[k]) for k in exact)
    empty = voice(0, seed=2)
    tokens = turn_tokens(12, seed=4)
    assert torch.equal(stream(flow, empty, tokens, [4, 8]), stream(fast, empty, tokens, [4, 8]))


# -- attention over a shared prompt part and a turn's own, and narrower caches ------------


@pytest.mark.parametrize("prompt_keys", [30, 0])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("whole_scores", [False, True])
def test_attention_over_two_parts_equals_attention_over_both(
    monkeypatch, prompt_keys, masked, whole_scores
):
    """A voice prompt's keys/values and a turn's own are read as one softmax: on the CPU
    through the flash kernel per part, weighted by each part's log-sum-exp; elsewhere
    (`whole_scores`) with the scores computed whole. An empty prompt part (a voice with
    no prompt) and a block mask among the new positions (grid chunks) included."""
    from voiceagent.model.cosyvoice2 import flow_decoder

    if whole_scores:
        monkeypatch.setattr(flow_decoder, "_flash_cpu", None)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 16, generator=g)
    first = (torch.randn(2, 4, prompt_keys, 16, generator=g),) * 2
    second = (torch.randn(2, 4, 10, 16, generator=g), torch.randn(2, 4, 10, 16, generator=g))
    mask = None
    if masked:  # the 6 new positions in two blocks of 3 after 4 earlier own keys
        ids = torch.arange(6) // 3
        block = torch.cat([torch.ones(6, 4, dtype=torch.bool), ids[None] <= ids[:, None]], 1)
        mask = torch.cat([torch.ones(6, prompt_keys, dtype=torch.bool), block], 1)[None, None]
    keys = torch.cat([first[0], second[0]], 2)
    values = torch.cat([first[1], second[1]], 2)
    both = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    two = flow_decoder._two_part_attention(q, first, second, mask)
    assert (two - both).abs().max() < 1e-5
    if masked:  # the mask is applied: without it the result differs
        assert (flow_decoder._two_part_attention(q, first, second, None) - two).abs().max() > 1e-3


def test_bfloat16_caches_halve_a_turns_state_and_move_the_mel_little(flow):
    """`cache_in(torch.bfloat16)`: the estimator's keys/values (the prompt's shared part
    and the turn's own) are kept in bfloat16, the rest of the state as it was; a turn's
    state grows half as fast, and the streamed mel moves, but little (0.002-0.003 at
    most here, three seeds measured; full size 0.002)."""
    narrow = flow.cache_in(torch.bfloat16)
    assert flow.cache_dtype is None  # a variant: the flow itself is unchanged
    v, tokens = voice(11, seed=1), turn_tokens(40, seed=2)
    spk = v.embedding[None]
    states = {}
    for name, f in (("float32", flow), ("bfloat16", narrow)):
        primed = f.initial_state(v)
        _, first = f.forward_chunk(chunk_ids(tokens, 0, 8, 3), spk, primed)
        _, second = f.forward_chunk(chunk_ids(tokens, 8, 8, 3), spk, first)
        states[name] = (first, second)
    first, second = states["bfloat16"]
    kv = [k for k in second if k.startswith("s") and k.endswith((".k", ".v", ".pk", ".pv"))]
    assert kv and all(second[k].dtype == torch.bfloat16 for k in kv)
    assert all(second[k].dtype != torch.bfloat16 for k in second if k not in kv)

    def growth(pair: tuple[dict[str, Tensor], dict[str, Tensor]]) -> int:
        return sum(pair[1][k].nbytes - pair[0][k].nbytes for k in kv)

    assert growth(states["bfloat16"]) * 2 == growth(states["float32"])
    exact = stream(flow, v, tokens, [4, 8, 16, 25])
    err = (stream(narrow, v, tokens, [4, 8, 16, 25]) - exact).abs().max()
    assert 1e-5 < float(err) < 0.05


# -- a shallow start (our own voice) ----------------------------------------------------------


def test_a_shallow_start_begins_at_the_paths_point_with_mu_for_the_mel(flow, monkeypatch):
    """`start_t` t0: the Euler steps start from (1 - (1 - sigma) t0) noise + t0 mu and
    cover [t0, 1]; with no velocity at all the mel is that start point itself."""
    import dataclasses

    from voiceagent.model.cosyvoice2.flow import SIGMA_MIN
    from voiceagent.model.cosyvoice2.flow_encoder import Cache

    shallow = make_flow(dataclasses.replace(SMALL, start_t=0.6))
    v, tokens = voice(0, seed=1), turn_tokens(9, seed=2)
    steps = shallow._schedule(torch.zeros(1))
    assert float(steps[0][0]) == pytest.approx(0.6)
    assert float(sum(dt for _, dt in steps)) == pytest.approx(0.4)
    monkeypatch.setattr(type(shallow.estimator), "forward", lambda self, x, *a: x * 0)
    mel = offline(shallow, v, tokens, None)
    ids = torch.cat([tokens, torch.full((3,), PAD_TOKEN)])[None]
    zero = torch.zeros(1, dtype=torch.long)
    mu, _ = shallow._encode(ids, Cache(None), zero, 0, None)
    noise = shallow.decoder.rand_noise[:, :, : mu.shape[2]]
    assert torch.allclose(mel, (1 - (1 - SIGMA_MIN) * 0.6) * noise + 0.6 * mu, atol=1e-6)


@pytest.mark.parametrize("schedule", [[4, 8, 16, 25], [7]])
def test_a_shallow_start_streams_as_it_runs_offline(schedule):
    import dataclasses

    shallow = make_flow(dataclasses.replace(SMALL, start_t=0.85))
    v, tokens = voice(11, seed=1), turn_tokens(41, seed=2)
    streamed = stream(shallow, v, tokens, schedule)
    blocks = shallow.stream_blocks(11, schedule, len(tokens))
    assert (streamed - offline(shallow, v, tokens, blocks)).abs().max() < TOL
    # and it is another start than the released one
    assert (streamed - stream(make_flow(), v, tokens, schedule)).abs().max() > 1e-2


def test_start_t_and_steps_are_read_from_the_yaml_and_absent_mean_the_released_ones(tmp_path):
    from voiceagent.model.cosyvoice2.loader import flow_config
    from voiceagent.model.cosyvoice2.random_checkpoint import SIZES, yaml_text
    from voiceagent.model.cosyvoice2.yaml_config import read_yaml
    from voiceagent.train.sizes import FLOW_START_T, FLOW_STEPS, voice_yaml

    for text, start, steps in (
        (yaml_text(SIZES["small"]), 0.0, 10),
        (voice_yaml(), FLOW_START_T, FLOW_STEPS),
    ):
        (tmp_path / "cosyvoice2.yaml").write_text(text)
        cfg = flow_config(read_yaml(tmp_path / "cosyvoice2.yaml"))
        assert (cfg.start_t, cfg.n_timesteps) == (start, steps)
    with pytest.raises(ValueError, match="start_t"):
        FlowConfig(start_t=1.0)
