"""Where a GPUPS pass's rows come from: the pass's keys, the next pass prepared ahead, and
the owner's choice of source for each row.

A pass's build (:meth:`sparseps.worker.gpups.GpuPsMode.begin_pass`) needs the unique keys
of the pass (:func:`pass_keys`) and, on each key's owner, the key's whole row (embedding
and optimizer state). Three sources, in this order of precedence:

1. **carry-over**: the previous pass's final rows (:class:`Carry`: the host copy of
   what its write-back sent). They equal what the servers hold after that write-back,
   bit for bit (``write_rows`` overwrites), so a key shared with the previous pass
   needs no pull.
2. **early rows**: rows pulled while the previous pass trained (:class:`NextPass`),
   sent to the owner with the keys. A row of a key *not* in the previous pass is not
   written by that pass, so what was pulled during it is what a pull would give now.
3. **pull**: ``PSClient.pull_full`` now, for whatever is left (every key without a
   prepared next pass).

So a build with or without the next pass prepared gives the same rows; what changes is
how long the pass boundary stalls training. Both prepared sources are dropped when the
servers' rows may have changed between the passes in a way the pass did not make: a
checkpoint load (``load_dense_local``), a shrink that deleted rows (the servers' row
count is not the one the write-back left).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sized

import numpy as np

from ..config import TableConfig
from ..core import collectives
from ..core.keysets import unique_keys
from ..core.routing import server_of
from ..errors import ConfigError

__all__ = [
    "Carry",
    "WriteBack",
    "agree_groups",
    "NextPass",
    "check_pass_dataset",
    "exchange_early",
    "full_width",
    "pass_keys",
    "pick_rows",
]

log = logging.getLogger(__name__)

_COMPACT_IDS = 1 << 24  # ids gathered for a pass before they are deduplicated


def check_pass_dataset(dataset: object) -> None:
    """A GPUPS pass needs its keys before it starts: an InMemoryDataset or a list."""
    from ..data import InMemoryDataset

    # a wrapper that knows its length holds its batches (sparseps online's counting one)
    if not isinstance(dataset, InMemoryDataset | list | tuple | Sized):
        raise ConfigError(
            f"Strategy(mode='gpups') trains from an InMemoryDataset (or a list of "
            f"batches), got {type(dataset).__name__}: a pass's working set (its unique "
            "keys) must be known before the pass starts, and a stream is read only "
            "once; load the files with sparseps.data.InMemoryDataset(...)"
            ".load_into_memory()"
        )


def pass_keys(
    dataset: Iterable,
    lookups: Callable,
    tables: list[str],
    *,
    compact_ids: int = _COMPACT_IDS,
    cancelled: threading.Event | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``{table: unique uint64 keys}`` of every batch of ``dataset``, and per table the
    index of the first table read through the same dedup (-1s when the dataset is empty).

    The trainer's dedup (``lookups``) runs on the first batch only, to learn which slots
    each table reads; then the ids of those slots are gathered and made unique by sorting
    (``unique_keys``; 15x faster than a full per-batch lookup on the demo data)."""
    shared = np.full(len(tables), -1, np.int64)
    slots: dict[str, tuple[str, ...]] = {}
    parts: dict[str, list[np.ndarray]] = {}
    held, limit = 0, compact_ids
    for batch in dataset:
        if cancelled is not None and cancelled.is_set():
            break
        if not slots:
            found = lookups(batch)
            shared[:] = [
                next(j for j, t in enumerate(tables) if found[t] is found[n]) for n in tables
            ]
            slots = {tables[j]: found[tables[j]].slots for j in set(shared.tolist())}
            parts = {name: [] for name in slots}
        for name, names in slots.items():
            parts[name].extend(batch.slots[s].values for s in names)
            held += sum(batch.slots[s].values.size for s in names)
        if held > limit:  # bound the memory of a large pass: dedup what is held
            parts = {name: [unique_keys(np.concatenate(p))] for name, p in parts.items()}
            held = sum(p[0].size for p in parts.values())
            limit = max(limit, 2 * held)  # amortised: each id is sorted O(1) times
    empty = np.empty(0, np.uint64)
    unique = {name: unique_keys(np.concatenate(p)) if p else empty for name, p in parts.items()}
    keys = {name: unique.get(tables[int(j)], empty) for name, j in zip(tables, shared, strict=True)}
    return keys, shared


def agree_groups(names: list[str], shared: np.ndarray, timeout: float) -> list[list[str]]:
    """Tables read through one dedup (``shared[i]``: the first table with table i's keys,
    :func:`pass_keys`), as the first worker with data saw them: every worker must route
    alike (a collective)."""
    every = collectives.all_gather_arrays(shared, timeout=timeout)
    seen = next((g for g in every if g.size and g.min() >= 0), np.arange(len(names)))
    groups: dict[int, list[str]] = {}
    for i, first in enumerate(seen.tolist()):
        groups.setdefault(first, []).append(names[i])
    return list(groups.values())


