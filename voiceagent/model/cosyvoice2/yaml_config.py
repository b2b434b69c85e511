"""Read hyper-parameters from a released `cosyvoice2.yaml` without executing it.

The file is written for hyperpyyaml: tags such as `!new:module.Class`, `!name:fn`,
`!apply:fn [args]` would import and call code, and `!ref <key>` refers to other keys.
Here every tag becomes inert data: a tagged mapping is a plain dict with its tag under
`"__tag__"`, and `!ref` expressions are resolved against the file's top-level numbers
(`<a> * <b>` style arithmetic only). Nothing named in the file is imported.
"""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path
from typing import Any

import yaml

TAG_KEY = "__tag__"


class _Ref(str):
    """An unresolved `!ref` expression such as `<chunk_size> * <token_mel_ratio>`."""


class _InertLoader(yaml.SafeLoader):
    pass


def _construct_tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    tag = node.tag
    if tag == "!ref":
        assert isinstance(node, yaml.ScalarNode)
        return _Ref(loader.construct_scalar(node))
    if isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
        return {TAG_KEY: tag, **value}
    if isinstance(node, yaml.SequenceNode):
        return {TAG_KEY: tag, "args": loader.construct_sequence(node, deep=True)}
    return {TAG_KEY: tag, "value": loader.construct_scalar(node)}


_InertLoader.add_multi_constructor("!", _construct_tagged)

_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}


def _arith(expr: str) -> float | int:
    """Evaluate + - * / // over numbers, and nothing else."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"unsupported expression {expr!r}")

    result: float | int = ev(ast.parse(expr, mode="eval"))
    return result


def _resolve(value: Any, top: dict[str, Any], depth: int = 0) -> Any:
    if depth > 20:
        raise ValueError("!ref nesting too deep")
    if isinstance(value, _Ref):
        names = re.findall(r"<([^<>]+)>", value)
        missing = [n for n in names if n not in top]
        if missing:
            raise ValueError(f"!ref {value!r}: no top-level key {missing[0]!r}")
        if len(names) == 1 and value.strip() == f"<{names[0]}>":
            return _resolve(top[names[0]], top, depth + 1)
        expr = str(value)
        for name in names:
            resolved = _resolve(top[name], top, depth + 1)
            if not isinstance(resolved, int | float):
                raise ValueError(f"!ref {value!r}: <{name}> is not a number")
            expr = expr.replace(f"<{name}>", repr(resolved))
        return _arith(expr)
    if isinstance(value, dict):
        return {k: _resolve(v, top, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, top, depth) for v in value]
    return value


def read_yaml(path: Path) -> dict[str, Any]:
    """The yaml as inert nested dicts, with `!ref`s resolved."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_InertLoader)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return {k: _resolve(v, data) for k, v in data.items()}


def params(section: Any, name: str) -> dict[str, Any]:
    """The keyword arguments of a tagged section (without the tag)."""
    if not isinstance(section, dict):
        raise ValueError(f"'{name}' is missing or not a mapping")
    return {k: v for k, v in section.items() if k != TAG_KEY}
