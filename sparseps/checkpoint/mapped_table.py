"""``MappedTable``: a base's rows served from its memory-mapped Arrow files.

An inference base holds, per table, Arrow IPC files of ``key`` and ``embedding`` columns
(uncompressed, one record batch: :mod:`sparseps.files.shards`), one per server, in the
order the server kept them. A ``MappedTable`` reads them without copying: each column is a
read-only numpy view of the file's memory map, so the rows live in the page cache, not on
the process heap. Hot rows stay resident, cold ones are read from disk when asked for,
and a model larger than memory is served; N processes that map the same files share one
copy of their pages.

Lookups need the keys sorted; the files are not. A :class:`RowIndex` holds the keys in
order and, for each, the row's place in the files (``where``: its position in the files'
rows laid end to end). It is built once per base and table (a sort of the keys: 16
bytes a row while it runs) and, given a folder (``index_dir``), kept there as two ``.npy``
files that every process maps instead of building its own: the first process builds them
under a file lock, the others wait for it and map the result. Index files of saves that
no longer exist are removed when a new one is written.

Deltas are small next to their base and stay in memory: ``overlay`` (an
:class:`~sparseps.checkpoint.predictor.EmbeddingTable` of the rows deltas set) and
``deleted`` (sorted keys deltas deleted, which the base still holds). A lookup takes a key
from the overlay, else, unless deleted, from the base, else the training fallback. Like
``EmbeddingTable`` it is immutable: :meth:`upsert` and :meth:`delete` return new tables
that share the base's maps.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import xxhash

from ..config import TableConfig
from ..table.split_rows import missing_rows
from .embedding_table import EmbeddingTable

__all__ = ["MappedTable", "RowIndex"]

log = logging.getLogger(__name__)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class RowIndex:
    """Sorted keys and, for each, its row's place in the files laid end to end."""

    keys: np.ndarray  # uint64 [n], sorted, unique
    where: np.ndarray  # int64 [n]
    files: tuple[Path, ...] = ()  # the index's own files, when mapped

    @classmethod
    def build(cls, keys: Sequence[np.ndarray]) -> RowIndex:
        """The index of the files' ``keys`` columns, in memory. Of a key held twice, the
        later file's row (as a base loaded file after file kept it)."""
        every = np.concatenate(keys) if len(keys) != 1 else keys[0]
        order = np.argsort(every, kind="stable")
        ordered = every[order]
        # the last of each run of equal keys
        last = np.ones(ordered.size, bool)
        last[:-1] = ordered[1:] != ordered[:-1]
        if not last.all():
            ordered, order = ordered[last], order[last]
        return cls(_frozen(ordered), _frozen(order.astype(np.int64, copy=False)))

    @classmethod
    def shared(cls, keys: Sequence[np.ndarray], index_dir: Path, name: str) -> RowIndex:
        """The index kept as ``index_dir/name.{keys,where}.npy``, built by the first
        process that needs it (a file lock; the lock file stays, as removing it could let
        a third process lock a new file while the second holds the old) and
        memory-mapped by every one."""
        paths = (index_dir / f"{name}.keys.npy", index_dir / f"{name}.where.npy")
        if not all(p.is_file() for p in paths):
            index_dir.mkdir(parents=True, exist_ok=True)
            with open(index_dir / f"{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not all(p.is_file() for p in paths):
                    built = cls.build(keys)
                    for path, array in zip(paths, (built.keys, built.where), strict=True):
                        temporary = path.with_name(f".{path.name}.{os.getpid()}")
                        with open(temporary, "wb") as out:
                            np.save(out, array)
                        os.replace(temporary, path)
                    del built
        mapped = [np.load(p, mmap_mode="r") for p in paths]
        return cls(mapped[0], mapped[1], paths)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.where.nbytes)


def index_name(folder: Path, table: str, records: dict[str, object]) -> str:
    """The index files' stem of one base table: the save folder, the table and a digest of
    its files' records (a save written again under the same name gets a new index)."""
    digest = xxhash.xxh3_64(repr(sorted(records.items())).encode()).hexdigest()
    return f"{folder.name}.{table}.{digest}"


