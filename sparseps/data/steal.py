"""Work stealing for file-based data: workers take files from a shared queue.

With ``split="static"`` (the default) worker ``rank`` of ``world`` reads
``files[rank::world]``, so a worker that is 3x slower than the others sets the pace of the
pass. With ``split="steal"`` every worker's reader threads take the next file of the pass
from one queue shared by the job, so a slow worker simply takes fewer files.

Why a ticket counter on the rendezvous store: the workers already share one store
(worker 0 hosts it at ``SPARSEPS_MASTER``; gloo and the barriers run on it), and its
``add(key, 1)`` is atomic. Every worker sorts the same file list; ticket ``t`` (the value
``add`` returned, minus one) is file ``t`` of that list, so each file goes to exactly one
worker, with one small round trip per *file* (never per batch or row) and no new service.
The key is namespaced by dataset and pass (``sparseps/steal/<dataset>/<pass>/next``), so
two datasets, or two passes of one, never share a counter; ``<dataset>`` is a digest of
the sorted file list plus how many stealing datasets over the same list this worker made
before (workers build their datasets in the same order, as they already must for every
collective).

Pacing: a worker's reader claims a file only when its consumer has taken every batch of
the previous one (a permit per reader thread, handed back by the consumer), so the files
a worker holds and has not handed out are at most ``threads``; a trainer's prefetch adds
a couple of batches. Claiming ahead of that would let a slow worker hoard files, which
is what stealing is meant to prevent. Granularity is one file: split a big file into
several to balance finer.

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
in that pass (with a journal the next start reads the file again: it is not finished).
A worker silent for ``lease_s`` while alive (stopped, swapped out) is taken for dead and
its file read twice: choose ``lease_s`` well above any pause. Waiting at the end of a
pass for the others' files to be handed out suits asynchronous consumers (async training,
loading into memory, plain loops); it is off by default (``lease_s=None``: a worker's pass
ends when the tickets run out, as before), and a sync-mode trainer must not use it (its
per-step collectives would wait for a worker that waits for them).

Exactly-once and resume (``journal=DIR``): an item (file) is *finished* once every row
read from it has been trained: reported by the :class:`~sparseps.worker.Trainer` after
the step that applied its gradients (pushes handed to the push queue, which sends them
asynchronously and flushes them at the end of the pass), or, when a plain loop iterates
the dataset, once the consumer asked for the batch after the one holding the file's last
rows. Each worker appends ``{"key", "pass", "item"}`` lines for its finished files to
``DIR/worker-<rank>.jsonl`` (keyed by the file list's digest; fsync per line, before the file counts as finished). A job
started again with the same ``journal`` agrees, through the store, on the latest pass any
worker journaled: if the union of the files finished in it covers every file, the next
iteration is the pass after it; otherwise it is that pass again, and the files already
finished are skipped (no ticket gives them out). Guarantee: a finished file is never read
again in its pass; a file claimed but not finished at a crash is read again, from its
start, on resume (its rows trained before the crash are trained twice: at-least-once
inside one file, exactly-once for finished files). Passes are job-wide sequential: a
worker starts pass p+1 only after every worker has finished pass p (the Trainer's end of
pass reduces metrics over every worker, which is such a barrier).

Without a store (no process group: local mode, or ``rank``/``world`` given by hand) a
stealing dataset reads what a static one would: everything with ``world=1``,
``files[rank::world]`` otherwise (with a warning), never a file twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path

import numpy as np

from ..core import worker_store
from ..errors import ConfigError, DeadlineError
from .schema import ID_FILE_SHIFT, Batch

__all__ = [
    "Heartbeat",
    "Journal",
    "Lease",
    "Split",
    "TrainedTracker",
    "WorkQueue",
    "dataset_key",
    "job_store",
    "list_digest",
]

log = logging.getLogger(__name__)

_made: Counter[tuple[str, int]] = Counter()  # stealing datasets made here, by (digest, rank)
_made_lock = threading.Lock()


class Split(StrEnum):
    """How a dataset's files are shared among workers."""

    STATIC = "static"  # files[rank::world]
    STEAL = "steal"  # the next file from a queue shared by the job


def parse_split(value: str | Split) -> Split:
    try:
        return Split(value)
    except ValueError:
        raise ConfigError(
            f"split={value!r} is not one of {', '.join(s.value for s in Split)}"
        ) from None


def list_digest(files: tuple[str, ...]) -> str:
    """A short digest of a sorted file list (names a dataset's journal entries)."""
    return hashlib.sha1("\n".join(files).encode()).hexdigest()[:12]


