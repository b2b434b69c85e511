"""Hyper-parameters of the tiny model's three stages, as stored in its `config.json`
(the LM's, `LMConfig`, are in lm.py: CosyVoice2's LM is the same class).

The numbers that define the audio timeline (token rate, mel rate, sample rate) follow
CosyVoice2 so that a real model drops into the same pipeline; the layer sizes are free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..lm import LMConfig


@dataclass(frozen=True)
class FlowConfig:
    token_dim: int = 32
    hidden: int = 64
    spk_dim: int = 16
    mel_bins: int = 80
    pre_lookahead: int = 3  # future tokens the encoder reads (CosyVoice2: 3)
    token_mel_ratio: int = 2  # 25 Hz tokens -> 50 Hz mel
    kernel: int = 3
    encoder_layers: int = 2
    decoder_layers: int = 2
    n_steps: int = 10  # Euler steps
    cfg_rate: float = 0.7
    noise_frames: int = 3000  # fixed noise, seed 0, indexed by absolute mel frame (wraps)


@dataclass(frozen=True)
class VocoderConfig:
    mel_bins: int = 80
    hidden: int = 64
    kernel: int = 3
    layers: int = 2
    hop: int = 480  # samples per mel frame at 24 kHz
    sample_rate: int = 24000


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    random_weights: bool = True  # True: audio is noise; said in logs and session.created
    lm: LMConfig = field(default_factory=LMConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    vocoder: VocoderConfig = field(default_factory=VocoderConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls(
            name=d.get("name", "tiny"),
            random_weights=bool(d.get("random_weights", True)),
            lm=LMConfig(**d.get("lm", {})),
            flow=FlowConfig(**d.get("flow", {})),
            vocoder=VocoderConfig(**d.get("vocoder", {})),
        )
