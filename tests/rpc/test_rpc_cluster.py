"""Real server processes on loopback: results equal an in-process SparseTable.

Two client processes take turns (a pipe to this process serialises the order); after
each step the rows they pulled, and at the end every row, must equal what one
in-process SparseTable gives for the same sequence of pulls and pushes.
"""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Initializer, Lifecycle, TableConfig
from sparseps.core.routing import server_of
from sparseps.errors import InputError, RemoteError
from sparseps.table import SparseTable
from sparseps.testing import local_cluster

pytestmark = pytest.mark.timeout(120)

DIM = 8
STEPS = 8
BATCH = 600


def _config(admission: str) -> TableConfig:
    lifecycle = Lifecycle(admission="count", admit_count=2) if admission == "count" else Lifecycle()
    return TableConfig(name="emb", dim=DIM, rule=optim.Adagrad(lr=0.1), lifecycle=lifecycle, seed=7)


def _batch(step: int):
    """Keys with duplicates, spread over a key space the servers share."""
    rng = np.random.default_rng(1000 + step)
    keys = rng.integers(0, 3000, BATCH).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15 >> 3)
    shows = rng.integers(1, 3, BATCH).astype(np.float32)
    clicks = (rng.random(BATCH) < 0.3).astype(np.float32)
    noise = rng.standard_normal((BATCH, DIM)).astype(np.float32)
    return keys, shows, clicks, noise


def _grads(rows: np.ndarray, noise: np.ndarray) -> np.ndarray:
    # Gradients depend on the pulled rows, so any divergence would compound.
    return (0.5 * rows + 0.1 * noise).astype(np.float32)


def _client_process(endpoints, conn) -> None:
    """Runs in a spawned process: does the steps this test hands it, reports the rows."""
    from sparseps.rpc.client import PSClient

    with PSClient(endpoints, timeout=30) as client:
        while True:
            step = conn.recv()
            if step is None:
                break
            keys, shows, clicks, noise = _batch(step)
            rows = client.pull("emb", keys).wait()
            client.push("emb", keys, _grads(rows, noise), shows=shows, clicks=clicks).wait()
            conn.send(rows)
    conn.close()


@pytest.mark.parametrize(("servers", "admission"), [(1, "always"), (3, "count")])
def test_two_client_processes_match_an_in_process_table(servers, admission):
    config = _config(admission)
    reference = SparseTable(config)
    context = mp.get_context("spawn")
    with (
        local_cluster(servers=servers, timeout=30) as cluster,
        cluster.client(timeout=30) as client,
    ):
        client.create_table(config)
        pipes, processes = [], []
        for _ in range(2):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_client_process, args=(cluster.endpoints, theirs), daemon=True
            )
            process.start()
            pipes.append(ours)
            processes.append(process)
        try:
            for step in range(STEPS):
                pipe = pipes[step % 2]
                pipe.send(step)
                assert pipe.poll(60), f"client process {step % 2} did not answer step {step}"
                remote_rows = pipe.recv()
                keys, shows, clicks, noise = _batch(step)
                local_rows = reference.pull(keys)
                np.testing.assert_array_equal(
                    remote_rows, local_rows, err_msg=f"pull of step {step}"
                )
                reference.push(keys, _grads(local_rows, noise), shows=shows, clicks=clicks)
        finally:
            for pipe in pipes:
                pipe.send(None)
            for process in processes:
                process.join(timeout=20)
        assert [p.exitcode for p in processes] == [0, 0]

        all_keys = np.unique(np.concatenate([_batch(s)[0] for s in range(STEPS)]))
        np.testing.assert_array_equal(client.pull("emb", all_keys).wait(), reference.pull(all_keys))
        stats = client.stats()
        rows_per_server = [s["tables"]["emb"]["rows"] for s in stats["servers"]]
        assert sum(rows_per_server) == len(reference) == stats["total"]["tables"]["emb"]["rows"]
        assert all(rows > 0 for rows in rows_per_server), rows_per_server
        owners = np.bincount(server_of(reference.keys(), servers), minlength=servers)
        assert owners.tolist() == rows_per_server
        if admission == "count":
            assert stats["total"]["tables"]["emb"]["pending"] == reference.stats().pending > 0


def test_table_lifecycle_ops_and_errors():
    config = TableConfig(name="t", dim=4, rule=optim.SGD(lr=0.5), seed=3)
    with local_cluster(servers=2, timeout=30) as cluster, cluster.client(timeout=20) as client:
        client.create_table(config)
        client.create_table(config)  # idempotent for an equal config
        other = TableConfig(name="t", dim=6, rule=optim.Adagrad(lr=0.5), seed=3)
        with pytest.raises(RemoteError) as info:
            client.create_table(other)
        message = str(info.value)
        assert "dim: existing=4 requested=6" in message
        assert (
            "existing:" in message
            and "requested:" in message
            and info.value.remote_type == "ConfigError"
        )

        keys = np.arange(1, 201, dtype=np.uint64)
        with pytest.raises(RemoteError, match="does not exist"):
            client.push("missing", keys, np.zeros((200, 4), np.float32)).wait()
        with pytest.raises(InputError, match="1-D uint64"):
            client.pull("t", keys.astype(np.int64))
        with pytest.raises(InputError, match="NaN"):
            client.push("t", keys, np.full((200, 4), np.nan, np.float32))

        # Empty batches are fine; duplicates within a push are summed.
        assert client.pull("t", np.empty(0, np.uint64)).wait().shape == (0, 4)
        reference = SparseTable(config)
        dup = np.array([5, 5, 9, 5], dtype=np.uint64)
        grads = np.arange(16, dtype=np.float32).reshape(4, 4)
        client.push("t", dup, grads).wait()
        reference.push(dup, grads)
        np.testing.assert_array_equal(client.pull("t", dup).wait(), reference.pull(dup))
        stats = client.stats()["total"]["tables"]["t"]
        assert stats["rows"] == 2

        client.decay("t", 0.5)
        reference.decay(0.5)
        deleted = client.shrink("t")
        np.testing.assert_array_equal(deleted, reference.shrink())
        assert deleted.dtype == np.uint64


