"""Token sampling: seeded, nucleus-limited, stop-aware, repetition-aware."""

import torch

from voiceagent.model.contract import EOS_TOKEN, SPEECH_CODES
from voiceagent.model.sampling import SamplingParams, sample_token

V = SPEECH_CODES + 3


def draw(logits, params, n=200, allow_stop=True, history=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [sample_token(logits, params, gen, allow_stop, history) for _ in range(n)]


def test_same_seed_same_tokens_and_other_seed_other_tokens():
    logits = torch.randn(V, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(ras_window=0)
    assert draw(logits, p, seed=5) == draw(logits, p, seed=5)
    assert draw(logits, p, seed=5) != draw(logits, p, seed=6)


def test_top_k_and_top_p_limit_the_candidates():
    logits = torch.full((V,), -10.0)
    logits[:50] = torch.linspace(5, 4, 50)
    top = set(torch.topk(logits, 3).indices.tolist())
    assert set(draw(logits, SamplingParams(top_k=3, top_p=1.0, ras_window=0))) <= top
    # One dominant token holds > top_p of the mass: only it is drawn.
    logits[7] = 20.0
    assert set(draw(logits, SamplingParams(top_k=25, top_p=0.8, ras_window=0))) == {7}


def test_temperature_zero_is_greedy():
    logits = torch.randn(V)
    assert draw(logits, SamplingParams(temperature=0), n=3) == [int(logits.argmax())] * 3


def test_stop_tokens_are_masked_until_allowed():
    logits = torch.full((V,), -10.0)
    logits[EOS_TOKEN] = 10.0
    p = SamplingParams(ras_window=0)
    assert EOS_TOKEN not in draw(logits, p, allow_stop=False)
    assert set(draw(logits, p, allow_stop=True)) == {EOS_TOKEN}


def test_a_token_repeating_in_the_recent_window_is_resampled():
    logits = torch.full((V,), 0.0)
    logits[42] = 30.0  # nucleus sampling would always pick 42
    p = SamplingParams(ras_window=10, ras_tau=0.1)
    assert set(draw(logits, p, history=[1, 2, 3])) == {42}
    assert 42 not in draw(logits, p, history=[1, 42, 3])  # once in the window is enough