def remove_stale_indexes(index_dir: Path, directory: Path) -> None:
    """Index files of save folders ``directory`` no longer holds (a process that still
    maps one keeps its pages until it lets go)."""
    if not index_dir.is_dir():
        return
    for path in index_dir.glob("*.*"):  # .npy files and their .lock (kept: see shared)
        if not (directory / path.name.split(".", 1)[0]).is_dir():
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class MappedTable:
    """One table of an inference chain: a mapped base plus the deltas after it (see the
    module docstring). Same interface as ``EmbeddingTable``."""

    config: TableConfig
    parts: tuple[np.ndarray, ...]  # float32 [n_i, pull_dim] per file, read-only maps
    starts: np.ndarray  # int64 [files + 1]: where each file's rows start end to end
    index: RowIndex
    overlay: EmbeddingTable  # rows set by deltas
    deleted: np.ndarray  # uint64, sorted: keys deltas deleted from the base
    files: tuple[Path, ...]  # the base's row files

    @classmethod
    def of_files(
        cls,
        config: TableConfig,
        files: Sequence[Path],
        columns: Sequence[dict[str, np.ndarray]],
        index: RowIndex | None,
    ) -> MappedTable:
        """A table over a base's files and their mapped ``columns`` (``key``,
        ``embedding``); ``index``: a shared one, or None to build it in memory."""
        parts = tuple(c["embedding"].reshape(-1, config.pull_dim) for c in columns)
        sizes = [p.shape[0] for p in parts]
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        if index is None:
            index = RowIndex.build([c["key"] for c in columns])
        return cls(
            config,
            parts,
            _frozen(starts),
            index,
            EmbeddingTable.empty(config),
            _frozen(np.empty(0, np.uint64)),
            tuple(files),
        )

    def upsert(self, keys: np.ndarray, rows: np.ndarray) -> MappedTable:
        keys = np.asarray(keys, np.uint64)
        deleted = self.deleted[~np.isin(self.deleted, keys)] if self.deleted.size else self.deleted
        return replace(self, overlay=self.overlay.upsert(keys, rows), deleted=_frozen(deleted))

    def delete(self, keys: np.ndarray) -> MappedTable:
        keys = np.asarray(keys, np.uint64)
        deleted = _frozen(np.union1d(self.deleted, keys).astype(np.uint64))
        return replace(self, overlay=self.overlay.delete(keys), deleted=deleted)

    def _base_rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(hit, rows)``: which of ``keys`` the base holds, and their rows."""
        position, hit = self._find(keys)
        if not hit.any():
            return hit, np.zeros((0, self.config.pull_dim), np.float32)
        where = np.asarray(self.index.where[position[hit]])
        if len(self.parts) == 1:
            return hit, self.parts[0][where]
        rows = np.empty((where.size, self.config.pull_dim), np.float32)
        part = np.searchsorted(self.starts, where, side="right") - 1
        for p in np.unique(part).tolist():  # one gather per file, not per key
            mine = part == p
            rows[mine] = self.parts[p][where[mine] - self.starts[p]]
        return hit, rows

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys`` (any order); unknown keys get the training fallback."""
        keys = np.asarray(keys, np.uint64)
        out = np.zeros((keys.size, self.config.pull_dim), np.float32)
        found = np.zeros(keys.size, bool)
        if self.overlay.keys.size:
            position = np.minimum(
                np.searchsorted(self.overlay.keys, keys), self.overlay.keys.size - 1
            )
            found = self.overlay.keys[position] == keys
            out[found] = self.overlay.rows[position[found]]
        rest = ~found
        if self.deleted.size:
            rest &= ~np.isin(keys, self.deleted)
        asked = np.flatnonzero(rest)
        hit, rows = self._base_rows(keys[asked])
        out[asked[hit]] = rows
        found[asked[hit]] = True
        missing = ~found
        if missing.any():  # what a pull of a key that is not a row gives in training
            out[missing] = missing_rows(self.config, keys[missing])
        return out

    @property
    def row_count(self) -> int:
        """How many keys it serves (``keys.size``), without building the key set (which
        sorts every base key again: seconds and ~60 bytes a row at millions of rows): the
        base's keys less the deleted ones it holds, plus the deltas' keys it does not."""
        deleted_in_base = self._find(self.deleted)[1]
        overlay_in_base = self._find(self.overlay.keys)[1]
        base = int(self.index.keys.size) - int(np.count_nonzero(deleted_in_base))
        return base + int(np.count_nonzero(~overlay_in_base))

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(position, hit)``: each key's place in the base's sorted index, and whether
        the index holds it there."""
        index = self.index.keys
        if index.size == 0 or keys.size == 0:
            return np.zeros(keys.size, np.int64), np.zeros(keys.size, bool)
        position = np.minimum(np.searchsorted(index, keys), index.size - 1)
        return position, np.asarray(index[position] == keys)

    @property
    def keys(self) -> np.ndarray:
        """Every key served, sorted (built on demand: the base's keys are not kept
        apart from the index; :attr:`row_count` counts them without building them)."""
        base = np.asarray(self.index.keys)
        if self.deleted.size:
            base = base[~np.isin(base, self.deleted)]
        return _frozen(np.union1d(base, self.overlay.keys).astype(np.uint64))

    @property
    def nbytes(self) -> int:
        """Bytes of the rows and keys served: the base's files' columns, the index and the
        deltas' rows."""
        base = sum(int(p.nbytes) for p in self.parts) + 8 * int(self.starts[-1])  # + keys
        return base + self.index.nbytes + self.overlay.nbytes + int(self.deleted.nbytes)

    @property
    def mapped_files(self) -> tuple[Path, ...]:
        """The files this table maps (its rows' and its shared index's)."""
        return (*self.files, *self.index.files)
