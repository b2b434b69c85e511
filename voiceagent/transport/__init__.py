"""Transports: the ways a session's audio leaves (and the listener's audio arrives).
Each implements `voiceagent.session.port.Transport`."""
