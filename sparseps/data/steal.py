"""Which files a worker reads, pass after pass: a static share or work stealing.

With ``split="static"`` (the default) worker ``rank`` of ``world`` reads
``files[rank::world]``, so a worker that is 3x slower than the others sets the pace of the
pass. ``split="none"`` gives every worker every file (a Paddle job that does not split its
file list with ``fleet.util.get_file_shard``). With ``split="steal"`` every worker's reader threads take the next file of the pass
from one queue shared by the job, so a slow worker simply takes fewer files.

This module is the worker's side: :class:`FileShare`, what a dataset delegates to, gives
each pass a ``claim()`` of the next file and reports the files consumed. It builds on two
concepts that each have their module: the queue on the job's store that hands out the
files by ticket, with leases that move a dead worker's files to the others
(:mod:`sparseps.data.work_queue`), and the journal of finished files that gives
exactly-once and resume (``journal=DIR``, :mod:`sparseps.data.file_journal`, which states
the exact guarantee). Their names stay importable from here.

The queue's keys are namespaced by dataset and pass
(``sparseps/steal/<dataset>/<pass>/next``), so two datasets, or two passes of one, never
share a counter; ``<dataset>`` is a digest of the sorted file list plus how many stealing
datasets over the same list this worker made before (workers build their datasets in
the same order, as they already must for every collective).

Pacing: a worker's reader claims a file only when its consumer has taken every batch of
the previous one (a permit per reader thread, handed back by the consumer), so the files
a worker holds and has not handed out are at most ``threads``; a trainer's prefetch adds
a couple of batches. Claiming ahead of that would let a slow worker hoard files, which
is what stealing is meant to prevent. Granularity is one file: split a big file into
several to balance finer.

Without a store (no process group: local mode, or ``rank``/``world`` given by hand) a
stealing dataset reads what a static one would: everything with ``world=1``,
``files[rank::world]`` otherwise (with a warning), never a file twice.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from enum import StrEnum

from ..core import worker_store
from ..errors import ConfigError
from .file_journal import Journal, TrainedTracker, agree_on_resume
from .schema import Batch
from .work_queue import Heartbeat, Lease, WorkQueue

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
    NONE = "none"  # every worker reads every file (Paddle without get_file_shard)


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
