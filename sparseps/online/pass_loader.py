"""The background load of one pass's data on one worker.

A thread waits for the pass's done-markers (up to ``data.wait_timeout_s``), then loads this
worker's share into memory, so the next pass loads while the current one trains
(``data.preload``). It records how long that took; the driver takes the result with a
deadline. A load started for a membership that has since changed is discarded: its share
was cut for the old workers (:mod:`sparseps.online.membership`).

:class:`PrepareNext` hands a loaded next pass to the trainer while the current one trains
(``Trainer.prefetch_pass``: the GPUPS pipeline reads its keys and pulls its rows then;
the other modes do nothing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DeadlineError
from .layout import DataLayout, PassId

if TYPE_CHECKING:
    from ..data import InMemoryDataset

__all__ = ["PassLoader", "PrepareNext"]


class PassLoader:
    """Waits for a pass's done-markers, then loads this worker's share, in a thread."""

    def __init__(
        self,
        layout: DataLayout,
        pass_id: PassId,
        make_dataset: Callable[[list[Path]], InMemoryDataset],
        version: int = 0,
    ) -> None:
        self.pass_id = pass_id
        self.version = version  # the membership it loads a share for
        self.seconds = 0.0  # wait for the markers + load, set when the thread ends
        self._result: tuple[list[Path], InMemoryDataset] | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._done = self._dropped = False
        self._thread = threading.Thread(
            target=self._run, args=(layout, make_dataset), name=f"online-load-{pass_id.seq}",
            daemon=True,
        )  # fmt: skip
        self._thread.start()

    def _run(
        self, layout: DataLayout, make_dataset: Callable[[list[Path]], InMemoryDataset]
    ) -> None:
        start = time.perf_counter()
        try:
            folders = layout.wait_ready(self.pass_id)
            dataset = make_dataset(folders)
            dataset.load_into_memory()
            self._result = (folders, dataset)
        except BaseException as exc:  # re-raised in get()
            self._error = exc
        self.seconds = time.perf_counter() - start
        with self._lock:
            self._done = True
            if self._dropped:
                self._release()

    def discard(self) -> None:
        """Nobody will take this load (the workers changed): free it once it is done,
        without waiting for it (it may still wait for its pass's done-markers)."""
        with self._lock:
            self._dropped = True
            if self._done:
                self._release()

    def _release(self) -> None:
        if self._result is not None:
            self._result[1].release_memory()
            self._result = None

    def ready(self) -> InMemoryDataset | None:
        """The loaded dataset if the load is done and succeeded (never waits); else None."""
        with self._lock:
            if not self._done or self._dropped or self._result is None:
                return None
            return self._result[1]

    def get(self, timeout: float) -> tuple[list[Path], InMemoryDataset]:
        """``(folders, dataset)`` once loaded; raises the loader's error."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise DeadlineError(
                f"pass {self.pass_id}: loading its data took more than {timeout:.0f} s",
                op="load_pass", seconds=timeout, setting="data.wait_timeout_s / job.collective_timeout_s",
            )  # fmt: skip
        if self._error is not None:
            raise self._error
        assert self._result is not None, "the thread ended without an error, so it loaded"
        return self._result


class PrepareNext:
    """``on_batch`` hook of a training pass: the first batch after the next pass's data is
    loaded hands it to ``prepare`` (``Trainer.prefetch_pass``), once, on the training
    thread. Not a collective: each worker hands its share over when its load is done, and
    a worker whose load ends after the pass builds the next pass unprepared (GPUPS agrees
    on it at the pass's end).

    Args:
        loader: the next pass's loader.
        prepare: called with the loaded dataset.
    """

    def __init__(self, loader: PassLoader, prepare: Callable[[InMemoryDataset], None]) -> None:
        self._loader, self._prepare = loader, prepare
        self.handed = False

    def __call__(self, step, stats) -> None:
        if self.handed:
            return
        dataset = self._loader.ready()
        if dataset is not None:
            self.handed = True
            self._prepare(dataset)
