"""``TableStats``: a frozen snapshot of a sparse table's size (``SparseTable.stats()``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TableStats"]


@dataclass(frozen=True)
class TableStats:
    """A snapshot of a table's size.

    Attributes:
        name: table name.
        rows: live (admitted) rows.
        pending: keys seen but not admitted yet.
        capacity: rows the storage matrix (tiered: the disk file) holds before it grows.
        bytes_used: bytes of memory held by storage, hash indexes and pending counters
            (tiered: the row cache and its maps, not the disk file).
        dim: embedding width.
        memory_rows: live rows held in memory (all of them unless tiered).
        disk_rows: live rows held only on disk (tiered tables).
        disk_bytes: bytes of the disk tier's file.
        disk_reads: rows read from disk into memory so far (promotions; tiered tables).
        disk_writes: changed rows written back to disk so far (evictions and flushes).
        prefetched: rows promoted by prefetches so far (counted in ``disk_reads`` too).
        prefetch_stale: rows a prefetch read but dropped because they changed meanwhile.
        embedx_rows: live rows with an embedx part (every row, unless the table is split:
            :class:`~sparseps.config.Accessor`).
    """

    name: str
    rows: int
    pending: int
    capacity: int
    bytes_used: int
    dim: int
    memory_rows: int = 0
    disk_rows: int = 0
    disk_bytes: int = 0
    disk_reads: int = 0
    disk_writes: int = 0
    prefetched: int = 0
    prefetch_stale: int = 0
    embedx_rows: int = 0