def dataset_key(files: tuple[str, ...], rank: int) -> str:
    """A name for a stealing dataset, equal on every worker that builds the same ones in
    the same order (see the module docstring). Counted per rank, so that tests may play
    several workers in one process."""
    digest = list_digest(files)
    with _made_lock:
        number = _made[digest, rank]
        _made[digest, rank] += 1
    return f"{digest}-{number}"


def job_store():
    """The workers' rendezvous store of a launched job (None: local mode)."""
    return worker_store.current()


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
        namespace: the pass's key prefix (dataset and pass, see the module docstring).
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


class Journal:
    """Append-only record of the files this worker finished (``DIR/worker-<rank>.jsonl``)."""

    def __init__(self, directory: str | os.PathLike, rank: int, key: str) -> None:
        self.path = Path(directory) / f"worker-{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._key = key
        self._lock = threading.Lock()

    def latest(self) -> tuple[int, list[int]]:
        """The latest pass this worker journaled and the items it finished in it
        (``(-1, [])`` when none)."""
        if not self.path.exists():
            return -1, []
        by_pass: dict[int, list[int]] = {}
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a line cut by a crash: not finished
                continue
            if entry.get("key") == self._key:
                by_pass.setdefault(int(entry["pass"]), []).append(int(entry["item"]))
        if not by_pass:
            return -1, []
        last = max(by_pass)
        return last, sorted(by_pass[last])

    def finished(self, pass_no: int, item: int) -> None:
        line = json.dumps({"key": self._key, "pass": pass_no, "item": item}) + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def agree_on_resume(store, key: str, rank: int, world: int, mine: tuple[int, list[int]],
                    items: int) -> tuple[int, frozenset[int]]:  # fmt: skip
    """The pass to run next and the items already finished in it, the same on every worker.

    Each worker publishes its journal's latest pass and items; the latest pass over all
    workers is resumed with the union of its finished items, or, when that covers every
    item, the pass after it starts afresh.
    """
    prefix = f"sparseps/steal/{key}/resume"
    if store is not None and world > 1:
        store.set(f"{prefix}/{rank}", json.dumps({"pass": mine[0], "items": mine[1]}))
        published = [json.loads(store.get(f"{prefix}/{r}")) for r in range(world)]
    else:
        published = [{"pass": mine[0], "items": mine[1]}]
    last = max(p["pass"] for p in published)
    if last < 0:
        return 0, frozenset()
    done = frozenset(i for p in published if p["pass"] == last for i in p["items"])
    if len(done) >= items:
        return last + 1, frozenset()
    return last, done


class TrainedTracker:
    """Which of a pass's files are finished: every row read from them trained.

    The readers report each file's row count when they reach its end (:meth:`read_done`);
    the consumer reports trained batches (:meth:`trained`; the file of each row comes
    from its sample id). A file is finished when both sides agree; ``on_finished`` is then
    called once with its number.
    """

    def __init__(self, on_finished) -> None:
        self._read: dict[int, int] = {}  # file_no -> rows, once its reader reached the end
        self._trained: Counter[int] = Counter()
        self._finished: set[int] = set()
        self._on_finished = on_finished
        self._lock = threading.Lock()

    @staticmethod
    def rows_by_file(ids: np.ndarray) -> dict[int, int]:
        files, counts = np.unique(ids >> np.int64(ID_FILE_SHIFT), return_counts=True)
        return dict(zip(files.tolist(), counts.tolist(), strict=True))

    def read_done(self, file_no: int, rows: int) -> None:
        with self._lock:
            self._read[file_no] = rows
        self._check(file_no)

    def trained(self, ids: np.ndarray) -> None:
        by_file = self.rows_by_file(ids)
        with self._lock:
            self._trained.update(by_file)
        for file_no in by_file:
            self._check(file_no)

    def add_trained(self, by_file: dict[int, int]) -> None:
        with self._lock:
            self._trained.update(by_file)
        for file_no in by_file:
            self._check(file_no)

    def read_rows(self) -> dict[int, int]:
        """Rows read from each file whose end the readers reached."""
        with self._lock:
            return dict(self._read)

    def _check(self, file_no: int) -> None:
        with self._lock:
            rows = self._read.get(file_no)
            if rows is None or file_no in self._finished or self._trained[file_no] < rows:
                return
            self._finished.add(file_no)
        self._on_finished(file_no)

    @property
    def finished(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._finished)


Claim = Callable[[], "tuple[int, str] | None"]


