"""The test command's grouping (tests/conftest.py) names files that exist."""

import importlib.util
from pathlib import Path

TESTS = Path(__file__).parent


def _heavy_files() -> frozenset[str]:
    # loaded by path: "conftest" in sys.modules is whichever conftest pytest imported last
    spec = importlib.util.spec_from_file_location("_suite_conftest", TESTS / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HEAVY_FILES


def test_every_heavy_file_exists():
    missing = sorted(name for name in _heavy_files() if not (TESTS / name).is_file())
    assert not missing, f"tests/conftest.py HEAVY_FILES names files that are gone: {missing}"
