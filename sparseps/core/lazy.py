"""Package names loaded on first use (PEP 562): a package's ``__init__`` lists where each
of its public names lives, and importing the package loads none of those modules.

Why: a light caller of a package (the launcher importing ``sparseps.rpc.transport``,
``sparseps serve --help``) must not pay for its heavy modules (numba kernels, torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from submodule
    ``where[name]`` of the package, imported when the name is first asked for."""

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
