"""A server's table with its reader-writer lock, and how two table specs differ."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["RWLock", "TableEntry", "config_differences"]


class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers (no starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextmanager
    def read(self):
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self):
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


T = TypeVar("T")


@dataclass
class TableEntry(Generic[T]):
    """A table with its lock (sparse: ``TableEntry[SparseTable]``; dense:
    ``TableEntry[DenseTable]`` with its spec)."""

    table: T
    spec: dict = field(default_factory=dict)
    lock: RWLock = field(default_factory=RWLock)


def config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``field: existing=X requested=Y`` for every leaf that differs between two dicts."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(config_differences(a, b, prefix=f"{name}."))
        elif a != b:
            out.append(f"{name}: existing={a!r} requested={b!r}")
    return out
