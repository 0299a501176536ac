"""Pull/push through real servers on loopback vs. the same calls on an in-process table.

For 1 and 2 server processes: rows/s of pulls and pushes of 8192-key batches (dim 16,
Adagrad) with several requests in flight, and the p50/p99 latency of single pulls. Each
figure's baseline is the same operation on an in-process ``SparseTable`` holding the
same rows, measured in the same run (``ratio`` = rpc / in-process; for latencies a
ratio above 1 means slower).

Run: ``sparseps bench rpc [--quick] [--json]``.
"""

from __future__ import annotations

import time

import numpy as np

from sparseps import optim
from sparseps.benchmarking import BenchRecord
from sparseps.config import TableConfig
from sparseps.table import SparseTable
from sparseps.testing import local_cluster

BATCH = 8192
DIM = 16
IN_FLIGHT = 4


def _config() -> TableConfig:
    return TableConfig(name="bench", dim=DIM, rule=optim.Adagrad(lr=0.05), seed=1)


def _batches(universe: np.ndarray, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [universe[rng.integers(0, len(universe), BATCH)] for _ in range(count)]


def _fill(push, universe: np.ndarray) -> None:
    grads = np.full((BATCH, DIM), 0.01, np.float32)
    for start in range(0, len(universe), BATCH):
        keys = universe[start : start + BATCH]
        push(keys, grads[: len(keys)])


def _pipelined(issue, batches: list, depth: int) -> float:
    """Seconds to run every batch with up to ``depth`` handles outstanding."""
    start = time.perf_counter()
    handles = []
    for keys in batches:
        handles.append(issue(keys))
        if len(handles) >= depth:
            handles.pop(0).wait()
    for handle in handles:
        handle.wait()
    return time.perf_counter() - start


def _latencies(call, batches: list) -> np.ndarray:
    times = []
    for keys in batches:
        start = time.perf_counter()
        call(keys)
        times.append(time.perf_counter() - start)
    return np.array(times) * 1e3


def _in_process(universe, pulls, pushes, grads) -> dict:
    table = SparseTable(_config())
    _fill(table.push, universe)
    table.pull(pulls[0])  # compile / warm caches
    start = time.perf_counter()
    for keys in pulls:
        table.pull(keys)
    pull_s = time.perf_counter() - start
    start = time.perf_counter()
    for keys in pushes:
        table.push(keys, grads)
    push_s = time.perf_counter() - start
    latency = _latencies(table.pull, pulls)
    return {
        "pull": len(pulls) * BATCH / pull_s,
        "push": len(pushes) * BATCH / push_s,
        "latency": latency,
    }


def _remote(servers: int, universe, pulls, pushes, grads) -> dict:
    with (
        local_cluster(servers=servers, timeout=60) as cluster,
        cluster.client(timeout=120) as client,
    ):
        client.create_table(_config())
        _fill(lambda k, g: client.push("bench", k, g).wait(), universe)
        for keys in pulls[:3]:  # warm up the servers' compiled kernels and connections
            client.pull("bench", keys).wait()
        pull_s = _pipelined(lambda k: client.pull("bench", k), pulls, IN_FLIGHT)
        push_s = _pipelined(lambda k: client.push("bench", k, grads), pushes, IN_FLIGHT)
        latency = _latencies(lambda k: client.pull("bench", k).wait(), pulls)
    return {
        "pull": len(pulls) * BATCH / pull_s,
        "push": len(pushes) * BATCH / push_s,
        "latency": latency,
    }


def run(quick: bool) -> list[BenchRecord]:
    rows = 100_000 if quick else 1_000_000
    count = 20 if quick else 150
    universe = np.random.default_rng(0).choice(2**62, rows, replace=False).astype(np.uint64)
    pulls = _batches(universe, count, seed=1)
    pushes = _batches(universe, count, seed=2)
    grads = np.random.default_rng(3).standard_normal((BATCH, DIM)).astype(np.float32) * 0.01
    local = _in_process(universe, pulls, pushes, grads)
    local_p50, local_p99 = np.percentile(local["latency"], [50, 99])
    records = []
    for servers in (1, 2):
        remote = _remote(servers, universe, pulls, pushes, grads)
        p50, p99 = np.percentile(remote["latency"], [50, 99])
        params = {
            "servers": servers,
            "batch": BATCH,
            "dim": DIM,
            "in_flight": IN_FLIGHT,
            "batches": count,
            "rows": rows,
        }
        records += [
            BenchRecord("rpc_pull_rows_per_s", remote["pull"], "rows/s", local["pull"], params),
            BenchRecord("rpc_push_rows_per_s", remote["push"], "rows/s", local["push"], params),
            BenchRecord("rpc_pull_p50_ms", float(p50), "ms", float(local_p50), params),
            BenchRecord("rpc_pull_p99_ms", float(p99), "ms", float(local_p99), params),
        ]
    return records
