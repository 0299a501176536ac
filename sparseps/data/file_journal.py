"""Exactly-once and resume for file-based data: which files a pass finished, on disk.

With ``journal=DIR`` a dataset (static or stealing, :mod:`sparseps.data.steal`) records
the files whose rows were all trained, so that a job started again neither skips a file
it had not finished nor reads one it had.

An item (file) is *finished* once every row read from it has been trained: reported by
the :class:`~sparseps.worker.Trainer` after the step that applied its gradients (pushes
handed to the push queue, which sends them asynchronously and flushes them at the end of
the pass), or, when a plain loop iterates the dataset, once the consumer asked for the
batch after the one holding the file's last rows (:class:`TrainedTracker`). Each worker
appends ``{"key", "pass", "item"}`` lines for its finished files to
``DIR/worker-<rank>.jsonl`` (:class:`Journal`; keyed by the file list's digest; fsync per
line, before the file counts as finished). A job started again with the same ``journal``
agrees, through the store, on the latest pass any worker journaled
(:func:`agree_on_resume`): if the union of the files finished in it covers every file,
the next iteration is the pass after it; otherwise it is that pass again, and the files
already finished are skipped (no ticket gives them out). Guarantee: a finished file is
never read again in its pass; a file claimed but not finished at a crash is read again,
from its start, on resume (its rows trained before the crash are trained twice:
at-least-once inside one file, exactly-once for finished files). Passes are job-wide
sequential: a worker starts pass p+1 only after every worker has finished pass p (the
Trainer's end of pass reduces metrics over every worker, which is such a barrier).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path

import numpy as np

from .schema import ID_FILE_SHIFT

__all__ = ["Journal", "TrainedTracker", "agree_on_resume"]


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
