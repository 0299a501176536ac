"""Size as a managed resource (STYLE.md): no module of sparseps past ``MAX_LINES`` lines.

A module that outgrows the budget holds more than one concept: split it by concept (as
``rpc/limits.py`` left ``rpc/protocol.py``), do not raise the budget. The check is shown
failing on a package written to a temp folder.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "sparseps"
MAX_LINES = 500


def oversized(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """``{path relative to root: lines}`` of every ``.py`` file under ``root`` past ``limit``."""
    sizes = {}
    for path in sorted(root.rglob("*.py")):
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > limit:
            sizes[str(path.relative_to(root))] = lines
    return sizes


def test_every_module_is_within_the_line_budget():
    over = oversized(ROOT)
    assert not over, (
        f"modules past {MAX_LINES} lines: {over}; split each by concept (one idea per module)"
    )


def test_the_budget_check_finds_a_module_past_it(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "small.py").write_text("x = 1\n" * MAX_LINES)
    (package / "sub" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(package) == {"sub/big.py": MAX_LINES + 1}
