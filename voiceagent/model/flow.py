"""The old home of PAD_TOKEN (the tiny flow is now tiny/flow.py), kept only because
pipeline/turn.py imports it from here; new code imports it from contract.py."""

from .contract import PAD_TOKEN

__all__ = ["PAD_TOKEN"]
