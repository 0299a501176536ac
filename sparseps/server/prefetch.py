"""``RowPrefetcher``: a server's background thread that promotes disk rows ahead of pulls.

A worker knows the keys of its next batches before it pulls them (its pipeline prepares
them ahead); it sends them in a ``prefetch`` request, which the request loop answers at
once after queueing the keys here. This thread then promotes the rows of tiered tables
that are only on disk (:meth:`sparseps.table.SparseTable.prefetch` in its three steps):
planning and installing under the table's read lock, the disk reads with no lock, so
pulls and pushes go on while the rows are read. A prefetch is a hint: when the queue is
full the oldest request is dropped (counted), and a failure is logged and counted, never
answered to anyone.
"""

from __future__ import annotations

import collections
import logging
import threading

import numpy as np

from .log_budget import LogBudget

__all__ = ["RowPrefetcher"]

# keys per step: each step holds the table's read lock twice, briefly, so a waiting push
# (write lock) waits for one step at most
CHUNK_KEYS = 4096
# requests waiting; more means the workers run further ahead than the disk keeps up with,
# and the oldest hints are the least useful
QUEUE_REQUESTS = 64


class RowPrefetcher:
    """The prefetch queue and thread of one server.

    Args:
        log_budget: the server's rate-limited log.
    """

    def __init__(self, log_budget: LogBudget) -> None:
        self._log = log_budget
        self._queue: collections.deque = collections.deque()
        self._wake = threading.Condition(threading.Lock())
        self._stopping = False
        # requests: queued; done: promoted (or failed); dropped: never run
        self.counts = {"requests": 0, "done": 0, "dropped": 0, "rows": 0, "failed": 0}
        self._thread = threading.Thread(target=self._run, name="sparseps-row-prefetch", daemon=True)
        self._thread.start()

    def submit(self, entry, keys: np.ndarray) -> bool:
        """Queue ``keys`` of the table in ``entry`` (server ``TableEntry``); False if dropped
        because the server is stopping."""
        with self._wake:
            if self._stopping:
                return False
            self.counts["requests"] += 1
            if len(self._queue) >= QUEUE_REQUESTS:
                self._queue.popleft()
                self.counts["dropped"] += 1
            self._queue.append((entry, keys))
            self._wake.notify()
        return True

    def idle(self) -> bool:
        """Whether nothing is queued (the request in progress may still run)."""
        with self._wake:
            return not self._queue

    def stop(self, timeout: float = 10.0) -> None:
        """Drop what is queued and wait for the step in progress (before the tables close)."""
        with self._wake:
            self._stopping = True
            self._queue.clear()
            self._wake.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                entry, keys = self._queue.popleft()
            try:
                self._promote(entry, keys)
                with self._wake:
                    self.counts["done"] += 1
            except Exception as exc:  # noqa: BLE001 - a hint that failed must not end the thread
                with self._wake:
                    self.counts["failed"] += 1
                    self.counts["done"] += 1
                self._log.log(
                    logging.WARNING,
                    "prefetch",
                    "prefetch of %d keys of table %r failed (the pulls will read the rows "
                    "themselves): %s",
                    keys.size,
                    entry.table.config.name,
                    exc,
                )

    def _promote(self, entry, keys: np.ndarray) -> None:
        table = entry.table
        for at in range(0, keys.size, CHUNK_KEYS):
            if self._stopping:
                return
            with entry.lock.read():
                plan = table.plan_prefetch(keys[at : at + CHUNK_KEYS])
            if plan is None:
                continue
            plan.read()
            with entry.lock.read():
                rows = table.install_prefetch(plan)
            with self._wake:
                self.counts["rows"] += rows
