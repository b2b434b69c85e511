"""The `serve` and `config` flags, made from the schema: one per key that has one."""

from __future__ import annotations

import argparse
from typing import Any, Literal, get_args, get_origin

from .schema import CONFIG_ENV, Key, KeyInfo, schema_keys

GLOBAL_FLAGS = ("--log-level",)  # given before the command: `voiceagent --log-level debug serve`


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """`--config` and one flag per key that has one. Their parser default is None: a flag
    not given leaves the file's or the environment's value; --help shows the real one."""
    parser.add_argument(
        "--config", metavar="FILE", help=f"TOML settings file (default: ${CONFIG_ENV}, or none)"
    )
    for info in schema_keys():
        if info.flag is None or info.flag in GLOBAL_FLAGS:
            continue
        kwargs: dict[str, Any] = {"default": None, "help": _flag_help(info)}
        if get_origin(info.annotation) is Literal:
            kwargs["choices"] = get_args(info.annotation)
        elif info.annotation in (int, float):
            kwargs["type"] = info.annotation
        parser.add_argument(info.flag, **kwargs)


def _flag_help(info: KeyInfo) -> str:
    default = info.default
    if isinstance(default, tuple):
        default = ",".join(str(x) for x in default)
    shown = "" if default == "" else f"; default: {default}"
    return f"{info.meaning}{shown}; key: {info.key}".replace("%", "%%")


def flag_values(args: argparse.Namespace) -> dict[Key, Any]:
    """The keys whose flags were given on the command line."""
    found = {}
    for info in schema_keys():
        value = getattr(args, _dest(info.flag), None) if info.flag else None
        if value is not None:
            found[info.key] = value
    return found
