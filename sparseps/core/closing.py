"""``Closing``: ``with obj:`` for objects whose lifecycle ends with ``close()``.

STYLE.md's explicit lifecycles: an object that holds sockets, threads or files has
``close()`` and is a context manager, so a caller can scope it with ``with`` and an
exception inside the block still releases it. Classes that need more than ``close()`` at
the block's end write their own ``__exit__`` (the client, the store server, ...); the rest
take this mixin. ``tests/test_code_quality.py`` checks that every class of sparseps with
a public ``close()`` is a context manager.
"""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """Mixin: ``__enter__`` returns the object, ``__exit__`` calls its ``close()``."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
