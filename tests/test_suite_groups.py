"""The test command's grouping (tests/conftest.py) names files that exist."""

from pathlib import Path

from conftest import HEAVY_FILES


def test_every_heavy_file_exists():
    tests = Path(__file__).parent
    missing = sorted(name for name in HEAVY_FILES if not (tests / name).is_file())
    assert not missing, f"tests/conftest.py HEAVY_FILES names files that are gone: {missing}"
