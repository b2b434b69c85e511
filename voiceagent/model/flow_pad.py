"""The token id that marks a lookahead position past the end of a turn."""

PAD_TOKEN = -1  # embeds to zeros, like the end-of-utterance padding of an offline pass
