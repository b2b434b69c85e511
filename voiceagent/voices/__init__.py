"""Voices made from reference audio: checking the audio (reference.py) and the tenants'
registry of voices behind /v1/voices (registry.py)."""
