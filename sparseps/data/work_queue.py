"""One pass's work items, claimed by ticket from the job's shared store.

The store-side protocol of work stealing (:mod:`sparseps.data.steal` decides what a
worker reads; this module only hands out item numbers ``0..items-1`` of one pass).

Why a ticket counter on the rendezvous store: the workers already share one store
(worker 0 hosts it at ``SPARSEPS_MASTER``; gloo and the barriers run on it), and its
``add(key, 1)`` is atomic. Every worker sorts the same file list; ticket ``t`` (the value
``add`` returned, minus one) is file ``t`` of that list, so each file goes to exactly one
worker, with one small round trip per *file* (never per batch or row) and no new service.
Each pass of each dataset has its own key prefix (``<namespace>/next`` is the counter),
so two datasets, or two passes of one, never share a counter.

Leases (``lease_s=``): a worker that leaves mid-pass (killed, crashed) hands its claimed,
unfinished files to the others. Every claim is recorded as the file's owner
(``.../owner/<t>``, set with ``compare_set`` so that exactly one worker owns a file at any
time), every worker bumps a heartbeat counter on the store (``sparseps/steal/alive/<rank>``,
a thread, every ``lease_s / 5``), and a file is *handed out* once the consumer has taken
its last chunk (``.../done/<t>``, counted once). A worker whose tickets ran out does not
end its pass at once: it watches the files not yet handed out, and takes over (a
``compare_set`` from the dead owner to itself) each whose owner's heartbeat has not moved
for ``lease_s`` (measured on the watcher's own clock, so hosts need no common time), and
a ticket drawn but never owned (a claimer that died between the two calls) after
``lease_s``. It ends its pass once every file is handed out. Rows: the taker reads the
file from its start, so rows the dead worker had already trained from it are trained
twice (at-least-once for the rows of a partly read file); rows of files the dead worker
had handed out but not trained yet (its last few batches in flight) are not read again
in that pass (with a journal, :mod:`sparseps.data.file_journal`, the next start reads the
file again: it is not finished). A worker silent for ``lease_s`` while alive (stopped,
swapped out) is taken for dead and its file read twice: choose ``lease_s`` well above any
pause. Waiting at the end of a pass for the others' files to be handed out suits
asynchronous consumers (async training, loading into memory, plain loops); it is off by
default (``lease_s=None``: a worker's pass ends when the tickets run out), and a
sync-mode trainer must not use it (its per-step collectives would wait for a worker that
waits for them).
"""

from __future__ import annotations

import logging
import threading
import time

from ..errors import ConfigError, DeadlineError

__all__ = ["Heartbeat", "Lease", "WorkQueue", "alive_key"]

log = logging.getLogger(__name__)


class Lease:
    """How claims of a pass outlive a dead claimer (see the module docstring).

    Args:
        lease_s: a claimer whose heartbeat has not moved for this long is taken for dead.
        wait_s: the longest a claimer whose tickets ran out waits for the other files to
            be handed out (a :class:`~sparseps.errors.DeadlineError` names it after).
        poll_s: how often it looks at them.
    """

    def __init__(self, lease_s: float, *, wait_s: float = 3600.0, poll_s: float = 0.1) -> None:
        if not lease_s > 0 or not wait_s > 0 or not poll_s > 0:
            raise ConfigError(f"lease_s={lease_s!r}: expected seconds > 0 (and wait_s, poll_s)")
        self.lease_s, self.wait_s, self.poll_s = float(lease_s), float(wait_s), float(poll_s)


class Heartbeat:
    """One thread per (store, rank) in a process: bumps ``sparseps/steal/alive/<rank>``
    every ``interval`` seconds until the store stops answering (the job ended)."""

    _running: dict[tuple[int, int], threading.Thread] = {}
    _lock = threading.Lock()

    @classmethod
    def ensure(cls, store, rank: int, interval: float) -> None:
        with cls._lock:
            key = (id(store), rank)
            thread = cls._running.get(key)
            if thread is not None and thread.is_alive():
                return
            thread = threading.Thread(target=cls._beat, args=(store, rank, interval, key),
                                      name=f"sparseps-steal-heartbeat-{rank}", daemon=True)  # fmt: skip
            cls._running[key] = thread
            thread.start()

    @classmethod
    def _beat(cls, store, rank: int, interval: float, key) -> None:
        try:
            while True:
                store.add(alive_key(rank), 1)
                time.sleep(interval)
        except Exception as exc:  # the store is gone: the job (or this process's part) ended
            log.debug("steal heartbeat of worker %d stops: %s", rank, exc)
        finally:
            with cls._lock:
                if cls._running.get(key) is threading.current_thread():
                    del cls._running[key]


def alive_key(rank: int) -> str:
    return f"sparseps/steal/alive/{rank}"


