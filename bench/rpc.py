"""Pull/push through real servers on loopback vs. the same calls on an in-process table.

For 1 and 2 server processes: rows/s of pulls and pushes of 8192-key batches (dim 16,
Adagrad) with several requests in flight, and the p50/p99 latency of single pulls. Each
figure's baseline is the same operation on an in-process ``SparseTable`` holding the
same rows, measured in the same run, interleaved with the rpc figures round by round
(best of the rounds for each: noise on a shared machine only ever slows things down).
``ratio`` = rpc / in-process; for latencies a ratio above 1 means slower. The pushes
keep changing the rows of both tables the same way, so both keep equal contents.

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


class _Local:
    """The baseline: the same calls on an in-process table holding the same rows."""

    def __init__(self, universe: np.ndarray) -> None:
        self.table = SparseTable(_config())
        _fill(self.table.push, universe)

    def measure(self, pulls, pushes, grads) -> dict:
        table = self.table
        table.pull(pulls[0])  # compiled kernels and caches warm
        start = time.perf_counter()
        for keys in pulls:
            table.pull(keys)
        pull_s = time.perf_counter() - start
        start = time.perf_counter()
        for keys in pushes:
            table.push(keys, grads)
        push_s = time.perf_counter() - start
        latency = _latencies(table.pull, pulls)
        return _figures(len(pulls), pull_s, len(pushes), push_s, latency)


def _figures(pulls: int, pull_s: float, pushes: int, push_s: float, latency: np.ndarray) -> dict:
    p50, p99 = np.percentile(latency, [50, 99])
    return {"pull": pulls * BATCH / pull_s, "push": pushes * BATCH / push_s, "p50": p50, "p99": p99}


def _measure_remote(client, pulls, pushes, grads) -> dict:
    for keys in pulls[:3]:  # connections and the servers' kernels warm
        client.pull("bench", keys).wait()
    pull_s = _pipelined(lambda k: client.pull("bench", k), pulls, IN_FLIGHT)
    push_s = _pipelined(lambda k: client.push("bench", k, grads), pushes, IN_FLIGHT)
    latency = _latencies(lambda k: client.pull("bench", k).wait(), pulls)
    return _figures(len(pulls), pull_s, len(pushes), push_s, latency)


def _best(results: list[dict]) -> dict:
    """Best of the rounds: highest throughput, lowest latency (noise only ever slows down)."""
    return {
        "pull": max(r["pull"] for r in results),
        "push": max(r["push"] for r in results),
        "p50": min(r["p50"] for r in results),
        "p99": min(r["p99"] for r in results),
    }


def run(quick: bool) -> list[BenchRecord]:
    rows = 100_000 if quick else 1_000_000
    count = 20 if quick else 100
    rounds = 2 if quick else 3
    universe = np.random.default_rng(0).choice(2**62, rows, replace=False).astype(np.uint64)
    pulls = _batches(universe, count, seed=1)
    pushes = _batches(universe, count, seed=2)
    grads = np.random.default_rng(3).standard_normal((BATCH, DIM)).astype(np.float32) * 0.01
    local = _Local(universe)
    records = []
    for servers in (1, 2):
        with (
            local_cluster(servers=servers, timeout=60) as cluster,
            cluster.client(timeout=120) as client,
        ):
            client.create_table(_config())
            _fill(lambda k, g: client.push("bench", k, g).wait(), universe)
            # Rounds interleave baseline and rpc so both see the same machine load.
            base, remote = [], []
            for _ in range(rounds):
                base.append(local.measure(pulls, pushes, grads))
                remote.append(_measure_remote(client, pulls, pushes, grads))
        base, remote = _best(base), _best(remote)
        params = {
            "servers": servers,
            "batch": BATCH,
            "dim": DIM,
            "in_flight": IN_FLIGHT,
            "batches": count,
            "rows": rows,
            "rounds": rounds,
        }
        records += [
            BenchRecord("rpc_pull_rows_per_s", remote["pull"], "rows/s", base["pull"], params),
            BenchRecord("rpc_push_rows_per_s", remote["push"], "rows/s", base["push"], params),
            BenchRecord("rpc_pull_p50_ms", float(remote["p50"]), "ms", float(base["p50"]), params),
            BenchRecord("rpc_pull_p99_ms", float(remote["p99"]), "ms", float(base["p99"]), params),
        ]
    return records
