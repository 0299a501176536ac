"""InMemoryDataset: load this worker's share once, shuffle it, iterate it many times.

With ``split="steal"`` the workers take files from a shared queue while loading, so a
worker that reads slowly loads fewer files (its share of the samples is then smaller).

Storage is columnar: one :class:`~sparseps.data.schema.Batch` holding every sample
(labels, extra labels, the dense matrix, per-slot values + offsets, ids), never one
Python object per sample; every shuffle moves each sample's columns together. Iterating yields slices of it (views, no copies).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import numpy as np

from ..errors import ConfigError, DeadlineError
from .dataset import DatasetBase, rebatch
from .schema import Batch

__all__ = ["InMemoryDataset"]

log = logging.getLogger(__name__)


class InMemoryDataset(DatasetBase):
    """Samples held in memory; same constructor as :class:`~sparseps.data.QueueDataset`.

    Example::

        ds = InMemoryDataset(files, CRITEO, batch_size=512, threads=2)
        ds.preload_into_memory()          # background thread
        ...                               # other work
        ds.wait_preload_done(timeout=600)
        ds.global_shuffle(seed=7)         # exchange samples among workers (gloo)
        for batch in ds: ...
        ds.release_memory()
    """

    _journals = False
    # filled in by load_into_memory / preload_into_memory (None until then)
    _data: Batch | None = None
    _preload: threading.Thread | None = None
    _preload_error: BaseException | None = None

    def load_into_memory(self) -> None:
        """Read this worker's files into memory (replaces what was loaded)."""
        chunks = list(self._read_chunks())
        self._data = Batch.concat(chunks) if chunks else Batch.empty(self.schema)
        log.info(
            "InMemoryDataset: loaded %d samples from %d files", len(self._data), len(self.files)
        )

    def preload_into_memory(self) -> None:
        """Start :meth:`load_into_memory` in a background thread; see :meth:`wait_preload_done`."""
        if self._preload is not None and self._preload.is_alive():
            raise ConfigError("preload_into_memory: a preload is already running")
        self._preload_error = None

        def load() -> None:
            try:
                self.load_into_memory()
            except BaseException as exc:  # re-raised by wait_preload_done
                self._preload_error = exc

        self._preload = threading.Thread(target=load, name="sparseps-preload", daemon=True)
        self._preload.start()

    def wait_preload_done(self, timeout: float = 3600.0) -> None:
        """Wait for :meth:`preload_into_memory` to finish.

        Raises:
            DeadlineError: still loading after ``timeout`` seconds.
            the loader's error: if loading failed (e.g. InputError for a bad line with strict).
        """
        if self._preload is None:
            raise ConfigError("wait_preload_done: call preload_into_memory() first")
        start = time.monotonic()
        self._preload.join(timeout)
        if self._preload.is_alive():
            raise DeadlineError(
                f"preload_into_memory still running after {timeout:.0f} s "
                f"({len(self.files)} files); raise wait_preload_done(timeout=...)",
                op="preload_into_memory", seconds=time.monotonic() - start, setting="timeout",
            )  # fmt: skip
        self._preload = None
        if self._preload_error is not None:
            error, self._preload_error = self._preload_error, None
            raise error

    def _loaded(self, what: str) -> Batch:
        if self._preload is not None:
            raise ConfigError(f"{what}: a preload is running; call wait_preload_done() first")
        if self._data is None:
            raise ConfigError(f"{what}: nothing in memory; call load_into_memory() first")
        return self._data

    def local_shuffle(self, seed: int | None = None) -> None:
        """Shuffle the samples held by this worker (same seed, same order)."""
        data = self._loaded("local_shuffle")
        self._data = data.take(np.random.default_rng(seed).permutation(len(data)))

    def global_shuffle(self, seed: int | None = None, *, timeout: float = 300.0) -> None:
        """Shuffle samples across all workers, then locally.

        Each sample goes to a random worker (over ``torch.distributed``, gloo), so every
        worker ends with about ``1/world`` of every other worker's samples and the job
        keeps exactly the same samples. With no process group, or a group of one, this is
        :meth:`local_shuffle`.

        Raises:
            ConfigError: the process group's size is not the dataset's ``world``.
            DeadlineError: a peer did not exchange within ``timeout`` seconds.
        """
        from .shuffle import exchange, group_size

        data = self._loaded("global_shuffle")
        world = group_size()
        if world <= 1:
            self.local_shuffle(seed)
            return
        if world != self.options.world:
            raise ConfigError(
                f"global_shuffle: the process group has {world} workers but the dataset was "
                f"split for world={self.options.world}; build it with world={world}"
            )
        rank = self.options.rank
        rng = np.random.default_rng(None if seed is None else [seed, rank])
        destination = rng.integers(0, world, size=len(data))
        mixed = exchange(data, destination, timeout=timeout)
        self._data = mixed.take(rng.permutation(len(mixed)))

    def release_memory(self) -> None:
        """Drop the samples held in memory."""
        self._data = None

    def __len__(self) -> int:
        return 0 if self._data is None else len(self._data)

    def __iter__(self) -> Iterator[Batch]:
        data = self._loaded("iteration")
        return rebatch(iter([data]), self.options.batch_size, drop_last=self.options.drop_last)

    def __repr__(self) -> str:
        o = self.options
        return (
            f"InMemoryDataset({len(self)} samples, {len(self.files)} of {len(o.files)} files, "
            f"batch_size={o.batch_size}, rank={o.rank}/{o.world})"
        )
