"""PushQueue and Prefetcher against fake clients and sources (no servers, no sockets)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from sparseps.errors import DeadlineError, RemoteError
from sparseps.worker.pipeline import Prefetcher, PushQueue


class _Done:
    def __init__(self, value=None):
        self.value = value

    def wait(self, timeout=None):
        return self.value


class FakeClient:
    """Records every push; ``gate`` (when cleared) holds pushes, ``fail`` makes them raise."""

    timeout = 5.0

    def __init__(self):
        self.calls: list[tuple] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail: BaseException | None = None

    def push(self, table, keys, grads, shows=None, clicks=None):
        self.started.set()
        assert self.gate.wait(10), "test forgot to open the gate"
        if self.fail is not None:
            raise self.fail
        self.calls.append((table, keys.copy(), grads.copy(), shows, clicks))
        return _Done()


def _sum_by_key(keys, values):
    uniq, inverse = np.unique(keys, return_inverse=True)
    out = np.zeros((uniq.size, *values.shape[1:]), np.float64)
    np.add.at(out, inverse, values)
    return dict(zip(uniq.tolist(), out.tolist(), strict=True))


def _held_queue(client, **kwargs) -> PushQueue:
    """A queue whose background thread is stuck in a first push (so later puts wait)."""
    client.gate.clear()
    q = PushQueue(client, **kwargs)
    q.put_sparse("t", np.array([99], np.uint64), np.ones((1, 2), np.float32))
    assert client.started.wait(5)
    return q


def test_queued_pushes_of_a_table_merge_and_their_same_key_grads_sum():
    client = FakeClient()
    q = _held_queue(client, maxsize=8)
    pushes = [
        (np.array([1, 2], np.uint64), np.array([[1, 1], [2, 2]], np.float32)),
        (np.array([2, 3], np.uint64), np.array([[10, 10], [3, 3]], np.float32)),
        (np.array([1], np.uint64), np.array([[100, 100]], np.float32)),
    ]
    for keys, grads in pushes:
        q.put_sparse("t", keys, grads)
    client.gate.set()
    q.flush()
    q.close()
    # the first push alone, then the three queued ones as one request
    assert [len(c[1]) for c in client.calls] == [1, 5]
    assert q.stats().merged_requests == 2 and q.stats().pushed_requests == 2
    table, keys, grads, shows, clicks = client.calls[1]
    assert table == "t" and _sum_by_key(keys, grads) == {
        1: [101.0, 101.0],
        2: [12.0, 12.0],
        3: [3.0, 3.0],
    }
    assert shows is None and clicks is None  # none given: the client's default (1 show)


def test_default_shows_and_clicks_fill_parts_that_gave_none():
    client = FakeClient()
    q = _held_queue(client)
    one = np.ones((2, 2), np.float32)
    q.put_sparse("t", np.array([1, 2], np.uint64), one)  # shows/clicks left to default
    q.put_sparse("t", np.array([2, 3], np.uint64), one, np.array([5, 6], np.float32),
                 np.array([1, 0], np.float32))  # fmt: skip
    q.put_sparse("u", np.array([7], np.uint64), one[:1])  # another table: its own request
    client.gate.set()
    q.flush()
    q.close()
    merged = {c[0]: c for c in client.calls[1:]}
    _, keys, _, shows, clicks = merged["t"]
    np.testing.assert_array_equal(keys, [1, 2, 2, 3])
    np.testing.assert_array_equal(shows, [1, 1, 5, 6])  # 1 show per key by default
    np.testing.assert_array_equal(clicks, [0, 0, 1, 0])
    assert merged["u"][3] is None and merged["u"][1].tolist() == [7]


def test_put_blocks_on_a_full_queue_then_times_out_naming_the_setting():
    client = FakeClient()
    q = _held_queue(client, maxsize=1, timeout=0.3, setting="Strategy.rpc_timeout")
    row = np.ones((1, 2), np.float32)
    q.put_sparse("t", np.array([1], np.uint64), row)  # fills the queue
    start = time.monotonic()
    with pytest.raises(DeadlineError, match="raise Strategy.rpc_timeout") as info:
        q.put_sparse("t", np.array([2], np.uint64), row)
    assert time.monotonic() - start >= 0.29
    assert info.value.setting == "Strategy.rpc_timeout" and info.value.op == "push"
    client.gate.set()
    q.flush()
    q.close()
    assert sorted(k for c in client.calls for k in c[1].tolist()) == [1, 99]


def test_flush_waits_until_every_push_is_applied():
    client = FakeClient()
    q = _held_queue(client)
    for key in range(3):
        q.put_sparse("t", np.array([key], np.uint64), np.ones((1, 2), np.float32))
    flushed = threading.Event()
    flusher = threading.Thread(target=lambda: (q.flush(), flushed.set()))
    flusher.start()
    assert not flushed.wait(0.3)  # pushes are held: flush must not return
    assert client.calls == []
    client.gate.set()
    assert flushed.wait(5)
    flusher.join()
    assert sorted(k for c in client.calls for k in c[1].tolist()) == [0, 1, 2, 99]
    q.close()


def test_flush_times_out_when_the_queue_makes_no_progress():
    client = FakeClient()
    q = _held_queue(client, timeout=0.3, setting="Strategy.rpc_timeout")
    with pytest.raises(DeadlineError, match="flush made no progress for 0 s") as info:
        q.flush()
    assert info.value.setting == "Strategy.rpc_timeout" and info.value.op == "flush"
    client.gate.set()
    q.flush()
    q.close()


def test_a_background_push_error_is_raised_in_the_caller():
    client = FakeClient()
    client.fail = RemoteError("push 't': server 0 raised InputError: NaN in grads", op="push")
    q = PushQueue(client)
    q.put_sparse("t", np.array([1], np.uint64), np.ones((1, 2), np.float32))
    with pytest.raises(RemoteError, match="NaN in grads"):
        q.flush()
    with pytest.raises(RemoteError, match="NaN in grads"):  # and on every later call
        q.put_sparse("t", np.array([2], np.uint64), np.ones((1, 2), np.float32))
    q.close()


def test_prefetcher_keeps_the_order():
    rng = np.random.default_rng(0)
    delays = rng.uniform(0, 0.005, 30)

    def prepare(x):
        time.sleep(delays[x])  # work of random length: items finish out of order
        return x * 2

    p = Prefetcher(range(30), prepare, depth=3, timeout=5)
    assert list(p) == [2 * x for x in range(30)]
    p.close()


@pytest.mark.parametrize("where", ["prepare", "source"])
def test_prefetcher_reraises_a_background_error_after_the_good_items(where):
    def source():
        for x in range(10):
            if where == "source" and x == 4:
                raise OSError("disk gone")
            yield x

    def prepare(x):
        if where == "prepare" and x == 4:
            raise OSError("disk gone")
        return x

    p = Prefetcher(source(), prepare, depth=2, timeout=5)
    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item in p:
            got.append(item)
    assert got == [0, 1, 2, 3]
    p.close()


def test_prefetcher_times_out_naming_the_setting():
    release = threading.Event()

    def slow():
        yield 1
        release.wait(60)  # the second item comes only when the test lets it
        yield 2

    p = Prefetcher(slow(), lambda x: x, timeout=0.2, setting="Strategy.collective_timeout")
    try:
        it = iter(p)
        assert next(it) == 1
        start = time.monotonic()
        with pytest.raises(DeadlineError, match="raise Strategy.collective_timeout") as info:
            next(it)
        # the 0.2 s limit, not the producer's 60 s wait (room for a loaded box)
        assert 0.19 <= time.monotonic() - start < 10
        assert info.value.setting == "Strategy.collective_timeout"
    finally:  # a failed check must not leave the producer waiting out its 60 s
        release.set()
        p.close()
