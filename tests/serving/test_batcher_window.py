"""The batcher's window in process (real threads and an event loop, no service): a small
call waits for a request on its way and shares one model call with it; a call that
already holds a quarter of ``max_rows`` does not wait (issue 60: two 512-row clients of
one process were put in step by the wait); the process's only request calls the model
itself, where it was parsed."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from sparseps.serving.batcher import Batcher, BatcherStats

WAIT_S = 5.0  # the window: far longer than either case may take


def recording_batcher(calls: list[list[int]]) -> Batcher:
    def run(model: object, payloads: list) -> np.ndarray:
        calls.append([len(p) for p in payloads])
        return np.concatenate(payloads).astype(np.float32)

    return Batcher(run, max_rows=1024, max_wait_s=WAIT_S)


def test_a_small_call_waits_for_a_request_on_its_way():
    calls: list[list[int]] = []
    batcher = recording_batcher(calls)

    async def main() -> tuple[np.ndarray, np.ndarray]:
        later = batcher.arrival()  # being read: the small call waits for it
        first = asyncio.create_task(batcher.arrival().predict(None, np.arange(10.0), 10))
        await asyncio.sleep(0.3)
        assert not first.done()
        second = await later.predict(None, np.arange(10.0, 20.0), 10)
        return await first, second

    try:
        first, second = asyncio.run(main())
    finally:
        batcher.close()
    assert calls == [[10, 10]]  # one call for both
    np.testing.assert_array_equal(first, np.arange(10.0))
    np.testing.assert_array_equal(second, np.arange(10.0, 20.0))
    assert batcher.stats().calls == 1 and batcher.stats().largest == 20


def test_a_call_of_a_quarter_of_max_rows_does_not_wait():
    calls: list[list[int]] = []
    batcher = recording_batcher(calls)
    assert batcher.enough_rows == 256

    async def main() -> float:
        on_its_way = batcher.arrival()  # never queued while the large one is answered
        start = time.monotonic()
        got = await batcher.arrival().predict(None, np.ones(300), 300)
        np.testing.assert_array_equal(got, np.ones(300))
        on_its_way.done()
        return time.monotonic() - start

    try:
        took = asyncio.run(main())
    finally:
        batcher.close()
    assert calls == [[300]] and took < WAIT_S / 2, took


def test_a_lone_request_calls_the_model_where_it_is():
    """The process's only request makes its call on its own thread (no hand-off to the
    batcher's thread and back); with another on its way it queues and shares a call."""
    threads: list[int] = []

    def run(model: object, payloads: list) -> np.ndarray:
        threads.append(threading.get_ident())
        return np.concatenate(payloads).astype(np.float32)

    batcher = Batcher(run, max_rows=1024, max_wait_s=WAIT_S)
    try:
        got = batcher.arrival().alone(None, np.arange(3.0), 3)
        np.testing.assert_array_equal(got, np.arange(3.0))
        assert threads == [threading.get_ident()]
        assert batcher.stats() == BatcherStats(calls=1, requests=1, rows=3, largest=3, queued=0)

        later, mine = batcher.arrival(), batcher.arrival()
        assert mine.alone(None, np.arange(3.0), 3) is None  # `later` is on its way

        async def both() -> list[np.ndarray]:
            return list(
                await asyncio.gather(
                    mine.predict(None, np.arange(3.0), 3), later.predict(None, np.ones(2), 2)
                )
            )

        first, second = asyncio.run(both())
    finally:
        batcher.close()
    np.testing.assert_array_equal(first, np.arange(3.0))
    np.testing.assert_array_equal(second, np.ones(2))
    assert len(threads) == 2 and threads[1] != threading.get_ident()  # the batcher's
    assert batcher.stats().calls == 2 and batcher.stats().largest == 5  # one call for both
