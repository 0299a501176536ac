"""The import graph of sparseps follows ``sparseps.layers``: no circle, no upward import.

The graph is read from the source (``ast``), so imports inside functions count. An edge
``a -> b`` means module ``a`` imports module ``b`` (``from pkg import name`` counts as
importing ``pkg.name`` when that is a module, else ``pkg``). Two checks:

- layers: the layer of ``b`` is not above the layer of ``a`` (``WIRING`` modules are
  exempt, they start from the public front door like a user's script);
- circles: neither the module graph nor the graph between top-level units (the layer
  entries: ``config``, ``optim``, ...) has a cycle. A package's ``__init__`` importing its
  own submodules is not a cycle with them.

Both are shown failing: on synthetic graphs and on a package written to a temp folder.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

from sparseps.layers import LAYERS, WIRING

ROOT = Path(__file__).resolve().parents[1] / "sparseps"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: {imported module, ...}}`` for every module of the package at ``root``
    (a fresh copy: callers may change it)."""
    return {module: set(targets) for module, targets in _import_graph(root).items()}


# Parsing the ~340 modules is what the checks cost (1.5 s on a quiet box, several under
# load): the graph is read once per process (the source does not change during a run;
# each temp-folder test has its own root).
@functools.cache
def _import_graph(root: Path) -> dict[str, frozenset[str]]:
    package = root.name
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_init = path.name == "__init__.py"
        base = name.split(".") if is_init else name.split(".")[:-1]
        targets = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == package)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    up = base[: len(base) - (node.level - 1)]
                    module = ".".join(up + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.split(".")[0] != package:
                    continue
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    targets.add(sub if sub in files else module)
        targets.discard(name)
    return {module: frozenset(targets) for module, targets in graph.items()}


def unit_of(module: str) -> str:
    """The layer entry a module belongs to: ``sparseps.rpc.client`` -> ``rpc``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(graph, layers, wiring=frozenset()) -> list[str]:
    level = {unit: i for i, names in enumerate(layers) for unit in names}
    found = []
    for source, targets in sorted(graph.items()):
        if source in wiring:
            continue
        if unit_of(source) not in level:
            found.append(f"{source}: its unit {unit_of(source)!r} has no layer")
            continue
        for target in sorted(targets):
            if unit_of(target) not in level:
                found.append(f"{source} -> {target}: {unit_of(target)!r} has no layer")
            elif level[unit_of(target)] > level[unit_of(source)]:
                found.append(
                    f"{source} -> {target}: layer {level[unit_of(target)]} "
                    f"{layers[level[unit_of(target)]]} is above layer "
                    f"{level[unit_of(source)]} {layers[level[unit_of(source)]]}"
                )
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def _without_parent_edges(graph):
    """Drop ``pkg -> pkg.sub`` edges: an ``__init__`` re-exporting its submodules and a
    submodule importing a sibling through the package are not a circle of ideas."""
    return {
        a: {b for b in targets if not b.startswith(a + ".") and not a.startswith(b + ".")}
        for a, targets in graph.items()
    }


def unit_graph(graph, wiring=frozenset()) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for source, targets in graph.items():
        if source in wiring:
            continue
        units.setdefault(unit_of(source), set()).update(
            unit_of(t) for t in targets if unit_of(t) != unit_of(source)
        )
    # the front door re-exports every package; it is the root, not part of a circle
    units.pop("__init__", None)
    return units


def problems(root: Path, layers, wiring) -> list[str]:
    graph = import_graph(root)
    found = layer_violations(graph, layers, wiring)
    found += [f"module circle: {c}" for c in cycles(_without_parent_edges(graph))]
    found += [f"package circle: {c}" for c in cycles(unit_graph(graph, wiring))]
    return found


def test_the_tree_follows_the_declared_layers():
    assert problems(ROOT, LAYERS, WIRING) == []


def test_every_unit_of_the_tree_has_a_layer():
    units = {unit_of(m) for m in import_graph(ROOT)}
    declared = {u for names in LAYERS for u in names}
    assert units <= declared, units - declared


# -- the checker itself, on injected violations -------------------------------------------

TOY_LAYERS = (("base",), ("mid",), ("top",))


def test_checker_flags_an_upward_import_on_a_synthetic_graph():
    graph = {"p.base.a": {"p.top.x"}, "p.top.x": set()}
    assert layer_violations(graph, TOY_LAYERS) == [
        "p.base.a -> p.top.x: layer 2 ('top',) is above layer 0 ('base',)"
    ]
    assert layer_violations(graph, TOY_LAYERS, frozenset({"p.base.a"})) == []


def test_checker_flags_circles_on_a_synthetic_graph():
    graph = {"p.mid.a": {"p.mid.b"}, "p.mid.b": {"p.mid.c"}, "p.mid.c": {"p.mid.a"}}
    assert cycles(graph) == [["p.mid.a", "p.mid.b", "p.mid.c"]]
    two_units = {"p.base.a": {"p.mid.b"}, "p.mid.b": {"p.base.c"}, "p.base.c": set()}
    assert cycles(_without_parent_edges(two_units)) == []  # modules: no circle ...
    assert cycles(unit_graph(two_units)) == [["base", "mid"]]  # ... packages: a circle


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (  # a lazy import of a higher layer, inside a function
            {
                "base/__init__.py": "",
                "base/a.py": "def f():\n    from ..top import x\n",
                "top/__init__.py": "",
                "top/x.py": "",
            },
            "toy.base.a -> toy.top.x: layer 2",
        ),
        (  # config <-> optim: each in its own layer, one of them imports upward
            {
                "base/__init__.py": "",
                "base/v.py": "from ..mid import r\n",
                "mid/__init__.py": "",
                "mid/r.py": "from ..base import v\n",
            },
            "toy.base.v -> toy.mid.r: layer 1",
        ),
        (  # a circle inside one layer
            {
                "mid/__init__.py": "",
                "mid/a.py": "from . import b\n",
                "mid/b.py": "import toy.mid.a\n",
            },
            "module circle: ['toy.mid.a', 'toy.mid.b']",
        ),
    ],  # fmt: skip
)
def test_checker_flags_a_violation_written_into_a_temp_package(tmp_path, files, expected):
    root = _write(tmp_path / "toy", {"__init__.py": "", **files})
    found = problems(root, TOY_LAYERS, frozenset())
    assert any(expected in line for line in found), found
