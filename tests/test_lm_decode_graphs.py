"""The embedded LM's GPU path, checked on the CPU: decode steps with fixed shapes (what a
CUDA graph captures, engine/lm_graphs.py) and the LM in bfloat16.

This machine has no GPU, so the graphs' capture and replay themselves run only where
CUDA is (`deploy/gpu-bench.sh` compares them with eager steps there). What a graph
replays is checked here: the fixed-span step computes what the ordinary step does, the
bucket's spare rows write only the scratch slot, and an engine on these steps speaks
the tokens an ordinary one does.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from voiceagent import config
from voiceagent.engine.embedded import EmbeddedEngine, lm_dtype
from voiceagent.engine.lm_engine import EmbeddedLM
from voiceagent.engine.lm_graphs import DecodeGraphs, bucket, buckets
from voiceagent.model import checkpoint
from voiceagent.model.cosyvoice2.random_checkpoint import write_random_cosyvoice2
from voiceagent.model.lm import KVPool, SpeechLM
from voiceagent.model.quantize import reduced_lm
from voiceagent.model.sampling import SamplingParams
from voiceagent.model.speech_model import SpeechModel

TEXT = "Thanks for calling, your order shipped this morning."


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> SpeechModel:
    return checkpoint.load(write_random_cosyvoice2(tmp_path_factory.mktemp("cv2") / "small"))


def _prefilled(lm: SpeechLM, lengths: list[int], slots: int = 5, max_len: int = 200) -> KVPool:
    """A pool whose slot i holds a random prompt of lengths[i] positions."""
    gen = torch.Generator().manual_seed(1)
    pool = KVPool(lm.cfg, slots, max_len, torch.device("cpu"), lm.llm_decoder.weight.dtype)
    for slot, n in enumerate(lengths):
        ids = torch.randint(0, 6561, (1, n), generator=gen)
        x = lm.embed_speech(ids[0])[:, 0][None]
        lm.forward_embeds(x, pool, torch.tensor([slot]), torch.tensor([0]))
    return pool


def test_buckets_cover_every_size_with_the_smallest_that_holds_it():
    assert buckets(16) == [1, 2, 4, 8, 16] and buckets(12) == [1, 2, 4, 8, 12]
    assert buckets(2048, 128) == [128, 256, 512, 1024, 2048] and buckets(100, 100) == [100]
    sizes = buckets(12)
    assert [bucket(n, sizes) for n in (1, 2, 3, 5, 9, 12)] == [1, 2, 4, 8, 12, 12]


@torch.inference_mode()
def test_a_fixed_span_decode_step_computes_what_the_ordinary_one_does(small):
    """Rows of unlike lengths attend over a span of 200 positions, masked past their own:
    the logits and keys/values of attending over the longest row only, within float
    rounding (the grouped queries reach the same sums in another order)."""
    lm = small.lm
    lengths = [7, 31, 90]
    ordinary, fixed = _prefilled(lm, lengths), _prefilled(lm, lengths)
    x = lm.embed_speech(torch.tensor([11, 12, 13]))
    slots, start = torch.tensor([0, 1, 2]), torch.tensor(lengths)
    a = lm.forward_embeds(x, ordinary, slots, start)
    b = lm.forward_embeds(x, fixed, slots, start, span=200)
    assert a.abs().max() > 0.1
    assert (a - b).abs().max() < 1e-5
    # the first layer's new keys are the same numbers; later ones within float rounding
    assert torch.equal(ordinary.k[0], fixed.k[0])
    assert torch.allclose(ordinary.k, fixed.k, atol=1e-5)
    assert torch.allclose(ordinary.v, fixed.v, atol=1e-5)


@torch.inference_mode()
def test_a_bucketed_step_pads_into_the_scratch_slot_alone(small):
    """3 requests run as a bucket of 4 over a span of 128: their logits are the ordinary
    step's, and apart from their own new positions only the scratch slot (4) changed."""
    lm = small.lm
    lengths = [5, 40, 60]
    pool = _prefilled(lm, lengths)
    graphs = DecodeGraphs(lm, pool, scratch=4, max_batch=4)
    assert graphs.captured == 0  # the CPU has no graphs: the same steps run eagerly
    assert (graphs.batches, graphs.spans) == ([1, 2, 4], [128, 200])
    reference = _prefilled(lm, lengths)
    before_k = pool.k.clone()
    x = lm.embed_speech(torch.tensor([11, 12, 13]))
    want = lm.forward_embeds(x, reference, torch.tensor([0, 1, 2]), torch.tensor(lengths))
    got = graphs.step([11, 12, 13], [0, 1, 2], lengths)
    assert got.shape == want.shape and (got - want).abs().max() < 1e-5
    changed = (pool.k != before_k).flatten(2).any(-1).any(0)  # [slots, ...] -> per slot
    assert changed.tolist() == [True, True, True, False, True]
    for slot, n in enumerate(lengths):  # each request wrote one position, its own
        assert torch.equal(pool.k[:, slot, :, :n], before_k[:, slot, :, :n])
        assert torch.allclose(pool.k[:, slot, :, n], reference.k[:, slot, :, n], atol=1e-5)
        assert torch.equal(pool.k[:, slot, :, n + 1 :], before_k[:, slot, :, n + 1 :])


