"""Token sampling: seeded, nucleus-limited, stop-aware, repetition-aware."""

from dataclasses import replace

import pytest
import torch

from voiceagent.model.contract import EOS_TOKEN, SPEECH_CODES
from voiceagent.model.sampling import COSYVOICE2, SamplingParams, sample_token

V = SPEECH_CODES + 3


def draw(logits, params, n=200, allow_stop=True, history=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [sample_token(logits, params, gen, allow_stop, history) for _ in range(n)]


def test_same_seed_same_tokens_and_other_seed_other_tokens():
    logits = torch.randn(V, generator=torch.Generator().manual_seed(1))
    p = replace(COSYVOICE2, ras_window=0)
    assert draw(logits, p, seed=5) == draw(logits, p, seed=5)
    assert draw(logits, p, seed=5) != draw(logits, p, seed=6)


def test_top_k_and_top_p_limit_the_candidates():
    logits = torch.full((V,), -10.0)
    logits[:50] = torch.linspace(5, 4, 50)
    top = set(torch.topk(logits, 3).indices.tolist())
    assert set(draw(logits, SamplingParams(1.0, top_k=3, top_p=1.0, ras_window=0))) <= top
    # One dominant token holds > top_p of the mass: only it is drawn.
    logits[7] = 20.0
    assert set(draw(logits, SamplingParams(1.0, top_k=25, top_p=0.8, ras_window=0))) == {7}


def test_temperature_zero_is_greedy():
    logits = torch.randn(V)
    assert draw(logits, replace(COSYVOICE2, temperature=0), n=3) == [int(logits.argmax())] * 3


def test_stop_tokens_are_masked_until_allowed():
    logits = torch.full((V,), -10.0)
    logits[EOS_TOKEN] = 10.0
    p = replace(COSYVOICE2, ras_window=0)
    assert EOS_TOKEN not in draw(logits, p, allow_stop=False)
    assert set(draw(logits, p, allow_stop=True)) == {EOS_TOKEN}


def test_a_token_repeating_in_the_recent_window_is_resampled():
    logits = torch.full((V,), 0.0)
    logits[42] = 30.0  # nucleus sampling would always pick 42
    p = replace(COSYVOICE2, ras_window=10, ras_tau=0.1)
    assert set(draw(logits, p, history=[1, 2, 3])) == {42}
    assert 42 not in draw(logits, p, history=[1, 42, 3])  # once in the window is enough


def test_a_client_that_sets_no_temperature_top_k_or_top_p_gets_the_models():
    model = SamplingParams(0.8, top_k=5, top_p=0.9, ras_window=7, ras_tau=0.25)
    assert SamplingParams(seed=3).of_model(model) == SamplingParams(0.8, 5, 0.9, 3, 7, 0.25)
    mine = SamplingParams(0.0, top_k=0, top_p=1.0).of_model(model)  # off, not unset
    assert mine.drawing == (0.0, 0, 1.0)
    with pytest.raises(ValueError, match="of_model"):
        draw(torch.zeros(V), SamplingParams(), n=1)  # incomplete: never silently unlimited


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        (SamplingParams(seed=3), SamplingParams(0.7, 5, 0.9, 3, 7, 0.25)),
        (
            SamplingParams(temperature=0.5, top_k=9, top_p=0.7, seed=3),
            SamplingParams(0.5, 9, 0.7, 3, 7, 0.25),
        ),
    ],
)
def test_a_model_files_sampling_settings_reach_its_turns(tmp_path, monkeypatch, client, expected):
    """The yaml's `top_k`, `top_p` and `sampling_temperature` (a key of ours) are a
    turn's unless its client sets them; `tau_r` and `win_size` (ours: 0.25, since our
    tokens repeat more than CosyVoice2's) always are. Seen where the real LM engine
    draws each token."""
    import asyncio

    from voiceagent.engine import lm_engine
    from voiceagent.engine.embedded import EmbeddedEngine
    from voiceagent.model import checkpoint
    from voiceagent.model.cosyvoice2.random_checkpoint import write_random_cosyvoice2
    from voiceagent.pipeline.turn import Turn, TurnFailed, TurnSettings

    directory = write_random_cosyvoice2(tmp_path / "cv2")
    yaml = directory / "cosyvoice2.yaml"
    text = yaml.read_text()
    for old, new in [("tau_r: 0.1", "tau_r: 0.25"), ("win_size: 10", "win_size: 7")]:
        assert old in text
        text = text.replace(old, new)
    for old, new in [("top_k: 25", "top_k: 5"), ("top_p: 0.8", "top_p: 0.9")]:
        assert old in text
        text = text.replace(old, new)
    yaml.write_text(text + "sampling_temperature: 0.7\n")
    model = checkpoint.load(directory)
    assert model.sampling == SamplingParams(0.7, 5, 0.9, 0, 7, 0.25)

    drawn: list[SamplingParams] = []

    def recorded(logits, params, *rest):  # the real sampler, its parameters seen
        drawn.append(params)
        return sample_token(logits, params, *rest)

    monkeypatch.setattr(lm_engine, "sample_token", recorded)
    engine = EmbeddedEngine(model, 1)
    turn = Turn("t", TurnSettings(model.voices["agent"], client), engine)

    async def speak() -> None:
        turn.push_text("Hello there.")
        turn.end_text()
        turn.start()
        while not isinstance(item := await turn.output.get(), TurnFailed | None):
            pass
        assert item is None, item
        await turn.wait()

    engine.start()
    try:
        asyncio.run(speak())
    finally:
        engine.stop()
    assert drawn and set(drawn) == {expected}