class FileShare:
    """Which files one worker reads, pass after pass (what a dataset delegates to).

    ``begin_pass`` gives a pass's ``claim()`` (the static share or tickets on the shared
    store, less the files a resumed pass already finished) and, with a journal, the
    pass's :class:`TrainedTracker`; ``tracked`` reports a pass's consumed batches to it.
    """

    def __init__(self, files: tuple[str, ...], rank: int, world: int, *, stealing: bool,
                 journal: str | None, store, name: str, key: str | None = None,
                 lease: Lease | None = None) -> None:  # fmt: skip
        self._files, self._rank, self._world, self._stealing = files, rank, world, stealing
        if key is not None:
            self._key = f"{key}-{list_digest(files)}"
        else:
            self._key = dataset_key(files, rank) if stealing or journal else ""
        self._journal = None if journal is None else Journal(journal, rank, list_digest(files))
        self._store, self._name = store, name
        self._lease = lease
        self._queue: WorkQueue | None = None  # the latest pass's (stealing on a store)
        self._next_pass: int | None = None  # agreed on at the first pass (journal resume)
        self._skip: frozenset[int] = frozenset()  # finished files of the pass to resume
        self.read_files: list[int] = []  # file numbers read in the latest pass (readers add)
        self._tracker: TrainedTracker | None = None  # the latest pass's (with a journal)
        self._reported = False  # the next pass's trained rows come from trained_callback()

    def _shared_store(self):
        return self._store if self._store is not None else job_store()

    def begin_pass(self, static_share: Callable[[], list[tuple[int, str]]]):
        """``(claim, tracker)`` for a new pass; ``static_share()`` is ``files[rank::world]``."""
        if self._next_pass is None:
            mine = self._journal.latest() if self._journal is not None else (-1, [])
            store = self._shared_store() if self._journal is not None else None
            self._next_pass, self._skip = agree_on_resume(
                store, self._key, self._rank, self._world, mine, len(self._files)
            )
            if self._skip:
                log.info("%s: resuming pass %d, %d of %d files already finished",
                         self._name, self._next_pass, len(self._skip), len(self._files))  # fmt: skip
        pass_no, skip = self._next_pass, self._skip
        self._next_pass, self._skip = pass_no + 1, frozenset()
        self.read_files = []
        journal = self._journal
        self._tracker = (
            None if journal is None else TrainedTracker(lambda no: journal.finished(pass_no, no))
        )
        return self._claim(pass_no, skip, static_share), self._tracker

    def _claim(self, pass_no: int, skip: frozenset[int], static_share) -> Claim:
        files = self._files
        # one worker reads its share alone (the store is there in a job of one worker too)
        store = self._shared_store() if self._stealing and self._world > 1 else None
        if store is not None:
            namespace = f"sparseps/steal/{self._key}/{pass_no}"
            tickets = WorkQueue(store, namespace, len(files), skip, rank=self._rank,
                                lease=self._lease)  # fmt: skip
            self._queue = tickets

            def claim():
                no = tickets.claim()
                return None if no is None else (no, files[no])

            return claim
        if self._stealing and self._world > 1:
            log.warning("%s: split='steal' without a process group of workers: reading "
                        "files[rank::world] instead", self._name)  # fmt: skip
        todo: queue.SimpleQueue = queue.SimpleQueue()
        for item in static_share():
            if item[0] not in skip:
                todo.put(item)

        def claim_static():
            try:
                return todo.get_nowait()
            except queue.Empty:
                return None

        return claim_static

    def handed_out(self, file_no: int) -> None:
        """The consumer took the last chunk of ``file_no`` (with a lease: it is done)."""
        tickets = self._queue
        if tickets is not None:
            tickets.done(file_no)

    @property
    def taken_over(self) -> list[int]:
        """Files of the latest pass this worker took from dead workers (with a lease)."""
        return [] if self._queue is None else list(self._queue.taken_over)

    def trained_callback(self) -> Callable[[Batch], None]:
        self._reported = True
        return self._batch_trained

    def _batch_trained(self, batch: Batch) -> None:
        tracker = self._tracker
        if tracker is not None:
            tracker.trained(batch.ids)

    def tracked(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """``batches``, reporting consumed rows to the pass's tracker (with a journal)."""
        if self._journal is None:
            yield from batches
            return
        reported, self._reported = self._reported, False
        yielded: Counter[int] = Counter()
        for batch in batches:
            by_file = TrainedTracker.rows_by_file(batch.ids)
            yielded.update(by_file)
            yield batch
            if not reported and self._tracker is not None:  # the consumer came back
                self._tracker.add_trained(by_file)
        tracker = self._tracker
        if tracker is not None:  # rows a drop_last left out count as done
            dropped = {no: rows - yielded[no] for no, rows in tracker.read_rows().items()}
            tracker.add_trained({no: n for no, n in dropped.items() if n > 0})
