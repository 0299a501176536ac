"""Replies are read by the threads that wait for them (sparseps/rpc/channel_receive.py).

The client's I/O thread also sweeps the sockets once per poll round, which would hide a
waiter that never gets its turn to read (a lost hand-over) behind a 50 ms delay. These
tests stretch that round to 60 s: every reply must then reach its waiter through the
waiting threads themselves, or through ``Handle.done`` and the in-flight slots, which read
what arrived; a broken hand-over shows as a DeadlineError within the tests' timeout
(``WAIT_S``, far under the sweep's 60 s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.core.routing import server_of
from sparseps.rpc import channel
from sparseps.rpc.client import PSClient
from sparseps.testing import local_cluster, wait_until

pytestmark = pytest.mark.timeout(120)

DIM = 4
KEYS = np.arange(1, 20_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15 >> 8)
DENSE = np.arange(64, dtype=np.float32)
# The tests' wait (and RPC) timeout. A reply that is read comes in milliseconds; a loaded
# box may stretch that to seconds, so the bounds below are WAIT_S / 2: a waiter that is
# never handed the reading only returns at its deadline, WAIT_S after it began.
WAIT_S = 20.0


@pytest.fixture(scope="module")
def servers():
    with local_cluster(2, timeout=60) as cluster:
        with PSClient(cluster.endpoints, timeout=30) as setup:
            setup.create_table(TableConfig(name="emb", dim=DIM, rule=optim.SGD(lr=1.0), seed=3))
            # every row's values name its key: row of key k is -(k % 997) + [0, 1, 2, 3]
            grads = (KEYS % np.uint64(997)).astype(np.float32)[:, None] + np.zeros(DIM, np.float32)
            setup.push("emb", KEYS, grads - np.arange(DIM, dtype=np.float32)).wait()
            expected = setup.pull("emb", KEYS).wait()
            setup.create_dense("head", 64, optim.SGD(lr=1.0), init=DENSE)
        yield cluster.endpoints, expected, [p.pid for p in cluster.processes]


@pytest.fixture
def no_sweep(monkeypatch):
    """The I/O thread's poll round (and so its sweep for unclaimed replies) at 60 s."""
    monkeypatch.setattr(channel, "_POLL_MS", 60_000)


@contextlib.contextmanager
def _paused(pids):
    """Servers stopped with SIGSTOP (their replies wait), continued on leaving."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_threads_waiting_at_once_each_get_their_own_replies(servers, no_sweep):
    endpoints, expected, _ = servers
    errors: list[BaseException] = []
    checked = [0] * 6

    def work(index: int, client: PSClient) -> None:
        rng = np.random.default_rng(index)
        try:
            handles = []
            for step in range(40):
                picks = rng.integers(0, len(KEYS), 50 + 10 * index)
                handles.append((picks, client.pull("emb", KEYS[picks])))
                if len(handles) > 2 or step == 39:  # up to 3 in flight per thread
                    while handles:
                        picks, handle = handles.pop(0)
                        np.testing.assert_array_equal(handle.wait(timeout=WAIT_S), expected[picks])
                        checked[index] += 1
        except BaseException as exc:  # reported below: a thread's failure fails the test
            errors.append(exc)

    with PSClient(endpoints, timeout=WAIT_S) as client:
        threads = [threading.Thread(target=work, args=(i, client)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not errors, errors[0]
    assert checked == [40] * 6


def test_threads_waiting_for_one_handle_all_get_the_values(servers, no_sweep):
    # (a dense pull: its handle lets threads wait at once; a sparse pull's takes turns)
    # A thread that is never woken still returns at its deadline (the reply was delivered
    # meanwhile), WAIT_S after it began: every thread must return well before that.
    endpoints, _, pids = servers
    got: list[tuple[np.ndarray, float]] = []
    with PSClient(endpoints, timeout=WAIT_S) as client:
        # A client's first request to a server on its host first asks it for reply slots
        # (op attach_replies, sparseps/rpc/reply_slots.py) and waits for the answer: sent
        # to a stopped server, that waited out the whole timeout before the pull went.
        np.testing.assert_array_equal(client.pull_dense("head").wait(), DENSE)
        with _paused(pids):
            handle = client.pull_dense("head")

            def wait() -> None:
                got.append((handle.wait(), time.monotonic()))

            threads = [threading.Thread(target=wait) for _ in "abc"]
            for thread in threads:
                thread.start()
            wait_until(lambda: client._channel.waiting() == 3, WAIT_S,
                       "the three threads to wait (one reads) before the servers answer")  # fmt: skip
            resumed = time.monotonic()
        for thread in threads:
            thread.join(WAIT_S + 10)
    assert len(got) == 3
    for values, finished in got:
        np.testing.assert_array_equal(values, DENSE)
        assert finished - resumed < WAIT_S / 2


def test_a_reply_nobody_waits_for_is_read_by_done(servers, no_sweep):
    endpoints, expected, _ = servers
    with PSClient(endpoints, timeout=WAIT_S) as client:
        handle = client.pull("emb", KEYS[:100])
        wait_until(handle.done, WAIT_S, "done() to see the reply that arrived", interval=0.01)
        np.testing.assert_array_equal(handle.wait(timeout=0.001), expected[:100])


def test_requests_beyond_the_in_flight_slots_free_them_by_reading_replies(servers, no_sweep):
    endpoints, expected, _ = servers
    with PSClient(endpoints, timeout=WAIT_S, max_in_flight=2) as client:
        # 12 pulls to 2 servers = 24 requests through 2 slots, none waited on yet
        handles = [client.pull("emb", KEYS[i * 100 : (i + 1) * 100]) for i in range(12)]
        for i, handle in enumerate(handles):
            np.testing.assert_array_equal(handle.wait(), expected[i * 100 : (i + 1) * 100])


def test_the_reading_passes_to_a_waiting_thread_when_the_reader_is_answered(servers, no_sweep):
    # A waits first (it reads), B waits behind it; A's server answers, A leaves; B's
    # server answers later: B must have taken over the reading, else nobody reads B's
    # reply until the (stretched) sweep and B's wait times out.
    endpoints, expected, pids = servers
    owner = server_of(KEYS, 2)
    mine = {rank: np.flatnonzero(owner == rank)[:50] for rank in (0, 1)}
    done: dict[str, float] = {}
    errors: list[BaseException] = []

    def wait_for(name: str, handle, picks) -> None:
        try:
            np.testing.assert_array_equal(handle.wait(timeout=WAIT_S), expected[picks])
            done[name] = time.monotonic()
        except BaseException as exc:  # reported below
            errors.append(exc)

    with PSClient(endpoints, timeout=WAIT_S) as client, _paused(pids):
        first = client.pull("emb", KEYS[mine[0]])
        second = client.pull("emb", KEYS[mine[1]])
        a = threading.Thread(target=wait_for, args=("a", first, mine[0]))
        b = threading.Thread(target=wait_for, args=("b", second, mine[1]))
        waiting = client._channel.waiting
        a.start()
        wait_until(lambda: waiting() == 1, WAIT_S, "A to read")
        b.start()
        wait_until(lambda: waiting() == 2, WAIT_S, "B to wait behind A")
        os.kill(pids[0], signal.SIGCONT)
        a.join(WAIT_S)
        assert "a" in done, errors
        wait_until(lambda: waiting() == 1, WAIT_S, "B to wait alone")  # A has left
        resumed = time.monotonic()
        os.kill(pids[1], signal.SIGCONT)
        b.join(WAIT_S)
    assert not errors, errors[0]
    assert done["b"] - resumed < WAIT_S / 2
