"""Loading: defaults, the TOML file, the environment and the flags, merged with each
value's source remembered, validated, and shown back (`voiceagent config`)."""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import EnvSettingsSource, SettingsError

from .schema import CONFIG_ENV, ENV_PREFIX, MASK, TWILIO_TOKEN_ALIAS, Key, Settings, schema_keys


class ConfigError(Exception):
    """Bad configuration: one line per problem, all of them at once."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(f"config error: {p}" for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class Loaded:
    settings: Settings
    sources: dict[Key, str]  # "default", "file PATH", "env VAR" or "flag --x", for every key
    file: Path | None


Path_ = tuple[str, ...]  # ("server", "port"), or ("servr",) for a whole unknown section
Layer = dict[Path_, tuple[Any, str]]  # value and where it came from


def load(file: str | Path | None = None, flags: dict[Key, Any] | None = None) -> Loaded:
    """Defaults, then the file (`file`, else $VOICEAGENT_CONFIG), then the environment,
    then `flags`; validated. Raises ConfigError naming every bad key and its source."""
    file = file or os.environ.get(CONFIG_ENV) or None
    path = Path(file) if file else None
    values: Layer = {}
    layers = [
        _file_layer(path) if path else {},
        _env_layer(),
        {tuple(k.split(".")): (v, f"flag {_flag_of(k)}") for k, v in (flags or {}).items()},
    ]
    for layer in layers:
        for where, value in layer.items():
            # a higher layer's ("server", "port") replaces a lower one's ("server",) too
            for old in [p for p in values if p[: len(where)] == where or where[: len(p)] == p]:
                del values[old]
            values[where] = value
    try:
        settings = Settings(**_nest(values))
    except ValidationError as exc:
        raise ConfigError(_problems(exc.errors(), values)) from None
    sources = {info.key: "default" for info in schema_keys()}
    sources.update({".".join(p): source for p, (_, source) in values.items()})
    return Loaded(settings, sources, path)


def _flag_of(key: Key) -> str:
    return next(info.flag or key for info in schema_keys() if info.key == key)


def _file_layer(path: Path) -> Layer:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError([f"{path}: {exc.strerror}"]) from None
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line L, column C)"
        raise ConfigError([f"{path}: {exc}"]) from None
    return {p: (v, f"file {path}") for p, v in _flat(data)}


def _env_layer() -> Layer:
    names = {name.upper(): name for name in os.environ}
    # VOICEAGENT_SECTION__KEY: a misspelt section would be skipped without a word (a
    # misspelt key is caught below, by the section's own check)
    misspelt = [
        f"{name} (from env {name}): {_unknown((section.lower(),))}"
        for upper, name in names.items()
        if upper.startswith(ENV_PREFIX) and "__" in upper
        for section in [upper.removeprefix(ENV_PREFIX).split("__")[0]]
        if section.lower() not in Settings.model_fields
    ]
    if misspelt:
        raise ConfigError(misspelt)
    try:
        data = EnvSettingsSource(Settings)()
    except SettingsError as exc:
        # only a whole section (VOICEAGENT_SERVER, not ..._SERVER__PORT) is read as JSON
        sections = [
            names[n] for s in Settings.model_fields if (n := ENV_PREFIX + s.upper()) in names
        ]
        problems = [f"{n} (from env {n}): should be a JSON object" for n in sections]
        raise ConfigError(problems or [f"environment: {exc}"]) from None
    layer: Layer = {}
    for p, v in _flat(data):
        name = ENV_PREFIX + "__".join(p).upper()
        # a key set in a whole-section variable is attributed to that variable
        name = names.get(name) or names.get(ENV_PREFIX + p[0].upper()) or name
        layer[p] = (v, f"env {name}")
    token = ("telephony", "twilio_auth_token")
    if os.environ.get(TWILIO_TOKEN_ALIAS) and token not in layer:
        layer[token] = (os.environ[TWILIO_TOKEN_ALIAS], f"env {TWILIO_TOKEN_ALIAS}")
    return layer


def _flat(data: dict[str, Any]) -> Iterator[tuple[Path_, Any]]:
    for section, table in data.items():
        if isinstance(table, dict) and table:
            for key, value in table.items():
                yield (section, key), value
        else:
            yield (section,), table


def _nest(values: Layer) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for where, (value, _) in values.items():
        if len(where) == 1:
            nested[where[0]] = value
        else:
            nested.setdefault(where[0], {})[where[1]] = value
    return nested


def _problems(errors: list[ErrorDetails], values: Layer) -> list[str]:
    """One line per bad key, e.g. `server.port = 70000 (from /etc/voiceagent.toml): Input
    should be less than or equal to 65535`."""
    by_key: dict[Path_, list[str]] = {}
    for error in errors:
        loc = [str(p) for p in error["loc"]]
        if len(loc) == 1 and "key" in error.get("ctx", {}):
            loc.append(error["ctx"]["key"])
        where = tuple(loc[:2])
        message = _unknown(where) if error["type"] == "extra_forbidden" else error["msg"]
        if loc[2:]:  # an item of a list: playout.chunks[1]
            message = f"[{loc[2]}] {message}"
        by_key.setdefault(where, []).append(message)
    return [_problem(where, "; ".join(messages), values) for where, messages in by_key.items()]


def _problem(where: Path_, message: str, values: Layer) -> str:
    name = ".".join(where)
    if where in values:
        value, source = values[where]
        # a secret's value is never shown, nor an unknown key's: it may be a misspelt one
        secret = where[-1] in ("twilio_auth_token", "token_secret") or not _known(where)
        shown = MASK if secret else value
        return f"{name} = {toml_value(shown)} ({_from(source)}): {message}"
    # a whole section: its keys all came from one place, name the first
    sources = [s for p, (_, s) in values.items() if p[: len(where)] == where]
    return f"{name} ({_from(sources[0]) if sources else 'default'}): {message}"


def _known(where: Path_) -> bool:
    section = Settings.model_fields.get(where[0])
    fields = section.annotation.model_fields if section and section.annotation else {}
    return len(where) < 2 or where[1] in fields


def _from(source: str) -> str:
    return "from " + source.removeprefix("file ")


def _unknown(where: Path_) -> str:
    if len(where) == 1:
        what, known = "section", list(Settings.model_fields)
    else:
        section = Settings.model_fields[where[0]].annotation
        what, known = "key", list(section.model_fields) if section else []
    close = difflib.get_close_matches(where[-1], known, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(known)}"
    return f"unknown {what}{hint}"


# -- showing ------------------------------------------------------------------------------


def render(loaded: Loaded) -> str:
    """The settings in effect as TOML, each value followed by where it came from; secrets
    are masked."""
    lines = [
        "# voiceagent settings in effect; after each value, where it came from",
        "# (precedence: flag > environment > file > default)",
    ]
    for section, values in loaded.settings:
        lines += ["", f"[{section}]"]
        for key, value in values:
            lines.append(f"{key} = {toml_value(value)}  # {loaded.sources[f'{section}.{key}']}")
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """`value` as TOML (a secret as "***" when set, else "")."""
    if isinstance(value, SecretStr):
        return toml_value(MASK if value.get_secret_value() else "")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # only in errors: a table where a value belongs
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return repr(value)  # 30.0, inf
    return str(value)
