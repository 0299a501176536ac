"""Export, import and restore of a sparse table's rows (the columns of ``columns.py``).

Two ways in, on purpose:

- **merge** (``import_rows`` / ``import_pending``): upsert columns into the live table.
  Used to assemble a table from several parts (the shard files of a save made on another
  number of servers) and by geo mode's local tables.
- **restore** (:meth:`SparseTable.restore <sparseps.table.SparseTable.restore>`, or
  ``empty_like`` + imports + ``adopt``, which move one storage's contents into another
  at once, :meth:`~sparseps.table.storage.TableStorage.take`): make the table
  *exactly* the given columns. Rows, pending keys and counters created after the
  checkpoint disappear. The new contents are built aside in a fresh table, and only when
  every part has been read and validated are they swapped in, so a load that fails
  half-way (a corrupt second shard file) leaves the table as it was. The price is memory
  for the old and the new contents during the load.

Every import is all-or-nothing: columns are validated and storage is reserved before the
index or the rows change.

A restore's imports are strict (each key once), so an in-memory table takes them in bulk
(:mod:`.row_import`): one compiled pass copies and checks the rows, at ids no key owns
yet, while another (on a second thread, for 64k rows or more) inserts the keys and finds
repeated or present ones on the way; nothing is looked up first, sorted, or copied out of
the (memory-mapped) columns. A tiered table
takes the upsert path, whose rows go through its tiers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InputError
from .columns import (
    OPTIONAL_PENDING_COLUMNS,
    OPTIONAL_ROW_COLUMNS,
    PENDING_COLUMNS,
    ROW_COLUMNS,
    SPLIT_ROW_COLUMNS,
    check_columns,
    gather_columns,
    scatter_row_columns,
    write_stats,
)
from .hashmap import KeyIndex
from .push import scatter_rows
from .row_import import NOT_FINITE, advise_huge_pages, copy_new_rows
from .split_transfer import import_split, widen
from .storage import PENDING_WHERE, TableStorage

__all__ = ["RowTransfer"]

log = logging.getLogger(__name__)
# a strict import of at least this many rows copies them and inserts their keys at once
_PARALLEL_ROWS = 1 << 16
# A tiered table's export of at most 1/this of its rows reads them where they are on disk,
# a larger one the whole file in order. The file's pages are dropped after each read, so
# count cold reads: ~25 rows share a 4 KiB page, and one random page read costs what 10-15
# pages read in order do on an SSD: break-even near 1/250 of the rows.
_LOCATE_FRACTION = 256


class RowTransfer:
    """Export and import (merge) of a :class:`~sparseps.table.SparseTable`'s rows as
    columns, on its storage (a restore is imports into a fresh table, then
    :meth:`~sparseps.table.SparseTable.adopt`)."""

    def __init__(self, storage: TableStorage) -> None:
        self.storage = storage

    # -- export -----------------------------------------------------------------------
    def export_rows(self) -> dict[str, np.ndarray]:
        """Every live row as columns (order unspecified, consistent across columns).

        Returns:
            ``key`` uint64 [n], ``embedding`` float32 [n, dim], ``state`` float32
            [n, state_dim], ``show``/``click``/``delta_score`` float32 [n],
            ``unseen_days`` int32 [n] and ``touched`` uint8 [n] (1 = pushed since the last
            decay; optional on import, default 0).
        """
        store = self.storage
        if store.tier is None:
            keys, ids = store.index.items()
            columns = gather_columns(store.rows, keys, ids, store.where)
        else:  # every row from the disk (flushed), in file order: one sequential read
            keys, ids, where, disk = store.tier.scan(store.index, "export_rows")
            columns = gather_columns(disk, keys, where, store.where)
            store.tier.drop_pages()
        return widen(store, self._names(columns), ids, "export_rows")

    def _names(self, columns: dict) -> dict[str, np.ndarray]:
        return {name: columns[name] for name in (*ROW_COLUMNS, *OPTIONAL_ROW_COLUMNS)}

    def export_row_parts(self, rows_per_part: int) -> Iterator[dict[str, np.ndarray]]:
        """:meth:`export_rows` in parts of at most ``rows_per_part`` rows, so that a table
        larger than memory is saved without its rows in memory at once.

        An in-memory table yields one part (its rows are in memory anyway). A tiered one
        yields its disk copies in file order and holds the tier's lock until the last part
        is taken: pulls of the table wait meanwhile, and the parts are one consistent
        snapshot (the caller also keeps pushes out, as for :meth:`export_rows`).
        """
        store = self.storage
        if store.tier is None:
            yield self.export_rows()
            return
        step = max(1, int(rows_per_part))
        with store.tier.lock:
            keys, ids, where, disk = store.tier.scan(store.index, "export_rows")
            for at in range(0, max(keys.size, 1), step):
                part = slice(at, at + step)
                columns = gather_columns(disk, keys[part], where[part], store.where)
                store.tier.drop_pages()
                yield widen(store, self._names(columns), ids[part], "export_rows")

    def export_keys(self, keys: np.ndarray) -> tuple[dict, dict]:
        """:meth:`export_rows` and :meth:`export_pending` columns of ``keys`` only (uint64,
        unique; keys that are neither are skipped): the rows of a virtual shard that moves
        to another server (:mod:`sparseps.elastic.server_moves`)."""
        store = self.storage
        keys = np.ascontiguousarray(keys, np.uint64)
        ids = store.index.find(keys)
        keep = ids >= 0
        if store.tier is None:
            columns = gather_columns(store.rows, keys[keep], ids[keep], store.where)
            rows = widen(store, self._names(columns), ids[keep], "export_keys")
        elif np.count_nonzero(keep) * _LOCATE_FRACTION <= len(store.index):
            # a few rows (a dirty round of a moving shard): read them where they are
            order, where, disk = store.tier.locate(ids[keep], "export_keys")
            columns = gather_columns(disk, keys[keep][order], where, store.where)
            store.tier.drop_pages()
            rows = widen(store, self._names(columns), ids[keep][order], "export_keys")
        else:  # most of the table: one sequential read of the disk copies, then the selection
            every = self.export_rows()
            keep = np.isin(every["key"], keys)
            rows = {name: values[keep] for name, values in every.items()}
        ids = store.pending_index.find(keys)
        keep = ids >= 0
        columns = gather_columns(store.pending, keys[keep], ids[keep], PENDING_WHERE)
        pending = {name: columns[name] for name in (*PENDING_COLUMNS, *OPTIONAL_PENDING_COLUMNS)}
        return rows, pending

    def export_pending(self) -> dict[str, np.ndarray]:
        """Admission counters of keys not admitted yet: ``key``, ``show``, ``click``
        (+ ``unseen_days`` int32 and ``touched`` uint8, optional on import)."""
        store = self.storage
        keys, ids = store.pending_index.items()
        columns = gather_columns(store.pending, keys, ids, PENDING_WHERE)
        return {name: columns[name] for name in (*PENDING_COLUMNS, *OPTIONAL_PENDING_COLUMNS)}

    # -- merge ------------------------------------------------------------------------
    def import_rows(
        self,
        columns: dict,
        *,
        strict: bool = False,
        select: np.ndarray | None = None,
        parallel: bool = True,
    ) -> None:
        """Upsert rows from :meth:`export_rows` columns (bit-exact round trip).

        A key that was pending becomes a row (its pending counters are dropped).

        Args:
            columns: the columns (may be read-only, e.g. views of a mapped shard file).
            strict: refuse keys the table already holds as rows (a checkpoint holds each
                key once; used while restoring). An in-memory table then takes the bulk
                path: one compiled pass copies and checks the rows, one inserts the keys.
            select: int64 positions of the rows to import (the keys a server owns in a
                file saved on another number of servers); None imports every row.
            parallel: a large bulk import copies the rows and inserts the keys on two
                threads; False keeps it on one (when another thread already needs the
                second core, e.g. a SHA-256 verification beside the import).

        Raises:
            InputError: a missing or unknown column, a wrong dtype/shape (e.g. an
                embedding of another dim), lengths that differ, repeated keys,
                non-finite values, or (strict) a key already present; nothing is
                imported then.
            ResourceError: out of memory; nothing is imported.
        """
        store = self.storage
        layout = store.export_layout
        bulk = strict and store.tier is None and not store.split
        optional = (*OPTIONAL_ROW_COLUMNS, *(SPLIT_ROW_COLUMNS if store.split else ()))
        cols = check_columns("import_rows", columns, ROW_COLUMNS, optional,
                             layout.dim, layout.state_dim, values=not bulk)  # fmt: skip
        if select is not None:
            select = _check_select(select, cols["key"].size)
        if store.split:
            if select is not None:
                cols = {name: np.ascontiguousarray(values[select]) for name, values in cols.items()}
            import_split(store, cols, "import_rows", strict=strict, refuse=self._refuse_present)
            return
        if bulk:
            self._import_new_rows(cols, select, parallel=parallel)
            return
        if select is not None:
            cols = {name: np.ascontiguousarray(values[select]) for name, values in cols.items()}
        keys = cols["key"]
        n = keys.size
        if n == 0:
            return
        ids = store.index.find(keys)
        if strict:
            self._refuse_present("import_rows", keys, ids)
        tier, staged = store.tier, None
        if tier is not None:  # the tier takes whole rows: built aside, first
            staged = np.empty((n, layout.width), np.float32)
            scatter_row_columns(staged, np.arange(n), cols, store.where)
        new = np.flatnonzero(ids < 0)
        store.grow("import_rows", new.size, 0, pending_erases=n)
        if new.size:
            ids[new] = store.index.find_or_insert(keys[new])[0]
        if tier is None:  # nothing can fail from here: straight into the rows
            scatter_row_columns(store.rows, ids, cols, store.where)
        else:  # straight into the tiers: new rows to disk, cached ones in their slots
            assert staged is not None
            tier.write(ids, staged, "import_rows")
        store.pending_index.erase(keys)

    def _import_new_rows(self, cols: dict, select: np.ndarray | None, *, parallel: bool) -> None:
        """import_rows(strict=True) of an in-memory table: the rows, at ids no key owns
        yet (a bad value leaves them unreachable), and the keys (a present or repeated key
        undoes its batch's inserts; a bad row found by the copy, too), so a failure
        changes nothing. A large import runs the two passes on two threads."""
        store = self.storage
        keys = cols["key"] if select is None else cols["key"][select]
        n = keys.size
        if n == 0:
            return
        pending = len(store.pending_index) > 0  # a restore imports rows before pending
        store.grow("import_rows", n, 0, pending_erases=n if pending else 0)
        index = store.index
        assert isinstance(index, KeyIndex), "a split table imports through import_split"
        ids = index.planned_ids(n)
        high_water, free_ids = index.high_water, index.free_ids
        advise_huge_pages(store.rows[high_water : high_water + n])  # the rows past it are new
        keys = np.ascontiguousarray(keys)
        # The copy (rows at ids no key owns yet) and the insert (the index) touch disjoint
        # memory and release the GIL: on two threads a large import takes the longer of the
        # two instead of their sum. A copy that finds a bad row takes the insert back.
        if parallel and n >= _PARALLEL_ROWS:
            with ThreadPoolExecutor(1, thread_name_prefix="sparseps-import") as pool:
                copied = pool.submit(copy_new_rows, store.rows, ids, cols, store.where, select)
                at = index.insert_absent(keys, ids)
                try:
                    problem, bad = copied.result()
                except BaseException:  # the copy broke (out of memory?): nothing imported
                    if at < 0:
                        index.undo_insert_absent(keys, free_ids)
                    raise
            if problem and at < 0:  # the keys went in: take them back
                index.undo_insert_absent(keys, free_ids)
        else:
            problem, bad = copy_new_rows(store.rows, ids, cols, store.where, select)
            at = -1 if problem else index.insert_absent(keys, ids)
        if problem:
            what = "NaN/inf" if problem == NOT_FINITE else "unseen_days < 0"
            raise InputError(
                f"import_rows into table {store.config.name!r}: a row contains {what} (first "
                f"at key {int(keys[bad])}, position {bad}); nothing was imported"
            )
        if at >= 0:
            if store.index.find(keys[at : at + 1])[0] >= 0:
                self._refuse_present("import_rows", keys, store.index.find(keys))
            raise InputError(
                f"import_rows: columns['key'] has repeated keys (first {int(keys[at])}); "
                "nothing was imported"
            )
        if pending:
            store.pending_index.erase(keys)

    def import_pending(self, columns: dict, *, strict: bool = False) -> None:
        """Upsert pending counters from :meth:`export_pending` columns.

        Keys that are already rows are skipped (a row supersedes its pending counters).
        ``strict`` refuses keys that are already pending.

        Raises:
            InputError: as :meth:`import_rows`.
        """
        store = self.storage
        cols = check_columns(
            "import_pending", columns, PENDING_COLUMNS, OPTIONAL_PENDING_COLUMNS, 0, 0
        )
        keys = cols["key"]
        if strict:
            self._refuse_present("import_pending", keys, store.pending_index.find(keys))
        keep = np.flatnonzero(~store.index.contains(keys))
        if keep.size < keys.size:
            log.info("table %s: import_pending skipped %d keys that are rows",
                     store.config.name, keys.size - keep.size)  # fmt: skip
            cols = {name: values[keep] for name, values in cols.items()}
            keys = np.ascontiguousarray(cols["key"])
        n = keys.size
        if n == 0:
            return
        staged = np.empty((n, len(PENDING_WHERE)), np.float32)
        write_stats(staged, np.arange(n), cols, PENDING_WHERE)
        pids = store.pending_index.find(keys)
        new = np.flatnonzero(pids < 0)
        store.grow("import_pending", 0, new.size)
        if new.size:
            pids[new] = store.pending_index.find_or_insert(keys[new])[0]
        scatter_rows(store.pending, pids, staged)

    def _refuse_present(self, op: str, keys: np.ndarray, ids: np.ndarray) -> None:
        store = self.storage
        present = ids >= 0
        if present.any():
            raise InputError(
                f"{op} into table {store.config.name!r}: {int(present.sum())} key(s) are already "
                f"in the table (first {int(keys[np.flatnonzero(present)[0]])}); a checkpoint "
                "holds each key once, so its files overlap; nothing was imported"
            )


def _check_select(select: object, n: int) -> np.ndarray:
    """Row positions for ``import_rows(select=)``: int64, 1-D, each in ``[0, n)``."""
    if not isinstance(select, np.ndarray) or select.dtype != np.int64 or select.ndim != 1:
        raise InputError(f"import_rows: select must be a 1-D int64 array, found {select!r:.80}")
    if select.size and (int(select.min()) < 0 or int(select.max()) >= n):
        raise InputError(f"import_rows: select holds positions outside [0, {n})")
    return np.ascontiguousarray(select)