def test_dense_tables():
    rule = optim.SGD(lr=0.5)
    with local_cluster(servers=2, timeout=30) as cluster, cluster.client(timeout=20) as client:
        init = np.arange(10, dtype=np.float32)
        client.create_dense("dense", 10, rule, init=init)
        client.create_dense("dense", 10, rule)  # idempotent
        with pytest.raises(RemoteError, match="size: existing=10 requested=11"):
            client.create_dense("dense", 11, rule)
        np.testing.assert_array_equal(client.pull_dense("dense").wait(), init)
        assert client.push_dense("dense", np.ones(10, np.float32)).wait() is None
        np.testing.assert_allclose(client.pull_dense("dense").wait(), init - 0.5)
        fresh = client.push_dense("dense", np.ones(10, np.float32), pull=True).wait()
        np.testing.assert_allclose(fresh, init - 1.0)  # the values after this step
        fresh[:] = 0  # a writable copy of its own
        np.testing.assert_allclose(client.pull_dense("dense").wait(), init - 1.0)
        client.push_dense_delta("dense", np.full(10, 2.0, np.float32)).wait()
        np.testing.assert_allclose(client.pull_dense("dense").wait(), init + 1.0)
        client.set_dense("dense", np.zeros(10, np.float32)).wait()
        assert not client.pull_dense("dense").wait().any()
        with pytest.raises(RemoteError, match="got 3 values"):
            client.push_dense("dense", np.ones(3, np.float32)).wait()


def test_one_client_shared_by_threads():
    """A training loop and a background push thread share one client (the trainer's use)."""
    config = TableConfig(name="s", dim=4, rule=optim.SGD(lr=1.0), initializer=Initializer.zeros())
    keys = np.arange(1, 2001, dtype=np.uint64)
    rounds = 10
    with local_cluster(servers=2, timeout=30) as cluster, cluster.client(timeout=20) as client:
        client.create_table(config)
        errors = []

        def pusher():
            try:
                for _ in range(rounds):
                    client.push("s", keys, np.ones((len(keys), 4), np.float32)).wait()
            except Exception as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=pusher) for _ in range(2)]
        for thread in threads:
            thread.start()
        seen = []
        while any(t.is_alive() for t in threads):
            handle = client.pull("s", keys[::7])
            other = threading.Thread(target=lambda h=handle: seen.append(h.wait()))
            other.start()
            seen.append(handle.wait())
            other.join(timeout=20)
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors
        # Every push applied exactly once: SGD with lr 1 on ones from zeros.
        np.testing.assert_array_equal(
            client.pull("s", keys).wait(), np.full((len(keys), 4), -2.0 * rounds, np.float32)
        )
        # Concurrent pulls saw whole pushes of one key's row (never half of a row).
        for rows in seen:
            assert (rows == rows[:, :1]).all()


@pytest.mark.parametrize("servers", [1, 3])
def test_a_pull_with_or_without_dedup_gives_the_same_writable_rows(servers):
    config = _config("always")
    keys, shows, clicks, noise = _batch(0)  # repeated keys
    with (
        local_cluster(servers=servers, timeout=30) as cluster,
        cluster.client(timeout=30) as client,
    ):
        client.create_table(config)
        client.push("emb", keys, noise, shows=shows, clicks=clicks).wait()
        repeated = client.pull("emb", keys).wait()
        distinct = client.pull("emb", keys, dedup=True).wait()
        np.testing.assert_array_equal(repeated, distinct)
        assert repeated.shape == (len(keys), DIM) and repeated.flags.writeable
        assert np.abs(repeated).sum() > 0  # the pushed rows, not fresh zeros
        # each pull's rows are its own (one server's reply is handed over, not copied):
        # writing them changes neither the table nor the next pull's rows
        first_rows, second = client.pull("emb", keys).wait(), client.pull("emb", keys)
        first_rows[:] = np.nan
        second = second.wait()
        assert not np.shares_memory(first_rows, second) and second.flags.writeable
        np.testing.assert_array_equal(second, distinct)
        np.testing.assert_array_equal(client.pull("emb", keys).wait(), distinct)
        unique = np.unique(keys)
        assert client.stats()["total"]["tables"]["emb"]["rows"] == len(unique)
        first = {int(k): i for i, k in reversed(list(enumerate(keys)))}
        np.testing.assert_array_equal(
            client.pull("emb", unique).wait(), repeated[[first[int(k)] for k in unique]]
        )
