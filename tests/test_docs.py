"""The tables in the docs agree with the code, so that they cannot drift apart.

A client author writes a client from docs/protocol.md alone, and an operator runs the
server from docs/operations.md. Each table below is parsed out of the Markdown (the key
of a row is the first `backticked` token of its first cell) and compared with what the
code defines or does: error codes, close codes, session settings and their defaults,
the CLI's commands, the flags of `serve`, `say` and `bench`, and the configuration's
keys with their defaults and flags.
"""

from __future__ import annotations

import argparse
import ast
import base64
import json
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import voiceagent
from voiceagent import config
from voiceagent.cli import build_parser
from voiceagent.protocol.errors import CloseCode, ErrorCode
from voiceagent.protocol.messages import Settings, settings_table
from voiceagent.server.background import BackgroundServer
from voiceagent.session.admission import SESSION_REFUSALS

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "docs" / "protocol.md"
OPERATIONS = ROOT / "docs" / "operations.md"
PACKAGE = Path(voiceagent.__file__).resolve().parent

# -- reading Markdown tables ------------------------------------------------------------


@dataclass
class Table:
    heading: str  # the last heading above the table, without the #s
    line: int  # 1-based line of the header row
    header: list[str]
    rows: list[list[str]]

    def column(self, name: str) -> int:
        assert name in self.header, f"table at line {self.line} has no column '{name}'"
        return self.header.index(name)


def _cells(line: str) -> list[str]:
    """Split a table row on `|`, but not on a `|` inside backticks."""
    cells, cell, code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return [*cells, cell.strip()]


def _tables(path: Path) -> list[Table]:
    lines = path.read_text().splitlines()
    tables: list[Table] = []
    heading, i, fence = "", 0, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif (
            not fence
            and line.startswith("|")
            and i + 1 < len(lines)
            and re.fullmatch(r"\|( *:?-+:? *\|)+", lines[i + 1].strip())
        ):
            table = Table(heading, i + 1, _cells(line), [])
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                table.rows.append(_cells(lines[i]))
                i += 1
            tables.append(table)
            continue
        i += 1
    return tables


def _table(path: Path, heading: str, header: list[str]) -> Table:
    """The one table under `heading` whose header starts with `header`."""
    found = [t for t in _tables(path) if t.heading == heading and t.header[: len(header)] == header]
    assert len(found) == 1, (
        f"{path.name}: expected one table with columns {header} under '{heading}', "
        f"found {len(found)}"
    )
    return found[0]


def _key(cell: str, table: Table) -> str:
    """The row's key: the first backticked token of its first cell."""
    match = re.match(r"`([^`]+)`", cell)
    assert match, f"table at line {table.line}: row '{cell}' does not start with a `key`"
    return match.group(1)


def _keys(table: Table) -> list[str]:
    return [_key(row[0], table) for row in table.rows]


def _differ(what: str, documented: set[Any], in_code: set[Any]) -> str:
    return (
        f"{what}: documented but not in the code: {sorted(documented - in_code)}; "
        f"in the code but not documented: {sorted(in_code - documented)}"
    )


# -- reading the code -------------------------------------------------------------------


def _package_trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py"))]


def _offer_errors() -> set[tuple[str, int]]:
    """(code, HTTP status) of every `OfferError(...)` the package raises or returns (the
    errors of POST /v1/webrtc/offer), wherever the WebRTC module lives."""
    trees = _package_trees()
    default_status = None
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "OfferError":
                init = next(
                    f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"
                )
                names = [a.arg for a in init.args.args]
                defaults = dict(
                    zip(names[-len(init.args.defaults) :], init.args.defaults, strict=True)
                )
                default_status = ast.literal_eval(defaults["status"])
    assert default_status is not None, "class OfferError not found in the package"
    found: set[tuple[str, int]] = set()
    for path, tree in trees:
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "OfferError"
            ):
                continue
            code_arg = node.args[0]
            text = ast.unparse(code_arg)
            if isinstance(code_arg, ast.Constant):
                codes = [code_arg.value]
            elif text == "str(refusal.code)":  # the session admission's refusal
                codes = [c.value for c in SESSION_REFUSALS]
            else:  # str(ErrorCode.NAME)
                match = re.fullmatch(r"str\(ErrorCode\.(\w+)\)", text)
                assert match, (
                    f"{path}: OfferError code '{text}' is neither a string nor an ErrorCode"
                )
                codes = [ErrorCode[match.group(1)].value]
            status = default_status
            if len(node.args) > 2:
                status = ast.literal_eval(node.args[2])
            for kw in node.keywords:
                if kw.arg == "status":
                    status = ast.literal_eval(kw.value)
            found.update((code, status) for code in codes)
    return found