def _tokens(model: SpeechModel, **options: object) -> list[list[int]]:
    """The tokens of two requests at once (their decode steps batched), up to 60 each."""
    lm = EmbeddedLM(model, 4, **options)  # type: ignore[arg-type]
    lm.start()
    text = model.tokenizer.encode(TEXT)

    async def one(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        params = SamplingParams(seed=seed)
        stream = lm.generate(text, model.voices["agent"], params, gen, 10, 60)
        return [t async for chunk in stream for t in chunk]

    async def two() -> list[list[int]]:
        return list(await asyncio.gather(one(1), one(2)))

    try:
        return asyncio.run(two())
    finally:
        lm.stop()


def test_an_lm_on_bucketed_steps_gives_the_ordinary_tokens(small):
    ordinary = _tokens(small)
    assert all(len(t) > 10 for t in ordinary) and ordinary[0] != ordinary[1]
    assert _tokens(small, graphs=True) == ordinary


@torch.inference_mode()
def test_a_bfloat16_lm_stays_within_its_bound(small):
    """The LM and its KV slots in bfloat16 (the default on CUDA): a prefill and 8 decode
    steps after it move the logits by at most 0.15 (logits up to ~2.5 here) and keep the
    most likely token in at least 7 of the 9 positions."""
    lm = small.lm
    bf16 = reduced_lm(lm, torch.bfloat16)
    assert reduced_lm(lm, torch.bfloat16) is bf16 and reduced_lm(lm, torch.float32) is lm
    assert bf16.llm_decoder.weight.dtype == torch.bfloat16 and bf16.inv_freq.dtype == torch.float32
    voice = small.voices["agent"]
    rows = []
    for model in (lm, bf16):
        prompt = model.prompt_embeds([*voice.prompt_text_ids, 5, 6, 7], list(voice.prompt_tokens))
        dtype = model.llm_decoder.weight.dtype
        pool = KVPool(lm.cfg, 1, prompt.shape[1] + 8, torch.device("cpu"), dtype)
        slot = torch.tensor([0])
        out = [model.forward_embeds(prompt, pool, slot, torch.tensor([0]))]
        for i in range(8):
            step = model.embed_speech(torch.tensor([100 + i]))
            at = torch.tensor([prompt.shape[1] + i])
            out.append(model.forward_embeds(step, pool, slot, at))
        rows.append(torch.cat(out).float())
    exact, approx = rows
    assert 0 < (exact - approx).abs().max() < 0.15 < exact.abs().max()
    assert (exact.argmax(-1) == approx.argmax(-1)).sum() >= 7


def test_a_bfloat16_lm_on_bucketed_steps_speaks(small):
    tokens = _tokens(small, dtype=torch.bfloat16, graphs=True)
    assert all(len(t) > 10 for t in tokens)


def test_lm_precision_auto_is_bfloat16_on_cuda_only_and_not_with_int8(small):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert lm_dtype("auto", cpu) == torch.float32 and lm_dtype("auto", cuda) == torch.bfloat16
    assert lm_dtype("auto", cuda, int8=True) == torch.float32
    assert (
        lm_dtype("bfloat16", cpu) == torch.bfloat16 and lm_dtype("float32", cuda) == torch.float32
    )
    with pytest.raises(config.ConfigError, match=r"lm_int8.*bfloat16"):
        config.load(None, {"engine.lm_int8": "all", "engine.lm_precision": "bfloat16"})
    with pytest.raises(ValueError, match="float32"):
        EmbeddedEngine(small, 2, int8_prefill=True, lm_dtype=torch.bfloat16)


def test_the_engine_a_gpu_serves_with_speaks_over_websocket(tiny_model):
    """`bench --scenario ws` on CUDA serves with `gpu_engine`'s options (bfloat16 LM and
    flow, bucketed decode steps, batched chunks); here on the CPU, 3 sessions at once
    each get a whole turn of audio from it."""
    from voiceagent.bench.ws import _level, gpu_engine
    from voiceagent.server.app import ServerConfig
    from voiceagent.server.background import BackgroundServer, free_port

    options = gpu_engine(3)
    assert options["max_batch"] == 16 and options["acoustic_batching"] == "batched"
    config = ServerConfig(port=free_port())
    with BackgroundServer(tiny_model, config, **options) as server:
        lm = server.engine.lm
        assert isinstance(lm, EmbeddedLM) and lm.lm.llm_decoder.weight.dtype == torch.bfloat16
        level = asyncio.run(_level(server.url, 3, 1, list(tiny_model.voices)))
    assert level["turns"] == 3 and level["audio_s_per_turn"] > 0.5
