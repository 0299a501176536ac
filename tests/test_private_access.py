"""No module reads or writes a private attribute of a class (or module) of another package.

Python cannot say statically which class an object has, so the check works on names: a
private attribute (``_name``, not a dunder) belongs to the top-level unit of sparseps
(``worker``, ``checkpoint``, ...) whose code defines it - a ``self._name = ...`` in a
method, a ``def _name`` or ``_name = ...`` in a class body or at module level. An access
``expr._name`` (read or write; ``self``/``cls`` excluded) in a module of unit U is a
violation when ``_name`` is defined in another unit and nowhere in U. The
``checkpoint -> Trainer._mode/_client/_start/_tombstones`` reach this replaced is the
example it is written for (shown failing on a temp package below).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "sparseps"


def _unit(path: Path, root: Path) -> str:
    parts = path.relative_to(root).parts
    return (
        parts[0].removesuffix(".py") if len(parts) > 1 or parts[0] != "__init__.py" else "__init__"
    )


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owners(trees: dict[Path, ast.AST], root: Path) -> dict[str, set[str]]:
    """``{private name: {units that define it}}``."""
    owners: dict[str, set[str]] = {}
    for path, tree in trees.items():
        unit = _unit(path, root)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.append(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.append(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.append(node.id)
            for name in names:
                if _private(name):
                    owners.setdefault(name, set()).add(unit)
    return owners


def violations(root: Path) -> list[str]:
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))}
    owners = _owners(trees, root)
    found = []
    for path, tree in trees.items():
        unit = _unit(path, root)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            defined_in = owners.get(node.attr, set())
            if defined_in and unit not in defined_in:
                where = f"{path.relative_to(root.parent)}:{node.lineno}"
                found.append(f"{where}: .{node.attr} belongs to {sorted(defined_in)}")
    return found


def test_no_module_touches_another_packages_privates():
    assert violations(ROOT) == []


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("def save(trainer):\n    trainer._mode.quiesce()\n", "._mode belongs to ['worker']"),
        (
            "def load(trainer, t):\n    trainer._tombstones = t\n",
            "._tombstones belongs to ['worker']",
        ),
    ],
)
def test_checker_flags_a_reach_into_another_package(tmp_path, code, expected):
    root = tmp_path / "toy"
    (root / "worker").mkdir(parents=True)
    (root / "checkpoint").mkdir()
    (root / "__init__.py").write_text("")
    (root / "worker/__init__.py").write_text("")
    (root / "worker/trainer.py").write_text(
        "class Trainer:\n    def __init__(self):\n        self._mode = None\n"
        "        self._tombstones = {}\n"
    )
    (root / "checkpoint/__init__.py").write_text("")
    (root / "checkpoint/trainer_files.py").write_text(code)
    found = violations(root)
    assert len(found) == 1 and expected in found[0], found
    # the same access inside the owning package is its own business
    (root / "checkpoint/trainer_files.py").unlink()
    (root / "worker/helper.py").write_text(code)
    assert violations(root) == []
