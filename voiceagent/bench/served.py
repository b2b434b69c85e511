"""A benchmark measures the server `serve` runs: its engine options and playout (from
the same configuration: $VOICEAGENT_CONFIG and the environment, else the defaults),
with only what the benchmark itself varies changed. (Built otherwise, a bench server
held back the vocoder's whole lookahead, about 400 ms of HiFT, where `serve` holds back
4 frames, and ran without `serve`'s first-audio priority and flow window.)"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..config import Settings, load
from ..model.speech_model import SpeechModel
from ..session.playout import PlayoutConfig


def served_playout(**changes: Any) -> PlayoutConfig:
    return replace(_served().server_config().playout, **changes)


def served_engine(model: SpeechModel, **changes: Any) -> dict[str, Any]:
    """`EmbeddedEngine` options (for `BackgroundServer`)."""
    return _served().engine_options(model) | changes


def _served() -> Settings:
    return load().settings
