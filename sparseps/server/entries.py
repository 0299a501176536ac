"""A server's tables of one kind by name (:class:`Tables`), each with its reader-writer
lock (:class:`TableEntry`), and how two table specs differ."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from ..errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from ..rpc.protocol import Request

__all__ = ["Answer", "RWLock", "TableEntry", "Tables", "config_differences"]

# What an op's handler answers: the reply's result (msgpack-able) and its buffers.
Answer = tuple[object, "list[np.ndarray]"]


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


class Tables(Generic[T]):
    """This server's tables of one kind (sparse or dense) by name, each with its lock.

    Tables are only ever added (a load replaces a table's contents, not its entry), so a
    looked-up entry stays valid; :meth:`items` is a snapshot a caller may iterate while
    another thread creates a table.

    Args:
        rank: the server's rank (for errors).
        kind: what the tables are, for errors: ``"sparse table"``, ``"dense table"``.
        listed_as: how an error lists the existing ones: ``"tables"``, ``"dense tables"``.
        created_by: the client call that creates one, for errors.
    """

    def __init__(self, rank: int, kind: str, *, listed_as: str, created_by: str) -> None:
        self.rank = rank
        self.kind = kind
        self._listed_as = listed_as
        self._created_by = created_by
        self._entries: dict[str, TableEntry[T]] = {}
        # held from a create's look-up to its add: two creates of one name make one table
        self.creating = threading.Lock()

    def entry(self, request: Request) -> TableEntry[T]:
        """The entry of the request's table.

        Raises:
            InputError: no such table on this server.
        """
        entry = self._entries.get(str(request.table))  # the op's schema requires a table
        if entry is None:
            raise InputError(
                f"server {self.rank}: {self.kind} {request.table!r} does not exist "
                f"({self._listed_as}: {sorted(self._entries) or 'none'}); create it with "
                f"{self._created_by} first"
            )
        return entry

    def get(self, name: str) -> TableEntry[T] | None:
        return self._entries.get(name)

    def __getitem__(self, name: str) -> TableEntry[T]:
        return self._entries[name]

    def add(self, name: str, entry: TableEntry[T]) -> None:
        """Add a table (the caller holds :attr:`creating` and found none of this name)."""
        self._entries[name] = entry

    def items(self) -> list[tuple[str, TableEntry[T]]]:
        return list(self._entries.items())

    def names(self) -> list[str]:
        return list(self._entries)


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