def full_width(config: TableConfig) -> int:
    """Columns of a whole row: embedding and optimizer state."""
    return config.full_width


def exchange_early(
    groups: list[list[str]], early: dict, owned: dict, configs: dict, timeout: float
) -> dict:
    """Send each key's early row (where this worker pulled one) to its owner (collective:
    every worker calls it when any has early rows; two collectives a group, the counts
    and the rows, with only the early rows and their keys on the wire).

    Args:
        groups: the tables sharing keys, as the build routes them.
        early: per group's first table, ``(keys, rows of the group's tables)``: keys of
            this worker's share of the pass.
        owned: the owner's keys per table (sorted, unique: ``unique_keys`` of received).
        configs: the table configs by name.

    Returns:
        per group's first table, ``(has bool [n owned], rows float32 [n owned, width of
        the group's tables])``: whether a worker sent an early row of each owned key, and
        the row (equal rows from several workers: any one).
    """
    out = {}
    world = collectives.world_size()
    for group in groups:
        first = group[0]
        width = sum(full_width(configs[n]) for n in group)
        ekeys, erows = early.get(first, (np.empty(0, np.uint64), np.empty((0, width), np.float32)))
        # only the early rows travel, each with its key (two float32 words of its bits):
        # half the bytes of a slot per pass key when half of them were pulled early
        payload = np.empty((ekeys.size, 2 + width), np.float32)
        payload[:, :2] = np.ascontiguousarray(ekeys, np.uint64).view(np.float32).reshape(-1, 2)
        payload[:, 2:] = erows
        owner = server_of(ekeys, world) if ekeys.size else np.zeros(0, np.int64)
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=world).astype(np.int64)
        got, _ = collectives.all_to_all_rows(payload[order], counts, timeout=timeout)
        keys = np.ascontiguousarray(got[:, :2]).view(np.uint64).reshape(-1)
        mine = owned[first]
        at = np.searchsorted(mine, keys)  # every early key sent here is owned here
        has = np.zeros(mine.size, bool)
        has[at] = True
        rows = np.empty((mine.size, width), np.float32)
        rows[at] = got[:, 2:]
        out[first] = (has, rows)
    return out


