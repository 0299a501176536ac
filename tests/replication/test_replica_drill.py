"""The replication drill: concurrent writers, kills and replacements in every order, an
exact oracle of acknowledged pushes, and copies compared bit for bit.

Each case starts real servers with ``replicas=1`` (or 2) and several clients (threads, each its
own :class:`PSClient`) pushing concurrently to overlapping keys. The table is SGD with
learning rate 1 on zero-initialised rows and every gradient is a small integer, so a row
is exactly minus the sum of the gradients applied to it, in any order: the oracle of the
acknowledged pushes is exact. While they push, a scenario (seeded: which server, how long
between events) kills servers, starts replacements (``--recover``) and kills again. The
case then checks:

- *nothing lost, nothing doubled*: every row equals the oracle of the acknowledged pushes
  (no push may fail: one lost server per chain is what ``replicas=1`` survives);
- *copies bit-identical*: every live copy of every shard holds the same rows. For that
  part each writer also pushes into an Adagrad table, whose result depends on the order
  of the updates: copies that applied concurrent writers' pushes in different orders
  differ in their last bits;
- *a read-only client follows*: a client that only pulled before the events pulls the
  oracle's rows after them.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from sparseps.config import Initializer, TableConfig
from sparseps.core.replicas import chain
from sparseps.core.routing import server_of
from sparseps.optim import SGD, Adagrad
from sparseps.testing import local_cluster, wait_until

DIM = 4
POOL = np.arange(1, 1501, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
WRITERS = 3
TIMEOUT = 60.0


class Writer(threading.Thread):
    """Pushes batches of overlapping keys until told to stop; keeps the oracle of what
    was acknowledged."""

    def __init__(self, client, index: int, seed: int, stop: threading.Event) -> None:
        super().__init__(name=f"drill-writer-{index}", daemon=True)
        self.client = client
        self.rng = np.random.default_rng([seed, index])
        self.stop_event = stop
        self.acked = np.zeros((len(POOL), DIM), np.float64)
        self.pushes = 0
        self.failures: list[BaseException] = []

    def run(self) -> None:
        while not self.stop_event.is_set():
            index = self.rng.choice(len(POOL), size=64, replace=False)
            grads = self.rng.integers(-3, 4, size=(len(index), DIM)).astype(np.float32)
            try:
                exact = self.client.push("exact", POOL[index], grads)
                ordered = self.client.push("ordered", POOL[index], grads * np.float32(0.01))
                exact.wait()
                ordered.wait()
            except Exception as exc:  # recorded: the case fails on any
                self.failures.append(exc)
                return
            self.acked[index] += grads
            self.pushes += 1


def _wait_in_sync(cluster, replicas: int, deadline: float) -> None:
    """Until every shard has its full chain of copies, none recovering (asked by a fresh
    client each time: it connects to every server that runs)."""
    seen: list = []

    def in_sync() -> bool:
        with cluster.client(timeout=TIMEOUT) as client:
            seen[:] = client.replica_status()
        return all(
            len(s["copies"]) == replicas + 1
            and not any(c["recovering"] for c in s["copies"])
            and all(len(c["members"]) == replicas + 1 for c in s["copies"])
            for s in seen
        )

    try:
        wait_until(in_sync, max(0.0, deadline - time.monotonic()), "every copy in sync")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {seen}") from None


def _copies_of(client, table: str, servers: int, replicas: int, alive: set[int]) -> None:
    """Every live copy of every shard holds the same rows, bit for bit."""
    shard_of = server_of(POOL, servers)
    for shard in range(servers):
        keys = POOL[shard_of == shard]
        rows = {}
        for rank in chain(shard, servers, replicas):
            if rank in alive:
                result, bufs = client.request(
                    rank, "pull", table, [keys], shard=None if rank == shard else shard
                ).wait()
                rows[rank] = bufs[0]
        first, *rest = rows.values()
        for rank, other in zip(list(rows)[1:], rest, strict=True):
            np.testing.assert_array_equal(
                other, first, err_msg=f"shard {shard}: copy on server {rank} differs"
            )


def _scenario(name: str, servers: int, rng: random.Random) -> list[tuple[str, int]]:
    """The events of a case: ``(kill|replace|sync, rank)``."""
    a = rng.randrange(servers)
    b = (a + 1) % servers  # a's chain neighbour: together they hold shard a
    if name == "kill-kill":  # replicas=2: the head, then the next head, without replacing
        return [("kill", a), ("kill", b)]
    if name == "kill-kill-replace-replace-kill":
        return [("kill", a), ("kill", b), ("replace", a), ("replace", b), ("sync", -1),
                ("kill", (b + 1) % servers)]  # fmt: skip
    if name == "kill-replace-kill-other":
        return [("kill", a), ("replace", a), ("sync", -1), ("kill", b)]
    if name == "kill-replace-kill-replacement":
        return [("kill", a), ("replace", a), ("sync", -1), ("kill", a), ("replace", a),
                ("sync", -1), ("kill", b)]  # fmt: skip
    if name == "kill-backup-first":
        return [("kill", b), ("replace", b), ("sync", -1), ("kill", a), ("replace", a),
                ("sync", -1)]  # fmt: skip
    raise AssertionError(name)


def _drill(scenario: str, servers: int, replicas: int, seed: int) -> None:
    rng = random.Random(seed)
    exact = TableConfig(name="exact", dim=DIM, rule=SGD(lr=1.0), initializer=Initializer.zeros())
    ordered = TableConfig(name="ordered", dim=DIM, rule=Adagrad(lr=0.1))
    stop = threading.Event()
    with local_cluster(servers=servers, replicas=replicas, timeout=TIMEOUT) as cluster:
        admin = cluster.client(timeout=TIMEOUT)
        admin.create_table(exact)
        admin.create_table(ordered)
        reader = cluster.client(timeout=TIMEOUT)
        reader.pull("exact", POOL).wait()  # a client that only reads
        writers = [Writer(cluster.client(timeout=TIMEOUT), i, seed, stop) for i in range(WRITERS)]
        for writer in writers:
            writer.start()
        alive = set(range(servers))
        try:
            for event, rank in _scenario(scenario, servers, rng):
                time.sleep(rng.uniform(0.1, 0.6))  # the drill: events at random times
                if event == "kill":
                    cluster.kill(rank)
                    alive.discard(rank)
                elif event == "replace":
                    cluster.replace(rank)
                    alive.add(rank)
                else:
                    _wait_in_sync(cluster, replicas, time.monotonic() + TIMEOUT)
            time.sleep(rng.uniform(0.1, 0.5))  # writes go on after the last event
        finally:
            stop.set()
            for writer in writers:
                writer.join(TIMEOUT)
        failures = [exc for w in writers for exc in w.failures]
        assert not failures, failures
        assert all(w.pushes > 0 for w in writers)
        oracle = -sum(w.acked for w in writers)
        np.testing.assert_array_equal(reader.pull("exact", POOL).wait(), oracle.astype(np.float32))
        np.testing.assert_array_equal(admin.pull("exact", POOL).wait(), oracle.astype(np.float32))
        _copies_of(admin, "exact", servers, replicas, alive)
        _copies_of(admin, "ordered", servers, replicas, alive)


CASES = [  # (scenario, servers, replicas, seed)
    ("kill-replace-kill-other", 2, 1, 1),
    ("kill-replace-kill-other", 2, 1, 2),
    ("kill-replace-kill-other", 3, 1, 3),
    ("kill-replace-kill-other", 3, 1, 7),
    ("kill-replace-kill-replacement", 2, 1, 4),
    ("kill-replace-kill-replacement", 3, 1, 5),
    ("kill-backup-first", 3, 1, 6),
    ("kill-backup-first", 2, 1, 8),
    ("kill-kill", 3, 2, 9),
    ("kill-kill-replace-replace-kill", 3, 2, 10),
]


@pytest.mark.parametrize(("scenario", "servers", "replicas", "seed"), CASES)
def test_replication_drill(scenario: str, servers: int, replicas: int, seed: int) -> None:
    _drill(scenario, servers, replicas, seed)