class _Liveness:
    """Whether a rank's heartbeat moved within ``lease_s`` (on this process's clock)."""

    def __init__(self, store, lease_s: float) -> None:
        self._store, self._lease_s = store, lease_s
        self._seen: dict[int, tuple[int, float]] = {}

    def dead(self, rank: int) -> bool:
        value, now = int(self._store.add(alive_key(rank), 0)), time.monotonic()
        seen = self._seen.get(rank)
        if seen is None or seen[0] != value:
            self._seen[rank] = (value, now)
            return False
        return now - seen[1] > self._lease_s


class WorkQueue:
    """One pass's files, claimed by ticket from a shared store (thread- and process-safe).

    Args:
        store: a ``torch.distributed.Store`` shared by every claimer (``add`` is atomic).
        namespace: the pass's key prefix (one per dataset and pass: the keys of two
            queues never meet).
        items: how many items the pass has (tickets ``0..items-1``).
        skip: items already finished (a resumed pass): never handed out.
        rank: the claimer (owner of its claims, with a lease).
        lease: claims outlive a dead claimer (see the module docstring); None: no lease.
    """

    def __init__(self, store, namespace: str, items: int, skip: frozenset[int] = frozenset(),
                 *, rank: int = 0, lease: Lease | None = None) -> None:  # fmt: skip
        self._store, self._ns, self._key = store, namespace, f"{namespace}/next"
        self._items, self._skip, self._rank, self._lease = items, skip, rank, lease
        self._me = str(rank).encode()
        self._lock = threading.Lock()  # the watch at the end of a pass: one thread at a time
        self._known_done: set[int] = set()
        self.taken_over: list[int] = []  # items this claimer took from dead owners
        if lease is not None:
            Heartbeat.ensure(store, rank, max(lease.lease_s / 5, 0.02))

    def claim(self) -> int | None:
        """The next unclaimed item, or None when every item has been taken (with a lease:
        when every item has been handed out; a dead owner's item is taken over)."""
        while True:
            ticket = int(self._store.add(self._key, 1)) - 1
            if ticket >= self._items:
                break
            if ticket in self._skip:
                continue
            if self._lease is None or self._own(ticket, b""):
                return ticket
        if self._lease is None:
            return None
        with self._lock:
            return self._watch(self._lease)

    def done(self, item: int) -> None:
        """With a lease: ``item`` was handed out to the consumer (counted once)."""
        if self._lease is None:
            return
        if int(self._store.add(f"{self._ns}/done/{item}", 1)) == 1:  # once per item
            self._store.add(f"{self._ns}/done", 1)

    def _own(self, item: int, holder: bytes) -> bool:
        """Take ``item`` from ``holder`` (b"": nobody); True when this claimer got it."""
        return self._store.compare_set(f"{self._ns}/owner/{item}", holder, self._me) == self._me

    def _watch(self, lease: Lease) -> int | None:
        """Tickets ran out: wait until every item is handed out, taking over those of dead
        owners; the item taken over, or None at the end."""
        todo = [t for t in range(self._items) if t not in self._skip]
        unowned_since: dict[int, float] = {}
        alive = _Liveness(self._store, lease.lease_s)
        deadline = time.monotonic() + lease.wait_s
        while int(self._store.add(f"{self._ns}/done", 0)) < len(todo):
            now = time.monotonic()
            for item in todo:
                if item in self._known_done:
                    continue
                if self._store.check([f"{self._ns}/done/{item}"]):
                    self._known_done.add(item)
                    continue
                owner_key = f"{self._ns}/owner/{item}"
                owner = self._store.get(owner_key) if self._store.check([owner_key]) else None
                if owner is None:  # drawn, never owned: its claimer died between the calls
                    if now - unowned_since.setdefault(item, now) > lease.lease_s and self._own(
                        item, b""
                    ):
                        return self._took(item, "nobody")
                elif owner != self._me and alive.dead(int(owner)) and self._own(item, owner):
                    return self._took(item, f"worker {int(owner)}")
            if now > deadline:
                raise DeadlineError(
                    f"work stealing: items of {self._ns} were not all handed out within "
                    f"{lease.wait_s:.0f} s (a live worker holds them); raise Lease.wait_s",
                    op="steal", seconds=lease.wait_s, setting="Lease.wait_s",
                )  # fmt: skip
            time.sleep(lease.poll_s)
        return None

    def _took(self, item: int, owner: str) -> int:
        self.taken_over.append(item)
        log.warning("work stealing: worker %d takes item %d of %s from %s (no heartbeat "
                    "for %.1f s); it is read again from its start",
                    self._rank, item, self._ns, owner, self._lease.lease_s if self._lease else 0)  # fmt: skip
        return item
