"""The sizes of our own voice's model: the released CosyVoice2 layout, scaled down so that
each part trains on a 2-core CPU in a stated budget and the whole directory ships with
the project (keys as in `model.cosyvoice2.random_checkpoint.SIZES`)."""

from __future__ import annotations

from ..model.cosyvoice2.random_checkpoint import yaml_text

VOICE: dict[str, int] = dict(
    lm_hidden=256,
    lm_layers=6,
    lm_heads=4,
    lm_kv_heads=2,
    lm_intermediate=768,
    text_vocab=0,  # the byte-level vocabulary and CosyVoice2's special tokens
    flow_dim=192,
    flow_heads=2,
    flow_units=768,
    flow_blocks=3,
    dec_channels=128,
    dec_head_dim=32,
    dec_blocks=1,
    dec_mid_blocks=4,
    dec_heads=4,
    hift_channels=128,
)

# Where our flow's Euler steps start (`FlowConfig.start_t`): from the noise and the
# encoder's mu mixed as the path has them at this t, not from the noise alone. Our
# decoder has had a small fraction of the released one's training, and from the noise
# it loses what mu holds: `train check`'s flow row (12 held-out sentences, flow step
# 5,326) 0.92 from t = 0, 0.64 from 0.5, 0.56 from 0.7, 0.44 from 0.85; mu alone 0.47.
FLOW_START_T = 0.85
# Euler steps over [FLOW_START_T, 1] (`FlowConfig.n_timesteps`; the released code takes
# 10 from the noise). The short span needs few: the intelligibility bench (12 held-out
# sentences, flow step 5,837) heard WER 0.57 at 10, 6 and 4 steps, 0.61 at 2 and 1,
# with RTF 0.62, 0.45, 0.38-0.45, 0.33, 0.30 and TTFA p50 671, 458, 352-415, 267, 225 ms.
FLOW_STEPS = 4


RAS_TAU = 0.25  # repetition-aware sampling's threshold for our tokens (`voice_yaml`)
# Our voice's top-k and temperature (`voice_yaml`; the temperature is our key
# `sampling_temperature`; a client may set its own): drawn more narrowly than
# CosyVoice2's 25 at 1.0, our LM's tokens are heard better. Intelligibility bench, 100
# held-out sentences: the twelfth run's voice, seeds 0, 1: WER 0.461 at top-k 25, 0.429
# at 10, 0.421 at 5; the thirteenth run's, seeds 0-5 (2026-12-05, teacher 0.282): 0.397
# at top-k 5 and 1.0, 0.385 at 5 and 0.8, 0.381 at 3 and 0.8 (each seed 0.372-0.390),
# all through Opus tuned for general audio (for speech, as served since: 0.366).
TOP_K = 3
TEMPERATURE = 0.8


def voice_yaml(sizes: dict[str, int] | None = None) -> str:
    """`cosyvoice2.yaml` of our voice at `sizes` (default `VOICE`): the released layout
    with settings of ours. Repetition-aware sampling redraws a token seen in the
    last 10 with probability above tau_r: 0.1 (CosyVoice2's) would redraw 8.7 % of the
    teacher's own tokens (ours repeat more than its codes do), 0.25 under 1 %. Tokens
    are drawn from the `TOP_K` likeliest at `TEMPERATURE`. And the flow starts at
    `FLOW_START_T`, in `FLOW_STEPS` Euler steps."""
    text = yaml_text({**VOICE, **(sizes or {})})
    for old, new in [("tau_r: 0.1", f"tau_r: {RAS_TAU}"), ("top_k: 25", f"top_k: {TOP_K}")]:
        if old not in text:
            raise ValueError(f"the released yaml layout changed: no {old!r} to replace")
        text = text.replace(old, new)
    chunks = "num_decoding_left_chunks: -1\n"
    if chunks not in text:
        raise ValueError(f"the released yaml layout changed: no {chunks!r} to follow")
    text = text.replace(chunks, f"{chunks}sampling_temperature: {TEMPERATURE}  # ours\n")
    cfg = "                inference_cfg_rate: 0.7\n"
    if cfg not in text:
        raise ValueError("the released yaml layout changed: no inference_cfg_rate to follow")
    ours = f"                start_t: {FLOW_START_T}\n                n_timesteps: {FLOW_STEPS}\n"
    return text.replace(cfg, cfg + ours)
