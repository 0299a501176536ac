"""Elastic jobs (issue 23): routing cost over virtual shards, and a live migration.

- ``routing_placement_rows_per_s``: dedup + group by owner of 8192-key batches through a
  placement (key -> virtual shard -> rank, ``Placement.group``), baseline today's
  ``group_by_server`` on the same batches (3 servers, 1026 virtual shards, best of rounds).
- A job of 2 servers holding ``rows`` rows (dim 16, Adagrad) grows to 3 and shrinks back
  to 2 while a thread keeps pushing 8192-key batches through an ``ElasticClient``:
  ``migration_rows_per_s`` / ``migration_bytes_per_s`` (rows and bytes copied, over the
  whole migration; no baseline), ``migration_cutover_s`` (the freeze-to-bump window),
  ``migration_longest_push_gap_s`` (the longest wait between two completed pushes during
  the migration), and ``migration_push_keys_per_s``: push throughput during the
  migrations with the throughput before them as baseline (ratio < 1 = the dip).

Run: ``sparseps bench elastic [--quick] [--json]``.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from sparseps import optim
from sparseps.benchmarking import BenchRecord
from sparseps.config import TableConfig
from sparseps.core.placement import Placement
from sparseps.core.routing import group_by_server
from sparseps.elastic import ElasticClient, install_placement, scale
from sparseps.elastic.peers import Peers
from sparseps.testing import local_cluster

BATCH = 8192
DIM = 16


def _routing(quick: bool) -> list[BenchRecord]:
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 2**62, BATCH, dtype=np.uint64) for _ in range(50 if quick else 200)]
    placement = Placement.default(["h:0", "h:1", "h:2"])
    placement.group(batches[0]), group_by_server(batches[0], 3)  # compile

    def rate(fn) -> float:
        start = time.perf_counter()
        for keys in batches:
            fn(keys)
        return len(batches) * BATCH / (time.perf_counter() - start)

    base, new = [], []
    for _ in range(3 if quick else 5):
        base.append(rate(lambda k: group_by_server(k, 3)))
        new.append(rate(placement.group))
    return [BenchRecord("routing_placement_rows_per_s", max(new), "rows/s", max(base),
                        {"batch": BATCH, "servers": 3, "vshards": placement.vshards})]  # fmt: skip


class _Pusher(threading.Thread):
    def __init__(self, client: ElasticClient, universe: np.ndarray) -> None:
        super().__init__(daemon=True)
        self.client, self.universe = client, universe
        self.stop = threading.Event()
        self.done: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = np.random.default_rng(5)
        grads = rng.standard_normal((BATCH, DIM)).astype(np.float32) * 0.01
        try:
            while not self.stop.is_set():
                self.client.push("bench", rng.choice(self.universe, BATCH), grads).wait()
                self.done.append(time.monotonic())
        except BaseException as exc:
            self.error = exc

    def rate(self, t0: float, t1: float) -> float:
        done = np.array(self.done)
        return np.count_nonzero((done >= t0) & (done < t1)) * BATCH / (t1 - t0)

    def gap(self, t0: float, t1: float) -> float:
        done = np.array(self.done)
        inside = done[(done >= t0) & (done <= t1)]
        after = done[done > t1][:1]
        return float(np.max(np.diff(np.concatenate([[t0], inside, after]))))


def run(quick: bool) -> list[BenchRecord]:
    records = _routing(quick)
    rows = 100_000 if quick else 1_000_000
    universe = np.random.default_rng(1).choice(2**62, rows, replace=False).astype(np.uint64)
    with local_cluster(servers=3, timeout=60) as cluster:
        endpoints = list(cluster.endpoints)
        peers = Peers(timeout=120)
        try:
            install_placement(peers, Placement.default(endpoints, ranks=[0, 1]))
            with ElasticClient(endpoints[:2], timeout=120) as client:
                client.create_table(TableConfig(name="bench", dim=DIM, rule=optim.Adagrad(lr=0.05)))
                zeros = np.zeros((BATCH, DIM), np.float32)
                for at in range(0, rows, BATCH):
                    chunk = universe[at : at + BATCH]
                    client.push("bench", chunk, zeros[: len(chunk)]).wait()
                pusher = _Pusher(client, universe)
                pusher.start()
                time.sleep(2.0 if quick else 4.0)
                t0 = time.monotonic()
                reports = [scale(peers, endpoints, [0, 1, 2]), scale(peers, endpoints, [0, 1])]
                t1 = time.monotonic()
                time.sleep(0.5)
                pusher.stop.set()
                pusher.join(120)
                if pusher.error is not None:
                    raise pusher.error
                before = pusher.rate(t0 - (2.0 if quick else 4.0) + 0.5, t0)
                during = pusher.rate(t0, t1)
                gap = pusher.gap(t0, t1)
        finally:
            peers.close()
    moved = sum(r.rows for r in reports)
    nbytes = sum(r.bytes for r in reports)
    seconds = sum(r.total_s for r in reports)
    params = {"rows": rows, "dim": DIM, "rule": "adagrad", "servers": "2->3->2",
              "vshards_moved": [r.vshards_moved for r in reports]}  # fmt: skip
    return records + [
        BenchRecord("migration_rows_per_s", moved / seconds, "rows/s", None, params),
        BenchRecord("migration_bytes_per_s", nbytes / seconds, "bytes/s", None, params),
        BenchRecord("migration_cutover_s", max(r.cutover_s for r in reports), "s", None, params),
        BenchRecord("migration_longest_push_gap_s", gap, "s", None, params),
        BenchRecord(
            "migration_push_keys_per_s",
            during,
            "keys/s",
            before,
            {**params, "migration_s": t1 - t0},
        ),  # fmt: skip
    ]
