"""A server's table with its reader-writer lock, and how two table specs differ."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["RWLock", "TableEntry", "config_differences"]


class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers (no starvation).

    ``with lock.read():`` / ``with lock.write():``; the context managers are plain
    objects made once per lock, not generators: every pull and push takes one.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0
        self._reading = _Held(self._enter_read, self._exit_read)
        self._writing = _Held(self._enter_write, self._exit_write)

    def read(self) -> _Held:
        return self._reading

    def write(self) -> _Held:
        return self._writing

    def _enter_read(self) -> None:
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1

    def _exit_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def _enter_write(self) -> None:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True

    def _exit_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


class _Held:
    """A reusable context manager calling ``enter`` and ``exit`` (it keeps no state of
    its own, so one instance serves every thread)."""

    __slots__ = ("_on_enter", "_on_exit")

    def __init__(self, enter: Callable[[], None], exit: Callable[[], None]) -> None:
        self._on_enter, self._on_exit = enter, exit

    def __enter__(self) -> None:
        self._on_enter()

    def __exit__(self, *exc_info: object) -> None:
        self._on_exit()


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
