"""``Batcher``: concurrent ``/predict`` requests gathered into one model call.

The dynamic batching of TF Serving and Triton, for one service process. Requests parse
and check their bodies (on the event loop or a worker thread, :mod:`.app`) and hand what
they parsed (a payload of so many rows: the service's are Arrow tables) to
:meth:`Arrival.predict`; one thread takes what is queued and makes one call of ``run``
with the payloads of the requests on the same model (the service's concatenates the
tables, converts them to one batch, calls the model), and gives each request its own
rows of the answer.

A call is cut when it holds ``max_rows`` rows or when ``max_wait_s`` has passed since its
first request arrived, whichever comes first, and it does not wait at all when no other
request is on its way (every request the service has started reading is already queued):
a lone client pays no window. Nor does a call that already holds a quarter of
``max_rows`` (256 rows by default): the wait pays where a call's fixed cost is shared by
few rows; for large requests it only put them in step (two 512-row clients of one process
parsed together, then waited together for one 1,024-row call), where one request's
model call can run while the next is being read and parsed. While a call runs, the next requests queue, so under load
calls grow by themselves without any wait. A request of ``max_rows`` rows or more is a
call alone. (Large requests queued together still share a call, which shares the
conversion's and the model's fixed costs: a call for each 512-row request, tried, gave no
more rows/s at 4 clients, 34,000 against 48,000 on average over four alternating runs on
the loaded 2-core box, within its noise.)

A lone request (none queued, none in a call, no other being read) makes its call itself,
where it was parsed (:meth:`Arrival.alone`: on the parsing thread, or on the event loop
for a small JSON body on the process's only connection, :mod:`.predict_route`): the hand-off to the batcher's thread and back cost two
thread wake-ups, more than a 1-row model call on a busy machine. The calls of a process
still run one at a time: the batcher's thread waits for such a call to end.

Each request gets exactly what it would get alone: a call's rows are independent (the
lookups and the pooling are per row, the head is applied row-wise), tested bit-equal
against ``sparseps predict`` with concurrent clients (tests/serving/test_batching.py). If
the joint call fails (a model that predicts NaN for one request's row), each request of it
is run alone, so only the request at fault gets the error.

The queue is bounded (``max_queued`` requests): past it a request is refused with 503
rather than queued without end.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.closing import Closing
from .limits import RequestError

__all__ = ["Arrival", "Batcher", "BatcherStats"]

log = logging.getLogger(__name__)

# run(model, payloads) -> predictions [rows of every payload, in order]
ModelCall = Callable[[Any, list], np.ndarray]


@dataclass(frozen=True)
class BatcherStats:
    """Counts since start: model ``calls``, the ``requests`` and ``rows`` they answered,
    the largest call's rows, and what is ``queued`` now."""

    calls: int
    requests: int
    rows: int
    largest: int
    queued: int


@dataclass
class _Pending:
    model: Any
    payload: Any
    rows: int
    arrived: float
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class Arrival:
    """One request on its way to the batcher: counted from when the service starts reading
    it until it is queued or fails, so that a call waits for it (see the module)."""

    def __init__(self, batcher: Batcher) -> None:
        self._batcher = batcher
        self._open = True

    def __enter__(self) -> Arrival:
        return self

    def __exit__(self, *exc: object) -> None:
        self.done()

    def done(self) -> None:
        if self._open:
            self._open = False
            self._batcher._arrived(queued=None)

    def alone(self, model: Any, payload: Any, rows: int) -> np.ndarray | None:
        """The predictions for ``payload`` from a call made here and now, when this is
        the only request in the process (none queued, in a call or being read); None
        otherwise, and the request is still on its way (then :meth:`predict`)."""
        if not self._batcher._claim():
            return None
        self._open = False
        return self._batcher._call_here(model, payload, rows)

    async def predict(self, model: Any, payload: Any, rows: int) -> np.ndarray:
        """The model's predictions for ``payload`` (``rows`` rows), from a call shared
        with other requests."""
        self._open = False
        return await self._batcher._submit(model, payload, rows)


