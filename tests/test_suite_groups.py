"""The test command's grouping (tests/conftest.py) names files that exist."""

import importlib.util
from pathlib import Path

TESTS = Path(__file__).parent


def _heavy_files() -> dict[str, int]:
    # loaded by path: "conftest" in sys.modules is whichever conftest pytest imported last
    spec = importlib.util.spec_from_file_location("_suite_conftest", TESTS / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HEAVY_FILES


def test_every_heavy_file_exists():
    missing = sorted(name for name in _heavy_files() if not (TESTS / name).is_file())
    assert not missing, f"tests/conftest.py HEAVY_FILES names files that are gone: {missing}"


def test_every_heavy_file_has_its_seconds():
    # the scheduler hands the heavy files out longest first by these numbers
    bad = {
        name: took
        for name, took in _heavy_files().items()
        if not (isinstance(took, int) and took > 0)
    }
    assert not bad, f"tests/conftest.py HEAVY_FILES: seconds must be positive whole numbers: {bad}"
