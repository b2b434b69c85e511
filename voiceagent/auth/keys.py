"""API keys for servers (a bot, a backend that mints browser tokens), in a TOML file:

    [quota]                 # every tenant's default quota (0 or absent: no limit)
    sessions = 20
    [tenants.acme]          # one tenant's own quota, over the default
    turns_per_min = 120
    [[keys]]
    id = "3f9a1c2b"
    tenant = "acme"
    sha256 = "…"
    created = "2026-01-01T00:00:00Z"

A key is `va_<id>_<secret>`; the file holds only the SHA-256 of the whole key. A fast
hash is enough because the key is 256 random bits: nobody can guess one from its hash,
unlike a password, where a slow hash (argon2, bcrypt) buys time against a dictionary.
The server re-reads the file when it changes, so `voiceagent key revoke` takes effect
without a restart. `key add` and `key revoke` rewrite the file (comments are not kept).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..session.quota import Quota

TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # also a folder name under voices_dir
KEY = re.compile(r"^va_([0-9a-f]{8})_[A-Za-z0-9_-]{43}\Z")
DEFAULT_TENANT = "default"


def check_tenant(name: str) -> str:
    if not TENANT.match(name):
        raise ValueError(
            f"tenant {name[:80]!r} must be 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyRecord:
    id: str
    tenant: str
    sha256: str
    created: str


@dataclass(frozen=True)
class KeysFile:
    keys: tuple[KeyRecord, ...] = ()
    default_quota: Quota = field(default_factory=Quota)
    quotas: dict[str, Quota] = field(default_factory=dict)
    # each tenant's table as written (zeros included), so that a rewrite keeps what the
    # tenant overrides and no more: the rest follows [quota] as it changes
    tables: dict[str, dict[str, int]] = field(default_factory=dict)

    def quota(self, tenant: str) -> Quota:
        return self.quotas.get(tenant, self.default_quota)

    def tenant_of(self, key: str) -> str | None:
        """The tenant `key` belongs to; None for a key that is not (or no longer) here."""
        match = KEY.match(key)
        if match is None:
            return None
        wanted = digest(key)
        for record in self.keys:
            if record.id == match.group(1) and hmac.compare_digest(record.sha256, wanted):
                return record.tenant
        return None


def _quota(table: object, base: Quota, where: str) -> Quota:
    if not isinstance(table, dict):
        raise ValueError(f"{where} should be a table")
    values = {}
    for name in ("sessions", "turns_per_min", "chars_per_min", "voices"):
        value = table.get(name, getattr(base, name))
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}.{name} should be a whole number >= 0")
        values[name] = value
    unknown = set(table) - set(values)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    return Quota(**values)


def parse(text: str) -> KeysFile:
    """Raises ValueError (tomllib's TOMLDecodeError is one) naming what is wrong."""
    data = tomllib.loads(text)
    unknown = sorted(set(data) - {"quota", "tenants", "keys"})
    if unknown:  # a misspelt table would mean no limit, silently
        raise ValueError(
            f"unknown table(s) {', '.join(unknown)}: the file has [quota], "
            "[tenants.NAME] and [[keys]]"
        )
    default = _quota(data.get("quota", {}), Quota(), "quota")
    tables = data.get("tenants", {})
    if not isinstance(tables, dict):
        raise ValueError("tenants should be tables: [tenants.NAME]")
    quotas = {
        check_tenant(name): _quota(table, default, f"tenants.{name}")
        for name, table in tables.items()
    }
    items = data.get("keys", [])
    if not isinstance(items, list):
        raise ValueError("keys should be [[keys]] entries")
    records = []
    for item in items:
        try:
            record = KeyRecord(
                item["id"], check_tenant(item["tenant"]), item["sha256"], item.get("created", "")
            )
        except (KeyError, TypeError):
            raise ValueError("each [[keys]] needs id, tenant and sha256") from None
        if not all(isinstance(v, str) for v in (record.id, record.sha256, record.created)):
            raise ValueError(f"[[keys]] {record.id!r}: id, sha256 and created are strings")
        records.append(record)
    return KeysFile(tuple(records), default, quotas, {name: dict(t) for name, t in tables.items()})


def render(keys: KeysFile) -> str:
    lines = ["# voiceagent API keys (SHA-256 only) and tenants' quotas; see docs/security.md", ""]

    def table(name: str, values: dict[str, int]) -> None:
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {v}" for k, v in values.items())
        lines.append("")

    if keys.default_quota != Quota():  # (a zero there is the same as none)
        table("quota", {k: v for k, v in keys.default_quota.__dict__.items() if v})
    for tenant, values in keys.tables.items():
        table(f"tenants.{json.dumps(tenant)}", values)
    for r in keys.keys:
        lines += ["[[keys]]", f'id = "{r.id}"', f"tenant = {json.dumps(r.tenant)}"]
        lines += [f'sha256 = "{r.sha256}"', f'created = "{r.created}"', ""]
    return "\n".join(lines)


def read(path: Path) -> KeysFile:
    return parse(path.read_text()) if path.exists() else KeysFile()


def write(path: Path, keys: KeysFile) -> None:
    """Replace the file whole (the server never reads half of one), keeping who may read
    it: a new file is its owner's alone; a rewritten one keeps its mode and owner (the
    server may run as another user, as in the images)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(keys))
    try:
        was = path.stat()
    except FileNotFoundError:
        os.chmod(tmp, 0o600)
    else:
        os.chmod(tmp, was.st_mode & 0o777)
        if (was.st_uid, was.st_gid) != (os.getuid(), os.getgid()):
            with contextlib.suppress(PermissionError):  # only root can give it away
                os.chown(tmp, was.st_uid, was.st_gid)
    tmp.replace(path)


def add_key(path: Path, tenant: str) -> tuple[str, KeyRecord]:
    """A new key for `tenant`, saved (hashed) in the file; the key itself is returned
    once and kept nowhere."""
    keys = read(path)
    key_id = secrets.token_hex(4)
    while any(r.id == key_id for r in keys.keys):
        key_id = secrets.token_hex(4)
    key = f"va_{key_id}_{secrets.token_urlsafe(32)}"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = KeyRecord(key_id, check_tenant(tenant), digest(key), now)
    write(path, replace(keys, keys=(*keys.keys, record)))
    return key, record


def revoke_key(path: Path, key_id: str) -> bool:
    keys = read(path)
    kept = tuple(r for r in keys.keys if r.id != key_id)
    if len(kept) == len(keys.keys):
        return False
    write(path, replace(keys, keys=kept))
    return True


class KeyStore:
    """The keys file as the server sees it: re-read whenever it changed on disk (one
    stat per check). A file that does not parse keeps the last good contents (and is
    logged by the caller through `error`)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.current = KeysFile()
        self.error: str | None = None
        self._seen: tuple[int, int, int] | None = None
        self.refresh()

    def refresh(self) -> KeysFile:
        if self.path is None:
            return self.current
        try:
            st = self.path.stat()
            seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            seen = (0, 0, 0)
        if seen != self._seen:
            self._seen = seen
            try:
                self.current = read(self.path)
                self.error = None
            except (OSError, ValueError) as exc:
                self.error = f"keys file {self.path}: {exc}"
        return self.current
