"""Roles: names for a voice with its speaking defaults, from one TOML file.

    [roles.support]
    voice = "anna"        # a voice the server has (shared, or the caller's tenant's)
    language = "en"
    speed = 1.1
    temperature = 0.9     # sampling: temperature, top_k, top_p, seed
    seed = 7

A session (and every drop-in API) may name a role wherever it names a voice; the role's
defaults apply, and whatever the client sets explicitly wins. A role points at a voice
that is already loaded, so switching roles costs no model work at turn time.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

from .errors import ProtocolError
from .messages import SETTING

ROLE_FIELDS = ("voice", "language", "speed", "temperature", "top_k", "top_p", "seed")
SAMPLING = ("temperature", "top_k", "top_p", "seed")


@dataclass(frozen=True)
class Role:
    name: str
    voice: str
    defaults: dict[str, Any] = field(default_factory=dict)  # as `session.update` settings

    def settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The session settings `changes` naming this role stand for: the role's
        defaults, overridden by anything `changes` sets itself."""
        merged = {**self.defaults, **changes}
        asked = changes.get("sampling", {})
        if isinstance(asked, dict):  # (anything else is the settings check's to refuse)
            sampling = {**self.defaults.get("sampling", {}), **asked}
            if sampling:
                merged["sampling"] = sampling
        return merged


def parse_roles(text: str, source: str = "roles file") -> dict[str, Role]:
    """Roles from TOML text; ValueError naming the role and key for anything invalid."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not TOML: {exc}") from None
    unknown = sorted(set(data) - {"roles"})
    if unknown:
        raise ValueError(
            f"{source}: unknown table(s) {', '.join(unknown)}; roles go in [roles.NAME]"
        )
    roles: dict[str, Role] = {}
    for name, entry in data.get("roles", {}).items():
        where = f"{source}: role '{name}'"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a table")
        bad = sorted(set(entry) - set(ROLE_FIELDS))
        if bad:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(bad)}; allowed: {', '.join(ROLE_FIELDS)}"
            )
        voice = entry.get("voice")
        if not isinstance(voice, str) or not voice:
            raise ValueError(f"{where} needs a voice")
        defaults: dict[str, Any] = {}
        for key, value in entry.items():
            if key == "voice":
                continue
            setting = f"sampling.{key}" if key in SAMPLING else key
            try:
                checked = SETTING[setting].check(value)
            except ProtocolError as exc:
                raise ValueError(f"{where}: {exc.message}") from None
            if key in SAMPLING:
                defaults.setdefault("sampling", {})[key] = checked
            else:
                defaults[key] = checked
        roles[name] = Role(name, voice, defaults)
    return roles
