"""A GPUPS pass over the device budget, trained as sub-passes; the budget check itself.

``GpuPS(memory_bytes=...)`` bounds the bytes one worker's shard of a pass takes on its
device (:func:`~.gpups_table.bytes_per_key` a key). A pass whose shard is larger is not
refused: :class:`SubPasses` cuts its global steps (sync lock-step: step ``s`` is every
worker's ``s``-th batch) into runs that fit. Each run is a sub-pass: built from the keys
of its steps, trained, written back before the next one is built. The next run is the
longest that fits, found by halving what is left (every worker halves alike: the check
is one collective), so a pass of ``S`` steps is cut into few runs and its keys read
``O(log S)`` times a run. A single step is built whatever its size (it cannot be cut).

The sub-passes give the rows sync mode gives: each step reads the rows every earlier step
left (the same device table within a run, the servers' written rows across runs). The
cut is logged (``GPUPS pass N: over ... sub-pass K trains steps a..b of S``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import numpy as np

from ..core import collectives
from .gpups_build import pass_keys
from .gpups_table import bytes_per_key

__all__ = ["SubPasses", "check_budget"]


def check_budget(owned: dict, configs: dict, budget: int | None, rank: int, world: int, *,
                 early: bool, timeout: float) -> tuple[bool, bool]:  # fmt: skip
    """``(fits, anyone_early)``: whether every worker's shard ``owned`` (``{table: keys}``)
    fits ``budget`` bytes, and whether any worker has early rows to send (one collective
    agrees on both)."""
    mine = np.zeros((world, 2), np.int64)
    mine[rank] = (
        sum(k.size * bytes_per_key(configs[n]) for n, k in owned.items()),
        int(early),
    )
    every = collectives.all_reduce_sum(mine, timeout=timeout)
    fits = budget is None or int(every[:, 0].max()) <= budget
    return fits, bool(every[:, 1].any())


class SubPasses:
    """The runs of steps a pass over the budget trains as sub-passes (module docstring).

    Args:
        dataset: the pass's data (read again for each run's keys).
        lookups: the trainer's per-batch dedup.
        tables: the table names, sorted.
        index: the pass number (for the log).
        total: the pass's global steps.
    """

    def __init__(self, dataset: Iterable, lookups: Callable, tables: list[str], index: int,
                 total: int) -> None:  # fmt: skip
        self.dataset, self.lookups, self.tables = dataset, lookups, tables
        self.index, self.total = index, total
        self.start, self.stop = 0, total  # the run being tried or trained
        self.built = 0  # sub-passes built so far

    @property
    def single(self) -> bool:
        return self.stop - self.start <= 1

    def keys(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """This worker's unique keys of steps ``start .. stop - 1`` (``pass_keys``)."""
        batches = itertools.islice(iter(self.dataset), start, stop)
        return pass_keys(batches, self.lookups, self.tables)

    def halve(self) -> None:
        self.stop = self.start + max(1, (self.stop - self.start) // 2)

    def advance(self) -> None:
        """The run trained: the next starts where it stopped and tries the rest."""
        self.start, self.stop = self.stop, self.total
