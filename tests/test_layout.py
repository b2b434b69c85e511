"""The package's layout: no import cycles between voiceagent's modules, and no module over
500 lines unless its docstring says why.

The import graph is read statically with `ast`: every `import` / `from ... import` in a
module counts, wherever it stands (inside a function, under `if TYPE_CHECKING:`);
relative imports are resolved; importing a package counts as importing its __init__.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "voiceagent"
MAX_LINES = 500


def module_names() -> dict[str, Path]:
    """Dotted name -> file, for every module and package of voiceagent/."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The voiceagent modules that module `name` (file `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        # `import a.b.c` names module a.b.c; fall back to the longest enclosing module
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "voiceagent":
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "voiceagent":
                continue
            for alias in node.names:
                # `from pkg import sub` imports the module pkg.sub; `from m import x`, m
                sub = f"{source}.{alias.name}"
                add(sub if sub in modules else source)
    return found


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    modules = set(names)
    return {name: imports_of(name, path, modules) for name, path in names.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles (a -> b -> ... -> a) that together pass through every module of every
    strongly connected component of more than one module (Tarjan's algorithm, then
    shortest paths inside each component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    found = []
    for component in components:
        covered: set[str] = set()
        for start in sorted(component):
            if start not in covered:
                cycle = shortest_cycle(graph, component, start)
                covered.update(cycle)
                found.append(cycle)
    return sorted(found)


def shortest_cycle(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    """Breadth-first inside a strongly connected component: the shortest way back."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"{start} is not on a cycle of its component")


def test_the_graph_reader_sees_every_kind_of_import():
    graph = import_graph()
    # a lazy import inside a function, and a relative import two levels up
    assert "voiceagent.bench" in graph["voiceagent.cli"]
    assert "voiceagent.model.contract" in graph["voiceagent.engine.sglang.export"]
    # `from . import chunks` inside a function names the module, not the package
    assert "voiceagent.bench.chunks" in graph["voiceagent.bench"]
    # a made-up cycle is found and printed as a path
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_module_over_500_lines_without_a_reason():
    too_long = []
    for name, path in module_names().items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not any(line.strip().startswith("Over 500 lines:") for line in doc.splitlines()):
            too_long.append(f"{name}: {lines} lines")
    assert not too_long, (
        "modules over 500 lines whose docstring has no 'Over 500 lines: <why>' line:\n"
        + "\n".join(too_long)
    )
