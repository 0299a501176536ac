"""Push merging (sparseps.worker.push_merge) and the merging PushQueue, without servers."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from sparseps import Async, Hybrid
from sparseps.config import TableConfig
from sparseps.errors import ConfigError
from sparseps.optim import Adagrad
from sparseps.table import SparseTable
from sparseps.testing import FakeClock
from sparseps.worker.pipeline import PushQueue
from sparseps.worker.push_merge import MergePolicy, PushMerger, merge_pushes


def _pushes(seed: int, count: int, dim: int = 3) -> list[tuple]:
    """``count`` pushes over a small key range (many keys repeat, within and across)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(1, 40))
        keys = rng.integers(0, 25, n).astype(np.uint64)
        grads = rng.normal(0, 1, (n, dim)).astype(np.float32)
        shows = rng.integers(1, 3, n).astype(np.float32) if rng.random() < 0.5 else None
        clicks = rng.integers(0, 2, n).astype(np.float32) if rng.random() < 0.5 else None
        out.append((keys, grads, shows, clicks))
    return out


def test_merged_pushes_equal_their_sum_applied_as_one():
    parts = _pushes(1, 6)
    keys, grads, shows, clicks = merge_pushes(parts)
    # oracle: a plain per-key sum in push order
    expect: dict[int, list] = {}
    for k, g, s, c in parts:
        for i, key in enumerate(k.tolist()):
            row = expect.setdefault(key, [np.zeros(3, np.float32), 0.0, 0.0])
            row[0] = row[0] + g[i]
            row[1] += 1.0 if s is None else float(s[i])
            row[2] += 0.0 if c is None else float(c[i])
    assert keys.tolist() == sorted(expect)
    np.testing.assert_allclose(grads, np.stack([expect[k][0] for k in sorted(expect)]), atol=1e-5)
    np.testing.assert_array_equal(shows, [expect[k][1] for k in sorted(expect)])
    np.testing.assert_array_equal(clicks, [expect[k][2] for k in sorted(expect)])
    # the merged push and all the parts in one push (a table sums repeats) give the same
    # rows, optimizer state and counters, bit for bit
    config = TableConfig(name="t", dim=3, rule=Adagrad(lr=0.1))
    merged_table, one_push = SparseTable(config), SparseTable(config)
    merged_table.push(keys, grads, shows, clicks)
    every = merge_inputs(parts)
    one_push.push(*every)
    a, b = merged_table.export_rows(), one_push.export_rows()
    assert sorted(a) == sorted(b) and len(a["key"]) == len(keys)
    order_a, order_b = np.argsort(a["key"]), np.argsort(b["key"])
    for column in a:
        np.testing.assert_array_equal(a[column][order_a], b[column][order_b], err_msg=column)


def merge_inputs(parts):
    """Every part concatenated, defaults filled in (what one client push would send)."""
    keys = np.concatenate([p[0] for p in parts])
    grads = np.concatenate([p[1] for p in parts])
    shows = np.concatenate(
        [np.ones(len(p[0]), np.float32) if p[2] is None else p[2] for p in parts]
    )
    clicks = np.concatenate(
        [np.zeros(len(p[0]), np.float32) if p[3] is None else p[3] for p in parts]
    )
    return keys, grads, shows, clicks


class _Done:
    def wait(self, timeout=None):
        return None


class RecordingClient:
    timeout = 5.0

    def __init__(self):
        self.calls: list[tuple] = []
        self.sent = threading.Event()

    def push(self, table, keys, grads, shows=None, clicks=None):
        self.calls.append((table, keys.copy(), grads.copy(), shows, clicks))
        self.sent.set()
        return _Done()

    push_delta = push


