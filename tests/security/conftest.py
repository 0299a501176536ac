import pytest


@pytest.fixture(autouse=True)
def _no_inherited_security(monkeypatch):
    """PSClient reads SPARSEPS_SECURE/SPARSEPS_KEY_DIR by default: tests choose explicitly."""
    monkeypatch.delenv("SPARSEPS_SECURE", raising=False)
    monkeypatch.delenv("SPARSEPS_KEY_DIR", raising=False)
