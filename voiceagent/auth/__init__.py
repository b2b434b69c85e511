"""Who may use the server: API keys (keys.py), signed session tokens (tokens.py), and the
gate that checks a credential at every entry (gate.py). docs/security.md."""