class Batcher(Closing):
    """Gathers requests into model calls (see the module docstring).

    Args:
        run: ``run(model, payloads) -> predictions``, the model call.
        max_rows: rows a call gathers at most (a larger request is a call alone).
        max_wait_s: the longest a request waits for others to join its call.
        max_queued: requests queued at most; past it a request gets 503.
    """

    def __init__(
        self, run: ModelCall, *, max_rows: int, max_wait_s: float, max_queued: int = 4096
    ) -> None:
        self._run = run
        self.max_rows = max_rows
        self.max_wait_s = max_wait_s
        self.max_queued = max_queued
        self.enough_rows = max(1, max_rows // 4)  # a call this large does not wait for more
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._arriving = 0
        self._busy = False  # a call is running (the batcher's, or a lone request's)
        self._lock = threading.Condition()
        self._closed = False
        self._calls = self._requests = self._rows = self._largest = 0
        self._thread = threading.Thread(target=self._loop, name="predict-batcher", daemon=True)
        self._thread.start()

    def arrival(self) -> Arrival:
        """Count a request from the start of its reading (use as a context manager)."""
        with self._lock:
            self._arriving += 1
        return Arrival(self)

    def _arrived(self, queued: _Pending | None) -> None:
        with self._lock:
            self._arriving -= 1
            if queued is not None:
                self._queue.append(queued)
                self._queued_rows += queued.rows
            self._lock.notify()

    def _claim(self) -> bool:
        """Whether the one request being read may call the model itself (it is no longer
        counted as on its way then)."""
        with self._lock:
            if self._busy or self._queue or self._arriving != 1 or self._closed:
                return False
            self._busy = True
            self._arriving = 0
            return True

    def _call_here(self, model: Any, payload: Any, rows: int) -> np.ndarray:
        """A claimed call (:meth:`_claim`) on the caller's thread."""
        try:
            predictions = self._run(model, [payload])
            self._count(rows, 1)
            return predictions
        finally:
            with self._lock:
                self._busy = False
                if self._queue or self._closed:  # the batcher's thread waits for this call
                    self._lock.notify()

    def _count(self, rows: int, requests: int) -> None:
        self._calls += 1
        self._requests += requests
        self._rows += rows
        self._largest = max(self._largest, rows)

    async def _submit(self, model: Any, payload: Any, rows: int) -> np.ndarray:
        loop = asyncio.get_running_loop()
        if len(self._queue) >= self.max_queued:
            self._arrived(queued=None)
            raise RequestError(
                503, f"service: {self.max_queued} requests already queued; retry shortly"
            )
        future = loop.create_future()
        self._arrived(_Pending(model, payload, rows, time.monotonic(), future, loop))
        return await future

    def stats(self) -> BatcherStats:
        with self._lock:
            queued = len(self._queue)
        return BatcherStats(self._calls, self._requests, self._rows, self._largest, queued)

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the queued requests are answered."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout)

    def _take(self) -> list[_Pending]:
        """The requests of the next call (empty: closed), waiting as the module says."""
        with self._lock:
            while (not self._queue or self._busy) and not self._closed:
                self._lock.wait()
            while self._busy:  # closing: a lone request's call ends first
                self._lock.wait()
            if not self._queue:
                return []
            deadline = self._queue[0].arrived + self.max_wait_s
            while self._queued_rows < self.enough_rows and self._arriving > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            taken = [self._queue.popleft()]
            rows = taken[0].rows
            while self._queue and rows + self._queue[0].rows <= self.max_rows:
                rows += self._queue[0].rows
                taken.append(self._queue.popleft())
            self._queued_rows -= rows
            self._busy = True
            return taken

    def _loop(self) -> None:
        while taken := self._take():
            # one call per model: requests that started before a reload keep their model
            by_model: dict[int, list[_Pending]] = {}
            for pending in taken:
                by_model.setdefault(id(pending.model), []).append(pending)
            try:
                for group in by_model.values():
                    self._call(group)
            finally:
                with self._lock:
                    self._busy = False

    def _call(self, group: list[_Pending]) -> None:
        try:
            predictions = self._run(group[0].model, [p.payload for p in group])
        except Exception as exc:
            if len(group) == 1:
                _deliver([(group[0], exc)])
                return
            for pending in group:  # one request's fault must not fail the others
                self._call([pending])
            return
        self._count(sum(p.rows for p in group), len(group))
        answers, start = [], 0
        for pending in group:
            answers.append((pending, predictions[start : start + pending.rows]))
            start += pending.rows
        by_loop: dict[int, list[tuple[_Pending, np.ndarray | BaseException]]] = {}
        for pending, answer in answers:
            by_loop.setdefault(id(pending.loop), []).append((pending, answer))
        for delivered in by_loop.values():  # one wake-up of each loop for all its answers
            _deliver(delivered)


def _deliver(answers: list[tuple[_Pending, np.ndarray | BaseException]]) -> None:
    """Settle the futures of ``answers`` (of requests on one event loop) on their loop."""

    def settle() -> None:
        for pending, result in answers:
            if pending.future.done():  # the client went away and the request was cancelled
                continue
            if isinstance(result, BaseException):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)

    try:
        answers[0][0].loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: the service is stopping
        log.debug("answers for a stopped event loop were dropped")
