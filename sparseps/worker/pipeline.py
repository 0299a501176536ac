"""Overlap of IO, compute and communication on a worker.

- :class:`Prefetcher` runs ``prepare(item)`` for the next items of an iterable in a
  background thread (read + parse + dedup + pull of batch i+1 while batch i computes),
  through a bounded queue.
- :class:`PushQueue` sends pushes from a background thread, through a bounded queue;
  pushes of the same table waiting in the queue are merged into one request (the client
  merges duplicate keys), and :meth:`PushQueue.flush` waits until every push is applied.
  With a :class:`~sparseps.worker.push_merge.MergePolicy` it also holds pushes over a
  window of steps and sends them merged (:mod:`.push_merge`).

Both re-raise a background failure in the calling thread at the next call, so an error
is never lost in a thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from ..core.closing import Closing
from ..errors import DeadlineError
from .push_merge import MergePolicy, PushMerger

__all__ = ["PushQueue", "PushStats", "Prefetcher"]

log = logging.getLogger(__name__)

_END = object()
_FLUSH = object()  # merging queue: send what is held now


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Prefetcher(Closing):
    """Iterate ``prepare(x) for x in source`` with ``depth`` items computed ahead.

    Args:
        source: any iterable (a dataset).
        prepare: runs in the background thread; its result is what iteration yields.
        depth: how many prepared items may wait (the queue bound).
        timeout: seconds to wait for one item before raising (a hung reader or server).
        setting: the name of the setting that changes ``timeout``, for its error message.
    """

    def __init__(
        self,
        source: Iterable,
        prepare: Callable,
        *,
        depth: int = 2,
        timeout: float = 600.0,
        setting: str = "Prefetcher(timeout=...)",
    ):
        self._source = source
        self._prepare = prepare
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._timeout = timeout
        self._setting = setting
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparseps-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put(self._prepare(item)):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._put(_Failure(exc))
            return
        self._put(_END)

    def __iter__(self) -> Iterator:
        while True:
            try:
                item = self._queue.get(timeout=self._timeout)
            except queue.Empty:
                raise DeadlineError(
                    f"prefetch: no batch ready after {self._timeout:.0f} s (a data reader or a "
                    f"server pull is stuck); raise {self._setting} to wait longer",
                    op="prefetch",
                    role="worker",
                    seconds=self._timeout,
                    setting=self._setting,
                ) from None
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class PushStats:
    pushed_requests: int
    merged_requests: int
    pending: int
    push_seconds: float
    held_rows: int = 0  # merging: rows put, and rows sent after merging them
    sent_rows: int = 0


class PushQueue(Closing):
    """Background pushes with a bounded queue and per-table merging.

    Args:
        client: a ``PSClient``.
        maxsize: most queued push batches before ``put`` blocks (back-pressure).
        timeout: seconds ``put`` may block on a full queue, and ``flush`` may wait
            without the queue making progress (the trainer passes ``Strategy.rpc_timeout``
            or the client's timeout: a queue that stops draining means a server stopped
            answering pushes).
        setting: the name of the setting that changes ``timeout``, for its error message.
        merge: hold pushes over a window of steps and send them merged (None: send
            what is queued as soon as the previous send is done).
    """

    def __init__(
        self,
        client,
        *,
        maxsize: int = 8,
        timeout: float = 60.0,
        setting: str = "PushQueue(timeout=...)",
        merge: MergePolicy | None = None,
    ) -> None:
        self._client = client
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self._timeout = timeout
        self._setting = setting
        self._error: BaseException | None = None
        self._pushed = 0
        self._merged = 0
        self._seconds = 0.0
        self._closed = False
        self._merger = None if merge is None else PushMerger(merge)
        run = self._run if merge is None else self._run_merging
        self._thread = threading.Thread(target=run, name="sparseps-push", daemon=True)
        self._thread.start()

    def put_sparse(
        self, table: str, keys, grads, shows=None, clicks=None, *, delta: bool = False
    ) -> None:
        if self._merger is not None:
            self._merger.note_step(table)
        self._put((table, delta, keys, grads, shows, clicks))

    def _put(self, item) -> None:
        self._raise_if_failed()
        try:
            self._queue.put(item, timeout=self._timeout)
        except queue.Full:
            raise DeadlineError(
                f"push queue: full for {self._timeout:.0f} s (servers are not taking pushes; "
                f"see the server logs, or raise {self._setting})",
                op="push",
                role="server",
                seconds=self._timeout,
                setting=self._setting,
            ) from None

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _drain(self, first) -> list:
        items = [first]
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _END:
                self._queue.task_done()
                return
            items = self._drain(item)
            done = [i for i in items if i is not _END]
            try:
                if self._error is None:
                    self._send(done)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                self._error = exc
                log.error("background push failed: %s", exc)
            finally:
                for _ in items:
                    self._queue.task_done()
            if len(done) != len(items):
                return

    def _run_merging(self) -> None:
        merger, held = self._merger, 0  # held: queue items not yet task_done
        assert merger is not None  # this loop runs only for a merging queue
        while True:
            wait = merger.time_left()
            try:
                item = self._queue.get(timeout=wait) if wait != 0.0 else self._queue.get_nowait()
            except queue.Empty:  # the deadline of what is held passed
                item = None
            items = [] if item is None else self._drain(item)
            held += len(items)
            end = any(i is _END for i in items)
            for i in items:
                if i is not _END and i is not _FLUSH:
                    merger.add(i)
            if held and (end or merger.due() or any(i is _FLUSH for i in items)):
                try:
                    merged = merger.take()
                    if self._error is None and merged:
                        start = time.perf_counter()
                        self._send(merged)
                        merger.note_send(time.perf_counter() - start)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                    self._error = exc
                    log.error("background push failed: %s", exc)
                finally:
                    for _ in range(held):
                        self._queue.task_done()
                    held = 0
            if end:
                return

    def _send(self, items: list) -> None:
        start = time.perf_counter()
        groups: dict[tuple, list] = {}
        for item in items:
            groups.setdefault(item[:2], []).append(item[2:])
        handles = []
        for (name, delta), parts in groups.items():
            self._merged += len(parts) - 1
            keys = np.concatenate([p[0] for p in parts])
            grads = np.concatenate([p[1] for p in parts])
            shows = _concat_optional([p[2] for p in parts], [len(p[0]) for p in parts], 1.0)
            clicks = _concat_optional([p[3] for p in parts], [len(p[0]) for p in parts], 0.0)
            send = self._client.push_delta if delta else self._client.push
            handles.append(send(name, keys, grads, shows=shows, clicks=clicks))
        for handle in handles:
            handle.wait()
        self._pushed += len(handles)
        self._seconds += time.perf_counter() - start

    def flush(self) -> None:
        """Block until every queued push has been applied by the servers.

        Raises:
            DeadlineError: the queue made no progress for ``timeout`` seconds (a long
                queue of slow pushes is fine as long as they keep completing).
            the background failure of an earlier push, if one failed.
        """
        if self._merger is not None and self._queue.unfinished_tasks:
            self._put(_FLUSH)  # what is held goes now, not at its deadline
        left = self._queue.unfinished_tasks
        deadline = time.monotonic() + self._timeout
        while left:
            self._raise_if_failed()
            now = time.monotonic()
            if self._queue.unfinished_tasks < left:
                left, deadline = self._queue.unfinished_tasks, now + self._timeout
            elif now > deadline:
                raise DeadlineError(
                    f"push queue: flush made no progress for {self._timeout:.0f} s "
                    f"({left} pushes pending; see the server logs, or raise {self._setting})",
                    op="flush",
                    role="server",
                    seconds=self._timeout,
                    setting=self._setting,
                )
            time.sleep(0.001)
        self._raise_if_failed()

    def stats(self) -> PushStats:
        merger = self._merger
        return PushStats(
            self._pushed, self._merged, self._queue.qsize(), self._seconds,
            held_rows=0 if merger is None else merger.held_rows,
            sent_rows=0 if merger is None else merger.sent_rows,
        )  # fmt: skip

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(_END, timeout=5)
        except queue.Full:  # pragma: no cover - thread is wedged; daemon dies with us
            return
        self._thread.join(timeout=10)


def _concat_optional(parts, lengths, fill: float):
    if all(p is None for p in parts):
        return None
    return np.concatenate(
        [
            np.full(n, fill, np.float32) if p is None else np.asarray(p, np.float32)
            for p, n in zip(parts, lengths, strict=True)
        ]
    )
