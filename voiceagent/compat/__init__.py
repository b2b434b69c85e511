"""Drop-in APIs: the OpenAI, Cartesia and ElevenLabs clients people already run."""