class Carry:
    """One table's final rows of a pass, kept on the host for the next pass's build.

    Args:
        keys: uint64 ``[n]`` sorted by their int64 view (a device table's order).
        rows: float32 ``[n, dim + state_dim]``, the rows its write-back sent.
    """

    def __init__(self, keys: np.ndarray, rows: np.ndarray) -> None:
        self.keys = keys.view(np.int64)
        self.rows = rows

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(held, at)``: which of ``keys`` are carried, and their row index (where held)."""
        if not self.keys.size or not keys.size:
            return np.zeros(keys.size, bool), np.zeros(keys.size, np.int64)
        query = np.ascontiguousarray(keys).view(np.int64)
        at = np.searchsorted(self.keys, query).clip(max=self.keys.size - 1)
        return self.keys[at] == query, at


def pick_rows(
    keys: np.ndarray, carry: Carry | None, has_early: np.ndarray | None,
    early_rows: np.ndarray | None, width: int,
) -> tuple[np.ndarray, np.ndarray, dict]:  # fmt: skip
    """The owner's rows of ``keys`` (uint64 ``[n]``) from the prepared sources.

    Args:
        keys: the owner's keys of the new pass.
        carry: the previous pass's rows of this table (None: none).
        has_early: bool ``[n]``, whether an early row of each key came (None: none);
            early_rows: float32 ``[n, width]``, those rows (others: anything).
        width: the table's ``dim + state_dim``.

    Returns:
        ``(rows float32 [n, width], need: int64 positions of the keys left to pull,
        counts {"carried", "early"})``.
    """
    n = keys.size
    if has_early is None or early_rows is None:
        rows, from_early = np.empty((n, width), np.float32), np.zeros(n, bool)
    else:
        rows, from_early = early_rows, has_early.copy()
    held = np.zeros(n, bool)
    if carry is not None:
        held, at = carry.find(keys)
        where = np.flatnonzero(held)
        rows[where] = carry.rows[at[where]]  # the carried row wins over an early one
        from_early &= ~held
    need = np.flatnonzero(~(held | from_early))
    return rows, need, {"carried": int(held.sum()), "early": int(from_early.sum())}


class NextPass:
    """The next pass, prepared in a background thread while the current one trains.

    The thread finds the next pass's keys of this worker's share (:func:`pass_keys`),
    then, once ``start_pulls`` is set (the pass that precedes the next one has begun:
    every row the early pull reads is then one that pass cannot have changed except by
    its own write-back), pulls the whole rows of those keys, except ``exclude`` (keys of
    the running pass, whose rows come from its carry-over).

    Args:
        dataset: the next pass's dataset (the build checks it is the same object).
        lookups: the trainer's per-batch dedup.
        tables: the table names, sorted (as the mode orders them).
        client: the worker's PSClient.
        target: the number of passes begun before the one this prepares.
    """

    def __init__(self, dataset, lookups: Callable, tables: list[str], client, target: int) -> None:
        self.dataset, self.target = dataset, target
        self.start_pulls = threading.Event()
        self.exclude: dict[str, np.ndarray] = {}  # set before start_pulls
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.local: dict[str, np.ndarray] = {}
        self.shared = np.empty(0, np.int64)
        self.early: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # group first -> keys, rows
        self.seconds = 0.0
        self._args = (lookups, tables, client)
        self._thread = threading.Thread(target=self._run, name="gpups-next-pass", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        lookups, tables, client = self._args
        start = time.perf_counter()
        try:
            self.local, self.shared = pass_keys(
                self.dataset, lookups, tables, cancelled=self._cancelled
            )
            self.seconds += time.perf_counter() - start
            self.start_pulls.wait()
            start = time.perf_counter()
            if self._cancelled.is_set():
                return
            firsts = sorted({int(j) for j in self.shared.tolist() if j >= 0})
            for j in firsts:
                first = tables[j]
                keys = self.local[first]
                skip = self.exclude.get(first)
                if skip is not None and skip.size and keys.size:
                    keys = keys[~np.isin(keys, skip, assume_unique=True)]
                group = [t for t, f in zip(tables, self.shared.tolist(), strict=True) if f == j]
                handles = [client.pull_full(name, keys) for name in group]
                rows = [h.wait() for h in handles]
                self.early[first] = (keys, np.concatenate(rows, axis=1))
        except BaseException as exc:  # reported by result(): the build then pulls instead
            self._error = exc
        finally:
            self.seconds += time.perf_counter() - start
            self._done.set()

    def cancel(self) -> None:
        self._cancelled.set()
        self.start_pulls.set()

    def result(self, timeout: float) -> bool:
        """Wait for the thread (up to ``timeout`` s); True when its keys and rows are usable.

        Raises:
            the thread's error, if it failed finding the keys (the dataset is broken).
        """
        self.start_pulls.set()
        if not self._done.wait(timeout):
            self.cancel()
            log.warning(
                "GPUPS: the next pass was not prepared within %.0f s; building it now", timeout
            )
            return False
        if self._error is not None:
            if not self.local:  # the keys themselves failed: the pass's data is broken
                raise self._error
            log.warning(
                "GPUPS: the early pull of the next pass failed (%s); pulling now", self._error
            )
            self.early = {}
        return not self._cancelled.is_set()


def send_rows(client, name: str, result: dict, dim: int) -> list:
    """Send one table's pass result (``DeviceTable.result``) to the servers: admitted
    rows whole (``write_rows``), the counts of keys still pending admission as a push of
    zero gradients (:mod:`.gpups_admit`); returns the handles."""
    keys, rows, shows, clicks, admitted = (
        result[k] for k in ("key", "rows", "show", "click", "admitted")
    )  # fmt: skip
    if admitted.all():  # every key a row (admission "always"): no copies
        return [client.write_rows(name, keys, rows, shows=shows, clicks=clicks)]
    handles = []
    if admitted.any():
        handles.append(client.write_rows(name, keys[admitted], rows[admitted],
                                         shows=shows[admitted], clicks=clicks[admitted]))  # fmt: skip
    pending = ~admitted
    if pending.any():
        zeros = np.zeros((int(pending.sum()), dim), np.float32)
        handles.append(client.push(name, keys[pending], zeros, shows=shows[pending],
                                   clicks=clicks[pending]))  # fmt: skip
    return handles


class WriteBack:
    """A pass's write-back: its sends (:func:`send_rows` per table), in a background
    thread when the next pass goes on meanwhile (the results are host arrays the device
    tables no longer change); :meth:`wait` joins it and waits for every answer.

    Args:
        client: the worker's PSClient (thread-safe: the next pass's early pulls share it).
        jobs: ``(table, result, dim)`` per table.
        background: send from a thread (else now, before returning).
    """

    def __init__(self, client, jobs: list, *, background: bool) -> None:
        self._handles: list = []
        self._error: BaseException | None = None
        self._done = False
        self._thread = None
        if background:
            self._thread = threading.Thread(
                target=self._send, args=(client, jobs), name="gpups-write-back", daemon=True
            )
            self._thread.start()
        else:
            self._send(client, jobs)

    def _send(self, client, jobs: list) -> None:
        try:
            for name, result, dim in jobs:
                self._handles += send_rows(client, name, result, dim)
        except BaseException as exc:  # raised by wait(), on the training thread
            self._error = exc

    def wait(self) -> None:
        """Every write answered (idempotent); raises what a send raised."""
        if self._done:
            return
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        for handle in self._handles:
            handle.wait()
        self._done = True