def _close_codes_in_server_code() -> set[int]:
    """The `CloseCode` constants the package's code sends (not just defines)."""
    used: set[int] = set()
    for path, tree in _package_trees():
        if path.name == "errors.py" and path.parent.name == "protocol":
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "CloseCode"
            ):
                used.add(getattr(CloseCode, node.attr))
    return used


# Close codes that the WebSocket layer (uvicorn with websockets) sends by itself, not
# our code. 1002 and 1007 are checked against a real server below; 1009 in
# test_bad_input.py; 1011 (keepalive timeout, after 40 s) and 1012 (shutdown) are read
# from uvicorn's websockets-sansio implementation.
TRANSPORT_CLOSE_CODES = {
    1002: "a frame that breaks the WebSocket protocol",
    1007: "a text message that is not UTF-8",
    1009: "a message over ServerConfig.hard_max_message_bytes",
    1011: "no answer to the keepalive ping",
    1012: "server shutdown",
}


def _code_settings() -> dict[str, Any]:
    """Every session setting (nested ones as `format.codec`) and its default. The only
    place where this test reads the settings from the code."""
    flat: dict[str, Any] = {}
    for key, value in Settings().to_dict().items():
        if isinstance(value, dict):
            flat.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    return flat


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, str | None]:
    """Every command, nested ones as `voice add`, with its help text."""
    found: dict[str, str | None] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                found[prefix + name] = helps.get(name)
                found.update(_commands(sub, f"{prefix}{name} "))
    return found


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise AssertionError("the CLI has no subcommands")


def _literal(cell: str) -> tuple[bool, Any]:
    """(True, value) when the cell starts with a backticked literal, else (False, None)."""
    match = re.match(r"`([^`]+)`", cell)
    if not match:
        return False, None
    try:
        return True, json.loads(match.group(1))
    except ValueError:
        return True, match.group(1)


# -- (a) error codes --------------------------------------------------------------------


def test_the_error_table_lists_exactly_the_error_codes() -> None:
    table = _table(PROTOCOL, "Errors", ["code", "when"])
    keys = _keys(table)
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    assert not duplicates, f"error codes documented twice: {duplicates}"
    assert set(keys) == {c.value for c in ErrorCode}, _differ(
        "error codes (protocol.md#errors vs ErrorCode)", set(keys), {c.value for c in ErrorCode}
    )


# Where the errors a session's socket can carry are raised: its protocol core, its
# admission, its runner and pipeline, and the guard in front of it.
SESSION_ERROR_SOURCES = [
    "protocol/messages.py",
    "protocol/session.py",
    "session/admission.py",
    "session/runner.py",
    "pipeline/turn.py",
    "transport/guard.py",
]


def test_the_demo_page_has_plain_words_for_every_error_a_session_can_get() -> None:
    # What was seen: idle_timeout and session_start_timeout were shown as "The server
    # reported an error."
    values = {c.value for c in ErrorCode}
    raised: set[str] = set()
    for name in SESSION_ERROR_SOURCES:
        text = (PACKAGE / name).read_text()
        raised |= {ErrorCode[m].value for m in re.findall(r"ErrorCode\.([A-Z_]+)", text)}
        raised |= set(re.findall(r'"([a-z_]+)"', text)) & values
    assert {"idle_timeout", "synthesis_failed", "text_too_long"} <= raised  # the reader reads
    page = (ROOT / "web" / "app.js").read_text()
    words = page[page.index("const ERROR_TEXT = {") : page.index("};", page.index("ERROR_TEXT"))]
    assert raised <= set(re.findall(r"^  ([a-z_]+):", words, re.M)), raised


def test_the_webrtc_offer_error_table_lists_exactly_the_offer_errors() -> None:
    table = _table(PROTOCOL, "WebRTC sessions", ["code", "HTTP status", "when"])
    status = table.column("HTTP status")
    documented = {(_key(row[0], table), int(row[status])) for row in table.rows}
    in_code = _offer_errors()
    assert documented == in_code, _differ(
        "WebRTC offer errors (code, HTTP status)", documented, in_code
    )


