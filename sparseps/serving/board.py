"""``WorkerBoard``: what each process of ``sparseps serve --workers N`` serves, shared.

A small file of one fixed slot per worker (pid, served sequence, saves applied and
refused, when it last swapped models, connections it was handed and has closed),
memory-mapped by every worker and by the supervisor. A worker writes only its own slot,
after each swap and as its connections come and go; any worker reads them all to answer
``GET /model``'s ``workers`` list and ``sequence_everywhere`` (the sequence when every
worker serves the same one, else null), so a client that reaches any one process can tell
when a reload has landed in all of them. The supervisor reads the ``closed`` counts to
hand each new connection to the worker with the fewest open (:mod:`.workers`), and clears
the slot of a worker it starts again.

A slot is written field by field, and a reader may see one half-written: the board
reports, it does not synchronise (each worker's own model swap is one assignment,
:mod:`.watcher`). A slot's ``pid`` 0 is a worker not started yet.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ..core.closing import Closing

__all__ = ["SLOT", "WorkerBoard"]

_FIELDS = (
    ("pid", "<i8"),
    ("sequence", "<i8"),
    ("applied", "<i8"),
    ("refused", "<i8"),
    ("swapped_at", "<f8"),
    ("accepted", "<i8"),
    ("closed", "<i8"),
)
SLOT = np.dtype(list(_FIELDS))


class WorkerBoard(Closing):
    """The board file at ``path`` (see the module docstring).

    Args:
        path: the file; :meth:`create` makes it.
        index: this process's slot (None: a reader only).
    """

    def __init__(self, path: str | Path, index: int | None = None) -> None:
        self.path = Path(path)
        self.index = index
        self._slots = np.memmap(self.path, dtype=SLOT, mode="r+")

    @classmethod
    def create(cls, path: str | Path, workers: int) -> WorkerBoard:
        """A new board of ``workers`` empty slots."""
        Path(path).write_bytes(bytes(SLOT.itemsize * workers))
        return cls(path)

    @property
    def workers(self) -> int:
        return int(self._slots.shape[0])

    def publish(self, sequence: int, applied: int, refused: int) -> None:
        """Write this process's slot (after each model swap and at start)."""
        if self.index is None:
            return
        slot = self._slots[self.index]
        slot["sequence"], slot["applied"], slot["refused"] = sequence, applied, refused
        slot["swapped_at"] = time.time()
        slot["pid"] = os.getpid()

    def connection(self, *, opened: bool) -> None:
        """Count one connection of this process's: handed to it, or closed."""
        if self.index is not None:
            self._slots[self.index]["accepted" if opened else "closed"] += 1

    def closed(self) -> np.ndarray:
        """Every worker's count of closed connections (int64 ``[workers]``)."""
        return np.array(self._slots["closed"])

    def clear(self, index: int) -> None:
        """Empty slot ``index`` (the supervisor's, before that worker starts again)."""
        self._slots[index] = np.zeros((), SLOT)

    def read(self) -> list[dict]:
        """Every slot: ``[{"index", "pid", "sequence", "applied", "refused", "swapped_at",
        "accepted", "closed"}]``."""
        slots = np.array(self._slots)  # one copy, then read at leisure
        return [
            {"index": i, **{name: slot[name].item() for name, _ in _FIELDS}}
            for i, slot in enumerate(slots)
        ]

    def sequence_everywhere(self) -> int | None:
        """The sequence every worker serves, None while they differ (or one has not
        started)."""
        slots = self.read()
        sequences = {s["sequence"] for s in slots}
        if any(s["pid"] == 0 for s in slots) or len(sequences) != 1:
            return None
        return int(sequences.pop())

    def close(self) -> None:
        mmap = getattr(self._slots, "_mmap", None)
        del self._slots
        if mmap is not None:
            mmap.close()
