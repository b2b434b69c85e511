"""The LM on an SGLang server: `export` writes the checkpoint it serves, `client` streams
speech tokens from it into the engine."""
