"""The sizes of our own voice's model: the released CosyVoice2 layout, scaled down so that
each part trains on a 2-core CPU in a stated budget and the whole directory ships with
the project (keys as in `model.cosyvoice2.random_checkpoint.SIZES`)."""

from __future__ import annotations

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