# -- (b) close codes --------------------------------------------------------------------


def test_the_close_code_table_lists_exactly_the_codes_the_server_sends() -> None:
    table = _table(PROTOCOL, "Close codes", ["code", "when"])
    documented = {int(k) for k in _keys(table)}
    in_code = _close_codes_in_server_code() | set(TRANSPORT_CLOSE_CODES)
    assert documented == in_code, _differ("close codes", documented, in_code)


def _raw_websocket(server: BackgroundServer) -> socket.socket:
    host, port = server.http.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /v1/ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection during the handshake"
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 101"), reply[:100]
    assert not reply.split(b"\r\n\r\n", 1)[1], "the server sent a frame before we did"
    return sock


def _frame(opcode: int, payload: bytes, *, masked: bool = True) -> bytes:
    assert len(payload) < 126
    if not masked:
        return bytes([0x80 | opcode, len(payload)]) + payload
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + body


def _close_code_after(server: BackgroundServer, frame: bytes) -> int | None:
    """Send one raw frame; return the code of the close frame the server answers with."""
    with _raw_websocket(server) as sock:
        sock.sendall(frame)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    # Server frames are unmasked; only short ones are expected here.
    while len(data) >= 2:
        opcode, length = data[0] & 0x0F, data[1] & 0x7F
        assert length < 126, "unexpected long frame"
        payload, data = data[2 : 2 + length], data[2 + length :]
        if opcode == 0x8:
            return int(struct.unpack("!H", payload[:2])[0]) if len(payload) >= 2 else None
    return None


def test_the_transport_close_codes_are_what_a_real_server_sends(server: BackgroundServer) -> None:
    documented = {int(k) for k in _keys(_table(PROTOCOL, "Close codes", ["code", "when"]))}
    invalid_utf8 = _close_code_after(server, _frame(0x1, b'{"type": "ping"\xff}'))
    unmasked = _close_code_after(server, _frame(0x1, b'{"type": "ping"}', masked=False))
    bad_opcode = _close_code_after(server, _frame(0x3, b"x"))
    expected = (1007, 1002, 1002)  # as TRANSPORT_CLOSE_CODES and protocol.md say
    assert (invalid_utf8, unmasked, bad_opcode) == expected, (
        f"the server closed invalid UTF-8 with {invalid_utf8}, an unmasked frame with "
        f"{unmasked}, an unknown opcode with {bad_opcode}; expected {expected}"
    )
    assert {1007, 1002} <= documented, f"protocol.md#close-codes lacks 1002 or 1007: {documented}"


# -- (c) settings -----------------------------------------------------------------------


def test_the_settings_table_is_the_one_the_code_describes() -> None:
    """protocol.md holds exactly the table generated from SETTINGS, which also validates
    the settings and gives `session.created` its defaults."""
    table = settings_table()
    doc = PROTOCOL.read_text()
    assert table in doc, (
        "protocol.md's settings table is not the one SETTINGS describes; replace it with:\n" + table
    )
    assert doc.count("| key | type | allowed | default | meaning |") == 1
    documented = {row.split("`")[1] for row in table.splitlines()[2:]}
    assert documented == set(_code_settings()), _differ(
        "settings (SETTINGS vs Settings())", documented, set(_code_settings())
    )


# -- (d) CLI commands -------------------------------------------------------------------


def test_the_command_table_lists_exactly_the_cli_commands() -> None:
    table = _table(OPERATIONS, "Commands", ["command", "what"])
    documented = set(_keys(table))
    commands = _commands(build_parser())
    leaves = {name for name in commands if not any(c.startswith(name + " ") for c in commands)}
    assert documented == leaves, _differ("commands (operations.md vs cli.py)", documented, leaves)
    no_help = sorted(name for name, text in commands.items() if not text)
    assert not no_help, f"commands without a help line in `voiceagent --help`: {no_help}"


# -- (e) flags --------------------------------------------------------------------------


