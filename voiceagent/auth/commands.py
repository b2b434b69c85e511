"""`voiceagent key add|list|revoke` and `voiceagent token`: what an operator runs. They
read the same configuration as `serve` (--config, the environment) for the keys file
and the token secret."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlencode

from .. import config
from . import keys, tokens


def _loaded(args: argparse.Namespace) -> config.Settings | None:
    try:
        return config.load(args.config).settings
    except config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return None


def _keys_file(args: argparse.Namespace) -> Path | None:
    if args.keys_file:
        return Path(args.keys_file)
    settings = _loaded(args)
    if settings is not None and settings.auth.keys_file:
        return Path(settings.auth.keys_file)
    print("error: no keys file: give --keys-file or set auth.keys_file", file=sys.stderr)
    return None


def key_add(args: argparse.Namespace) -> int:
    path = _keys_file(args)
    if path is None:
        return 2
    try:
        key, record = keys.add_key(path, args.tenant)
    except (OSError, ValueError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(
        f"key {record.id} for tenant '{record.tenant}' added to {path}; this is the only "
        "time the key is shown",
        file=sys.stderr,
    )
    return 0


def key_list(args: argparse.Namespace) -> int:
    path = _keys_file(args)
    if path is None:
        return 2
    try:
        found = keys.read(path)
    except (OSError, ValueError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    print(f"{'id':<10}{'tenant':<24}created")
    for r in found.keys:
        print(f"{r.id:<10}{r.tenant:<24}{r.created}")
    return 0


def key_revoke(args: argparse.Namespace) -> int:
    path = _keys_file(args)
    if path is None:
        return 2
    try:
        revoked = keys.revoke_key(path, args.id)
    except (OSError, ValueError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    if not revoked:
        print(f"error: no key {args.id!r} in {path}", file=sys.stderr)
        return 1
    print(f"key {args.id} revoked; a running server stops accepting it at once")
    return 0


def token(args: argparse.Namespace) -> int:
    settings = _loaded(args)
    if settings is None:
        return 2
    secret = settings.auth.token_secret.get_secret_value()
    if not secret:
        print(
            "error: auth.token_secret is not set (VOICEAGENT_AUTH__TOKEN_SECRET): a token "
            "the CLI signs must be checked with the server's secret",
            file=sys.stderr,
        )
        return 2
    try:
        keys.check_tenant(args.tenant)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.ttl is not None and args.ttl <= 0:  # (0 made a token of the longest life)
        print(f"error: --ttl must be seconds > 0, got {args.ttl}", file=sys.stderr)
        return 2
    ttl = min(args.ttl or settings.auth.token_ttl_s, settings.auth.token_ttl_s)
    minted = tokens.mint(secret.encode(), args.tenant, ttl, args.voice)
    if args.url:
        sep = "&" if "?" in args.url else "?"
        print(f"{args.url}{sep}{urlencode({'token': minted})}")
    else:
        print(minted)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("key", help="manage API keys (key add, key list, key revoke)")
    ksub = s.add_subparsers(dest="key_command", required=True)
    for name, func, what in (
        ("add", key_add, "make an API key for a tenant; prints the key once"),
        ("list", key_list, "list API keys: id, tenant, when made (never the keys)"),
        ("revoke", key_revoke, "revoke an API key by id; a running server drops it at once"),
    ):
        s = ksub.add_parser(name, help=what)
        if name == "add":
            s.add_argument("--tenant", required=True, help="the tenant the key acts for")
        if name == "revoke":
            s.add_argument("id", help="the key's id (voiceagent key list)")
        s.add_argument("--keys-file", help="the keys file (default: the key auth.keys_file)")
        s.add_argument("--config", metavar="FILE", help="TOML settings file, as in serve")
        s.set_defaults(func=func)

    s = sub.add_parser("token", help="mint a short-lived session token (a demo link with --url)")
    s.add_argument("--tenant", required=True)
    s.add_argument("--voice", help="the only voice the token may use")
    s.add_argument("--ttl", type=int, help="seconds (default and most: auth.token_ttl_s)")
    s.add_argument("--url", help="print this URL with ?token=… (e.g. http://host:8000/)")
    s.add_argument("--config", metavar="FILE", help="TOML settings file, as in serve")
    s.set_defaults(func=token)