def test_window_fills_then_one_merged_push_per_table():
    client = RecordingClient()
    queue = PushQueue(client, maxsize=16, merge=MergePolicy(window=3, auto=False, deadline_s=30))
    parts = _pushes(2, 3)
    try:
        for keys, grads, shows, clicks in parts[:2]:
            queue.put_sparse("t", keys, grads, shows, clicks)
        assert not client.sent.wait(0.2)  # two of three steps held: nothing sent
        assert client.calls == []
        queue.put_sparse("t", *parts[2])
        assert client.sent.wait(5)
        queue.flush()
    finally:
        queue.close()
    assert len(client.calls) == 1
    table, keys, grads, shows, clicks = client.calls[0]
    want = merge_pushes(parts)
    np.testing.assert_array_equal(keys, want[0])
    np.testing.assert_array_equal(grads, want[1])
    np.testing.assert_array_equal(shows, want[2])
    stats = queue.stats()
    assert stats.held_rows == sum(len(p[0]) for p in parts) > stats.sent_rows == len(want[0])


def test_deadline_sends_what_is_held_and_flush_does_not_wait_for_it():
    client = RecordingClient()
    queue = PushQueue(client, merge=MergePolicy(window=100, auto=False, deadline_s=0.3))
    keys, grads, shows, clicks = _pushes(3, 1)[0]
    try:
        start = time.monotonic()
        queue.put_sparse("t", keys, grads, shows, clicks)
        assert client.sent.wait(10)  # the window never fills: the deadline sends it
        assert time.monotonic() - start >= 0.3 - 0.01
        assert len(client.calls) == 1
        slow = PushQueue(client, merge=MergePolicy(window=100, auto=False, deadline_s=60))
        try:
            slow.put_sparse("u", keys, grads, shows, clicks)
            start = time.monotonic()
            slow.flush()  # sends now, not after 60 s
            assert time.monotonic() - start < 10
            assert [c[0] for c in client.calls] == ["t", "u"]
        finally:
            slow.close()
    finally:
        queue.close()


def test_auto_window_from_measured_latency_and_step_interval():
    clock = FakeClock()
    merger = PushMerger(MergePolicy(window=8, auto=True), clock=clock)
    assert merger.window == 1  # nothing measured yet: every step goes out
    for _ in range(20):  # a step every 10 ms (the second table does not count)
        merger.note_step("deep")
        merger.note_step("wide")
        clock.advance(0.010)
    merger.note_send(0.030)
    assert merger.window == 6  # ceil(2 * 30 ms / 10 ms)
    for _ in range(50):
        merger.note_send(0.002)  # the servers got fast: no holding
    assert merger.window == 1
    for _ in range(50):
        merger.note_send(1.0)  # very slow servers: capped at the policy's window
    assert merger.window == 8
    # the deadline: twice the window's steps at the measured interval, at least 50 ms
    assert merger.deadline_s == pytest.approx(2 * 8 * 0.010)
    fixed = PushMerger(MergePolicy(window=5, auto=False, deadline_s=0.05), clock=clock)
    assert fixed.window == 5
    # the deadline counts from the first held push
    fixed.add(("t", False, np.ones(1, np.uint64), np.ones((1, 1), np.float32), None, None))
    clock.now += 0.04
    assert not fixed.due() and fixed.time_left() == pytest.approx(0.01)
    clock.now += 0.011
    assert fixed.due()


def test_mode_push_merge_knobs():
    assert Async().merge_policy() is None
    assert Async(push_merge="auto", push_merge_window=4).merge_policy() == MergePolicy(4, True)
    assert PushMerger(MergePolicy(4, False)).deadline_s == 0.05  # no interval measured yet
    assert Async(push_merge="on").merge_policy() == MergePolicy(8, False)
    assert Hybrid().merge_policy(MergePolicy(2, False)) == MergePolicy(2, False)
    assert Hybrid(push_merge="off").merge_policy(MergePolicy(2, False)) is None
    with pytest.raises(ConfigError, match="Async.push_merge"):
        Async(push_merge="yes")
    with pytest.raises(ConfigError, match="Hybrid.push_merge_window"):
        Hybrid(push_merge="on", push_merge_window=0)
