"""Rules of STYLE.md checked on the source of sparseps:

- boolean arguments of public functions and methods are keyword-only: ``f(x, True)``
  says nothing at the call site, ``f(x, strict=True)`` does;
- a public class's constructor takes at most ``MAX_POSITIONAL`` positional arguments
  (besides ``self``), the limit torchrec's code-quality test puts on its modules'
  constructors: more knobs go after ``*`` or into a config object;
- a public class with a ``close()`` is a context manager (explicit lifecycles): it
  defines ``__enter__`` or inherits it from a class of sparseps that does (often
  :class:`sparseps.core.closing.Closing`). Protocol classes only describe one.

Public means the function, method or class and every class around it have names without
a leading underscore (``__init__`` counts as public). Dataclasses are config objects
themselves: their generated constructors are not checked. The checks read the source
(``ast``), so nothing is imported; both are shown failing on a module written to a temp
folder.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "sparseps"
MAX_POSITIONAL = 5


def _positional(
    node: ast.FunctionDef | ast.AsyncFunctionDef,
) -> list[tuple[ast.arg, ast.expr | None]]:
    """``(parameter, default)`` of every parameter that can be passed by position."""
    args = node.args
    params = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(params) - len(args.defaults))
    return list(zip(params, [*defaults, *args.defaults], strict=True))


def _is_bool(param: ast.arg, default: ast.expr | None) -> bool:
    if isinstance(default, ast.Constant) and isinstance(default.value, bool):
        return True
    return isinstance(param.annotation, ast.Name) and param.annotation.id == "bool"


# Parsing the package's ~340 modules is most of what these checks cost (1.5 s a pass on
# a quiet box, several under load), and every check used to parse it again: the trees
# and their nodes are read once per process and shared. Nothing mutates them, and the
# source does not change during a run (the temp-folder tests each have their own root).
@functools.cache
def _parsed(root: Path) -> tuple[tuple[str, ast.Module, tuple[ast.AST, ...]], ...]:
    """``(path relative to root, syntax tree, every node of it)`` of every module under
    ``root``, in path order."""
    parsed = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        parsed.append((str(path.relative_to(root)), tree, tuple(ast.walk(tree))))
    return tuple(parsed)


def _trees(root: Path) -> list[tuple[str, ast.Module]]:
    """``(path relative to root, syntax tree)`` of every module under ``root``."""
    return [(path, tree) for path, tree, _ in _parsed(root)]


def _nodes(root: Path) -> list[tuple[str, tuple[ast.AST, ...]]]:
    """``(path relative to root, every node of its tree)``: ``ast.walk`` done once."""
    return [(path, nodes) for path, _, nodes in _parsed(root)]


def violations(root: Path) -> list[str]:
    """``path:line what`` for every positional boolean argument of a public function and
    every public constructor with more than ``MAX_POSITIONAL`` positional arguments."""
    found: list[str] = []

    def visit(node: ast.AST, path: str, owner: str, public: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, path, child.name, public and not child.name.startswith("_"))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{owner}.{child.name}" if owner else child.name
                if not public or (child.name.startswith("_") and child.name != "__init__"):
                    continue
                params = _positional(child)
                if owner and params and params[0][0].arg in ("self", "cls"):
                    params = params[1:]
                for param, default in params:
                    if _is_bool(param, default):
                        found.append(f"{path}:{child.lineno} {name}: boolean {param.arg!r} "
                                     "can be passed by position (put it after '*')")  # fmt: skip
                if child.name == "__init__" and len(params) > MAX_POSITIONAL:
                    found.append(f"{path}:{child.lineno} {name}: {len(params)} positional "
                                 f"arguments (at most {MAX_POSITIONAL}; the rest after '*')")  # fmt: skip

    for path, tree in _trees(root):
        visit(tree, path, "", True)
    return found


def _classes(root: Path) -> dict[str, tuple[str, ast.ClassDef]]:
    """Every class of the package by name: ``{name: (path, node)}`` (names are unique
    enough for the check; a clash keeps the first)."""
    found: dict[str, tuple[str, ast.ClassDef]] = {}
    for path, nodes in _nodes(root):
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, (path, node))
    return found


def _methods(node: ast.ClassDef) -> set[str]:
    return {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _base_names(node: ast.ClassDef) -> list[str]:
    """Simple names of the bases (``pkg.Base`` -> ``Base``; ``Generic[T]`` -> ``Generic``)."""
    names = []
    for base in node.bases:
        while isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(base, ast.Attribute):
            names.append(base.attr)
        elif isinstance(base, ast.Name):
            names.append(base.id)
    return names


def unmanaged(root: Path) -> list[str]:
    """``path:line Class`` of every public class with a ``close()`` and no ``__enter__``
    of its own or of a base class defined in the package."""
    classes = _classes(root)

    def enters(name: str, seen: frozenset = frozenset()) -> bool:
        if name not in classes or name in seen:
            return False
        node = classes[name][1]
        return "__enter__" in _methods(node) or any(
            enters(base, seen | {name}) for base in _base_names(node)
        )

    return [
        f"{path}:{node.lineno} {name}"
        for name, (path, node) in classes.items()
        if not name.startswith("_")
        and "close" in _methods(node)
        and "Protocol" not in _base_names(node)
        and not enters(name)
    ]


def test_public_booleans_are_keyword_only_and_constructors_take_few_positionals():
    found = violations(ROOT)
    assert not found, "\n".join(found)


def test_classes_with_close_are_context_managers():
    found = unmanaged(ROOT)
    assert not found, (
        "classes with close() but no __enter__ (add sparseps.core.closing.Closing as the "
        "last base, or write __enter__/__exit__):\n" + "\n".join(found)
    )


def test_the_checks_find_what_they_are_for(tmp_path):
    (tmp_path / "mod.py").write_text(
        "def ok(x, *, strict=False): ...\n"
        "def bad(x, strict=False): ...\n"
        "def bad_required(x, flag: bool): ...\n"
        "def _private(x, strict=False): ...\n"
        "class Public:\n"
        "    def __init__(self, a, b, c, d, e, *, f=1, g=True): ...\n"
        "    def method(self, dry_run=True): ...\n"
        "    @classmethod\n"
        "    def make(cls, a, *, fast=True): ...\n"
        "class Wide:\n"
        "    def __init__(self, a, b, c, d, e, f): ...\n"
        "class _Hidden:\n"
        "    def __init__(self, a, b, c, d, e, f, g=False): ...\n"
    )
    found = violations(tmp_path)
    assert [line.split(" ", 2)[1] for line in found] == [
        "bad:", "bad_required:", "Public.method:", "Wide.__init__:",
    ]  # fmt: skip
    assert found[0].startswith("mod.py:2 ")


def test_the_context_manager_check_follows_bases(tmp_path):
    (tmp_path / "base.py").write_text(
        "class Closing:\n"
        "    def close(self): ...\n"
        "    def __enter__(self): return self\n"
        "    def __exit__(self, *exc): self.close()\n"
    )
    (tmp_path / "mod.py").write_text(
        "import typing\n"
        "from base import Closing\n"
        "class Managed(Closing):\n"
        "    def close(self): ...\n"
        "class Child(Managed):\n"
        "    def close(self): ...\n"
        "class Bare:\n"
        "    def close(self): ...\n"
        "class Described(typing.Protocol):\n"
        "    def close(self): ...\n"
        "class _Private:\n"
        "    def close(self): ...\n"
    )
    assert unmanaged(tmp_path) == ["mod.py:7 Bare"]


# -- classes composed, not cut into mixins (STYLE.md, round two) ------------------------

# The packages whose classes hold their parts (issue 53); Closing is the one mixin kept.
COMPOSED_PACKAGES = ("server", "table")
ALLOWED_MIXINS = frozenset({"Closing"})


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _own_names(nodes: tuple[ast.AST, ...], root: Path) -> set[str]:
    """Names a module (given by every node of its tree) binds to something of the package
    at ``root``: classes it defines and names it imports relatively, or absolutely from
    the package or a module of it."""
    own_modules = {root.name, *(path.stem for path in root.iterdir())}
    names = {n.name for n in nodes if isinstance(n, ast.ClassDef)}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").split(".")[0] in own_modules
        ):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def mixed_classes(root: Path, packages: tuple[str, ...] = COMPOSED_PACKAGES) -> list[str]:
    """``path:line Class: bases`` of every class in ``packages`` with more than one base
    class of the package itself, protocols and :data:`ALLOWED_MIXINS` aside."""
    classes = _classes(root)
    found = []
    for path, nodes in _nodes(root):
        if path.split("/")[0] not in packages:
            continue
        own = _own_names(nodes, root)
        for node in nodes:
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [
                name for name in _base_names(node)
                if name in own and name not in ALLOWED_MIXINS
                and "Protocol" not in _base_names(classes.get(name, ("", node))[1])
            ]  # fmt: skip
            if len(bases) > 1:
                found.append(f"{path}:{node.lineno} {node.name}: {', '.join(bases)}")
    return found


def type_checking_declarations(
    root: Path, packages: tuple[str, ...] = COMPOSED_PACKAGES
) -> list[str]:
    """``path:line`` of every ``if TYPE_CHECKING:`` block in ``packages`` that declares
    attributes or methods: inside a class (what the class it is mixed into provides), or
    at module level anything but imports."""
    found = []
    for path, nodes in _nodes(root):
        if path.split("/")[0] not in packages:
            continue
        for node in nodes:
            if not isinstance(node, ast.Module | ast.ClassDef):
                continue  # a block inside a function declares nothing of a class
            for child in node.body:
                if not isinstance(child, ast.If) or not _is_type_checking(child.test):
                    continue
                declared = [
                    stmt for stmt in child.body
                    if not isinstance(stmt, ast.Import | ast.ImportFrom)
                ]  # fmt: skip
                if isinstance(node, ast.ClassDef):
                    found.append(f"{path}:{child.lineno} (class {node.name})")
                elif declared:
                    found.append(f"{path}:{child.lineno} (module)")
    return found


def test_server_and_table_classes_are_composed():
    mixed = mixed_classes(ROOT)
    assert not mixed, (
        "classes cut into mixins (hold the parts as attributes instead; split by concept, "
        "never by line count):\n" + "\n".join(mixed)
    )
    declared = type_checking_declarations(ROOT)
    assert not declared, (
        "if TYPE_CHECKING: blocks declaring another class's attributes (give the state a "
        "name and methods, and hold it):\n" + "\n".join(declared)
    )


def test_the_composition_checks_find_mixins_and_declared_state(tmp_path):
    (tmp_path / "base.py").write_text(
        "import typing\n"
        "class Closing: ...\n"
        "class Readable(typing.Protocol): ...\n"
    )  # fmt: skip
    package = tmp_path / "server"
    package.mkdir()
    (package / "parts.py").write_text(
        "from typing import TYPE_CHECKING, Generic, TypeVar\n"
        "from base import Closing, Readable\n"
        "if TYPE_CHECKING:\n"
        "    import numpy\n"
        "T = TypeVar('T')\n"
        "class Files:\n"
        "    if TYPE_CHECKING:\n"
        "        rank: int\n"
        "class Rows: ...\n"
        "class Mixed(Files, Rows, Closing): ...\n"
        "class Composed(Generic[T], Readable, Closing):\n"
        "    def __init__(self):\n"
        "        self.files = Files()\n"
        "class Child(Rows, Readable, Closing): ...\n"
    )
    (package / "declared.py").write_text(
        "import typing\n"
        "if typing.TYPE_CHECKING:\n"
        "    def helper(self) -> int: ...\n"
    )  # fmt: skip
    assert mixed_classes(tmp_path) == ["server/parts.py:10 Mixed: Files, Rows"]
    assert type_checking_declarations(tmp_path) == [
        "server/declared.py:2 (module)",
        "server/parts.py:7 (class Files)",
    ]


# The packages checked like server and table (issue 53): rpc and elastic (the client), and
# every other one. PENDING_PACKAGES is for a package added before it is recomposed: none is.
COMPOSED_CLIENT_PACKAGES = ("rpc", "elastic")
PENDING_PACKAGES: frozenset[str] = frozenset()


def _other_packages() -> tuple[str, ...]:
    units = {path.split("/")[0].removesuffix(".py") for path, _ in _trees(ROOT)}
    return tuple(sorted(units - {*COMPOSED_PACKAGES, *COMPOSED_CLIENT_PACKAGES, *PENDING_PACKAGES}))


def test_every_other_package_is_composed():
    mixed = mixed_classes(ROOT, _other_packages())
    assert not mixed, "classes cut into mixins (hold the parts instead):\n" + "\n".join(mixed)
    declared = type_checking_declarations(ROOT, _other_packages())
    assert not declared, (
        "if TYPE_CHECKING: blocks declaring another class's attributes:\n" + "\n".join(declared)
    )


def test_rpc_and_elastic_classes_are_composed():
    mixed = mixed_classes(ROOT, COMPOSED_CLIENT_PACKAGES)
    assert not mixed, (
        "classes cut into mixins (hold the parts as attributes instead; split by concept, "
        "never by line count):\n" + "\n".join(mixed)
    )
    declared = type_checking_declarations(ROOT, COMPOSED_CLIENT_PACKAGES)
    assert not declared, (
        "if TYPE_CHECKING: blocks declaring another class's attributes (give the state a "
        "name and methods, and hold it):\n" + "\n".join(declared)
    )
