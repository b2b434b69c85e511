"""The tiny random-weight model: small flow and vocoder stages (flow.py, vocoder.py) on
the shared LM class, its config.json (config.py), and its directory layout, built once
into ~/.cache/voiceagent (checkpoint.py). Tests and a model-less `voiceagent serve` use it;
its audio is noise."""
