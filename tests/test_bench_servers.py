"""Every benchmark that starts its own server starts the one `serve` runs: serve's
engine options and playout, with only what the benchmark varies changed. What was seen:
bench servers held back the vocoder's whole lookahead (about 400 ms of HiFT against
serve's 4 frames) and ran without serve's first-audio priority and flow window, so the
TTFA they printed was not the one users get."""

from __future__ import annotations

from typing import Any

import pytest

from voiceagent.bench import intelligibility, isolation, speech_api, telephony, tenants, ws
from voiceagent.config import Settings


class Built(Exception):
    """The server a bench built, stopped before it starts."""


def capture(model: Any, config: Any, lm: Any = None, **engine: Any) -> None:
    raise Built(config, engine)


STARTS = {
    "ws": lambda m: ws.measure(m, [1], 1, 200),
    "openai": lambda m: speech_api.measure(m),
    "tenants": lambda m: tenants.measure(m),
    "isolation": lambda m: isolation.measure(m, [1], 1, 200, 1),
    "intelligibility": lambda m: intelligibility.synthesize(m, [], 3.0),
}
if telephony.phone_speech.available():  # (it refuses to start without the phone clips)
    STARTS["telephony"] = lambda m: telephony.measure(m, [1], telephony.Options())


@pytest.mark.parametrize("bench", list(STARTS))
def test_a_benchmark_measures_the_server_serve_runs(bench, tiny_model, monkeypatch) -> None:
    module = {"openai": speech_api}.get(bench) or globals()[bench]
    monkeypatch.setattr(module, "BackgroundServer", capture)
    with pytest.raises(Built) as built:
        STARTS[bench](tiny_model)
    config, engine = built.value.args
    serve = Settings()
    served = serve.engine_options(tiny_model)
    assert config.playout.hold_back == serve.server_config().playout.hold_back
    assert config.playout.schedule == serve.server_config().playout.schedule
    for option in ("first_audio_first", "flow_window", "prompt_tail", "warm_hold_backs"):
        assert engine[option] == served[option], option


def test_a_benchmark_takes_serves_configuration_from_the_environment(
    tiny_model, monkeypatch
) -> None:
    monkeypatch.setenv("VOICEAGENT_PLAYOUT__VOCODER_HOLD_BACK", "8")
    monkeypatch.setattr(speech_api, "BackgroundServer", capture)
    with pytest.raises(Built) as built:
        speech_api.measure(tiny_model)
    config, engine = built.value.args
    assert config.playout.hold_back == 8 and engine["warm_hold_backs"] == [8]