def _flag_rows(command: str) -> dict[str, tuple[str, Table]]:
    """Documented flag (or positional, as its upper-case name) -> its default cell."""
    table = _table(OPERATIONS, f"`voiceagent {command}`", ["flag", "default", "meaning"])
    rows: dict[str, tuple[str, Table]] = {}
    for row in table.rows:
        names = [token.split()[0] for token in re.findall(r"`([^`]+)`", row[0])]
        assert names, f"operations.md line {table.line}: row '{row[0]}' names no flag"
        for name in names:
            rows[name] = (row[1], table)
    return rows


def _flag_actions(command: str) -> dict[str, argparse.Action]:
    found: dict[str, argparse.Action] = {}
    for action in _subparser(command)._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for name in action.option_strings or [action.dest.upper()]:
            found[name] = action
    return found


def _real_default(command: str, action: argparse.Action) -> Any:
    """The parser's default, except for the flags of a configuration key: those default to
    None in the parser (a flag not given leaves the file's value), the key's is real."""
    if command in ("serve", "config"):
        for info in config.schema_keys():
            if info.flag in action.option_strings:
                default = info.default
                # "" and 0 are a key's "unset": described in words, like None
                if default in ("", 0) and not isinstance(default, float):
                    return None
                return ",".join(map(str, default)) if isinstance(default, tuple) else default
    return action.default


def _default_differs(cell: str, action: argparse.Action, default: Any) -> str | None:
    is_literal, documented = _literal(cell)
    if not action.option_strings:  # a positional argument
        return None if cell == "—" else f"a positional argument: default '—', not '{cell}'"
    if action.required:
        return None if cell == "required" else f"required, but documented as '{cell}'"
    if isinstance(action, argparse._StoreTrueAction):
        return None if cell == "off" else f"an on/off switch, documented as '{cell}'"
    if not is_literal:
        # A default described in words is computed at run time: None in the parser.
        if default is None:
            return None
        return f"documented as '{cell}', but the parser's default is {default!r}"
    try:
        same = float(documented) == float(default)
    except (TypeError, ValueError):
        same = str(documented) == str(default)
    return None if same else f"documented default {documented!r}, parser: {default!r}"


@pytest.mark.parametrize("command", ["serve", "say", "bench"])
def test_the_flag_table_matches_the_parser(command: str) -> None:
    rows = _flag_rows(command)
    actions = _flag_actions(command)
    assert set(rows) == set(actions), _differ(
        f"`voiceagent {command}` flags (operations.md vs cli.py)", set(rows), set(actions)
    )
    wrong = []
    for name, (cell, _) in rows.items():
        action = actions[name]
        if problem := _default_differs(cell, action, _real_default(command, action)):
            wrong.append(f"{name}: {problem}")
    assert not wrong, f"`voiceagent {command}` defaults that differ:\n" + "\n".join(wrong)


# -- (f) configuration keys -------------------------------------------------------------


def _code(cell: str) -> str | None:
    """The cell's first `backticked` text, as written; None for a cell without one (—)."""
    match = re.match(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def test_the_key_table_lists_exactly_the_configuration_keys_with_defaults_and_flags() -> None:
    """Default as the TOML the file would hold, flag as the parser spells it."""
    table = _table(OPERATIONS, "Keys", ["key", "default", "flag", "meaning"])
    default, flag = table.column("default"), table.column("flag")
    documented = {
        _key(row[0], table): (_code(row[default]), _code(row[flag])) for row in table.rows
    }
    keys = config.schema_keys()
    in_code = {info.key: (config.toml_value(info.default), info.flag) for info in keys}
    assert set(documented) == set(in_code), _differ(
        "configuration keys (operations.md#keys vs voiceagent/config)",
        set(documented),
        set(in_code),
    )
    wrong = [
        f"{key}: documented (default, flag) {documented[key]}, in the code {in_code[key]}"
        for key in in_code
        if documented[key] != in_code[key]
    ]
    assert not wrong, "configuration keys that differ:\n" + "\n".join(wrong)


# -- links between the docs ----------------------------------------------------------------


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as
    hyphens ("`train seed`: from an export" -> "train-seed-from-an-export")."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def test_every_link_between_the_docs_reaches_a_file_and_a_heading() -> None:
    """A page moved or a heading renamed leaves no dead link in README.md or docs/."""
    dead = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                dead.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                dead.append(f"{page.name}: {target} (no such heading)")
    assert not dead, dead
