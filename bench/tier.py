"""Tables larger than memory: a tiered table against the same table all in memory.

Records (``sparseps bench tier [--quick] [--json]``), dim 16 with Adagrad, a table of
``ROWS`` live keys (quick: 200k; else 2M) whose memory budget is a tenth of them
(``memory_rows = ROWS / 10``; the other rows live in the disk tier's row file).

Each run is a stream of training steps as a server sees them: pull a batch of 8192 keys
(read lock), push its gradients (write lock). With prefetch (the default metrics), the
server's own :class:`~sparseps.server.prefetch.RowPrefetcher` thread promotes batch
``i + 1``'s disk rows while step ``i`` runs, and step ``i + 1`` starts when that is done
(a worker whose compute hides the prefetch: the pipeline sends the keys a batch ahead).

- ``tier_pull_rows_per_s`` / ``tier_push_rows_per_s``: rows per second of the pulls / the
  pushes alone (the request path), batches drawn Zipf(1.1) (``keys[mix(rank) % ROWS]``,
  as in bench/table.py: hot keys scattered over the key space). Baseline: the same on the
  same table kept in memory (no ``memory_rows``), in this run. Target ratio >= 0.5.
- ``tier_step_rows_per_s``: rows per second of the whole loop, waits for the prefetch
  included: a worker with no compute at all to hide the disk reads behind (the worst
  case for the pipeline; the reads then run on another core instead of in the pull).
- ``..._no_prefetch``: the same without the prefetch thread (every pull promotes its own
  rows, one ``pread`` each); ``_uniform``: keys uniform over the table, the worst case
  (about 90% of the rows touched are on disk).
- ``tier_peak_rss_bytes``: the peak RSS (VmHWM) of a separate process, set up like a server
  with a disk dir (:func:`sparseps.server.heap.return_large_frees`), that fills the tiered
  table, resets its peak (``/proc/self/clear_refs``) and trains on the Zipf stream with
  the prefetch thread. Baseline: the bound it should stay under,
  ``base + index + 1.25 * budget``: ``base`` is the process's RSS before the table exists
  (interpreter, numpy, numba with every tier kernel loaded, the benchmark's key arrays),
  ``index`` the memory the table needs besides its cache (key index, tier maps and write
  buffers: ``bytes_used - budget``, about 40 bytes per row) and ``budget`` the cache's
  bytes (``memory_rows * row bytes``). Ratio <= 1 meets the target.
  ``params.fill_peak_rss`` is the peak while filling: the key index rehashes into new
  slot arrays while the old ones still exist (an in-memory table does the same).
  For scale: the table's rows alone would take ``params.all_rows_bytes``.

Every run uses fresh batches (a stream that never repeats, so the cache can neither learn
the benchmark's batches nor keep them from another run); the cache is warmed first by
batches from the same distribution. ``params.hit_rate`` is the fraction of touched rows
found in memory without prefetch. Timings are the best of the rounds (the machine is
shared).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

from sparseps import optim
from sparseps.benchmarking import BenchRecord
from sparseps.config import Initializer, TableConfig
from sparseps.core.hashing import mix64_array
from sparseps.server.entries import RWLock
from sparseps.server.heap import return_large_frees
from sparseps.server.log_budget import LogBudget
from sparseps.server.prefetch import RowPrefetcher
from sparseps.table import SparseTable

BATCH = 8192
ZIPF_A = 1.1
DIM = 16
BUDGET_FRACTION = 10
RSS_SLACK = 1.25


def _config(memory_rows: int | None) -> TableConfig:
    return TableConfig(name="tier", dim=DIM, rule=optim.Adagrad(lr=0.05, eps=1e-10),
                       initializer=Initializer.uniform(-0.01, 0.01), memory_rows=memory_rows)  # fmt: skip


def _keys(rows: int) -> np.ndarray:
    return mix64_array(np.arange(rows, dtype=np.uint64))


def _fill(table: SparseTable, keys: np.ndarray) -> float:
    zeros = np.zeros((BATCH, DIM), np.float32)
    start = time.perf_counter()
    for at in range(0, keys.size, BATCH):
        chunk = keys[at : at + BATCH]
        table.push(chunk, zeros[: chunk.size])
    return time.perf_counter() - start


def _batches(rng, keys: np.ndarray, count: int, zipf: bool) -> list[np.ndarray]:
    n = np.uint64(keys.size)
    out = []
    for _ in range(count):
        if zipf:
            ranks = rng.zipf(ZIPF_A, BATCH).astype(np.uint64)
            out.append(np.ascontiguousarray(keys[mix64_array(ranks) % n]))
        else:
            out.append(np.ascontiguousarray(keys[rng.integers(0, keys.size, BATCH)]))
    return out


class _Pipeline:
    """A server's table as the request loop and the prefetch thread share it: the real
    :class:`~sparseps.server.prefetch.RowPrefetcher` promotes the next batch's rows while
    this thread pulls and pushes the current one, under the table's read/write lock."""

    def __init__(self, table: SparseTable, prefetch: bool) -> None:
        self.entry = SimpleNamespace(table=table, lock=RWLock())
        self.prefetcher = (
            RowPrefetcher(LogBudget(logging.getLogger("bench.tier"))) if prefetch else None
        )

    def submit(self, batch: np.ndarray) -> None:
        if self.prefetcher is not None:
            self.prefetcher.submit(self.entry, batch)

    def wait(self, done: int) -> None:
        """Until ``done`` prefetches finished (a worker whose compute hides them)."""
        while self.prefetcher is not None and self.prefetcher.counts["done"] < done:
            time.sleep(0.0001)

    def run(self, batches, grads) -> tuple[float, float, float]:
        """Seconds of pulls, of pushes and of the whole loop over ``batches``."""
        entry, pull_s, push_s, done0 = self.entry, 0.0, 0.0, self._done()
        start = time.perf_counter()
        self.submit(batches[0])
        for i, (b, g) in enumerate(zip(batches, grads, strict=True)):
            self.wait(done0 + i + 1)
            if i + 1 < len(batches):
                self.submit(batches[i + 1])
            t0 = time.perf_counter()
            with entry.lock.read():
                entry.table.pull(b)
            t1 = time.perf_counter()
            with entry.lock.write():
                entry.table.push(b, g)
            pull_s, push_s = pull_s + t1 - t0, push_s + time.perf_counter() - t1
        return pull_s, push_s, time.perf_counter() - start

    def _done(self) -> int:
        return 0 if self.prefetcher is None else self.prefetcher.counts["done"]

    def stop(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()


def _compare(tiered, memory, rng, keys, zipf: bool, rounds: int, per_round: int):
    """Best seconds per op kind (pull, push, step) for the tiered table with and without
    prefetch and for the in-memory table, and the tier's hit rate without prefetch."""
    grads = [rng.normal(0, 0.01, (BATCH, DIM)).astype(np.float32) for _ in range(per_round)]
    runs = {"t": _Pipeline(tiered, True), "c": _Pipeline(tiered, False),
            "m": _Pipeline(memory, False)}  # fmt: skip
    runs["t"].run(_batches(rng, keys, per_round, zipf), grads)  # warm the cache
    best = {f"{op}_{k}": float("inf") for op in ("pull", "push", "step") for k in runs}
    pulled = promoted = 0
    for _ in range(rounds):
        for kind, pipeline in runs.items():
            # fresh for each run: the cache can neither learn them nor hold them from the
            # run before (the in-memory table's get the same draw's cost)
            batches = _batches(rng, keys, per_round, zipf)
            reads = tiered.stats().disk_reads
            pull_s, push_s, step_s = pipeline.run(batches, grads)
            if kind == "c":  # promotions per distinct row pulled, no prefetch
                promoted += tiered.stats().disk_reads - reads
                pulled += sum(np.unique(b).size for b in batches)
            for op, seconds in (("pull", pull_s), ("push", push_s), ("step", step_s)):
                best[f"{op}_{kind}"] = min(best[f"{op}_{kind}"], seconds)
    for pipeline in runs.values():
        pipeline.stop()
    return best, 1.0 - promoted / pulled


def _rss_child(rows: int, memory_rows: int, per_round: int) -> dict:
    """In a fresh process: base RSS, then the tiered table filled (its peak: the fill's),
    then the peak of training alone (the peak is reset first) under the Zipf stream with
    the prefetch thread running."""
    return_large_frees()  # as a server with a disk dir does
    keys = _keys(rows)
    rng = np.random.default_rng(11)
    grads = [rng.normal(0, 0.01, (BATCH, DIM)).astype(np.float32)] * per_round
    with tempfile.TemporaryDirectory(prefix="sparseps-bench-tier-") as folder:
        # the base holds the compiled kernels too: a small tiered table runs every op once
        small = SparseTable(_config(1024), disk_dir=folder)
        _fill(small, keys[: 16 * BATCH])
        warm = _Pipeline(small, True)
        warm.run(_batches(rng, keys[: 16 * BATCH], 2, zipf=True), grads[:2])
        warm.stop()
        small.close()
        del small
        gc.collect()
    base = _status("VmRSS")
    with tempfile.TemporaryDirectory(prefix="sparseps-bench-tier-") as folder:
        table = SparseTable(_config(memory_rows), disk_dir=folder)
        _fill(table, keys)
        fill_peak = _status("VmHWM")
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # Linux: VmHWM starts again from the current RSS
        filled = _status("VmRSS")
        pipeline = _Pipeline(table, True)
        for _ in range(4):
            pipeline.run(_batches(rng, keys, per_round, zipf=True), grads)
        pipeline.stop()
        stats = table.stats()
        result = {
            "base": base, "fill_peak": fill_peak, "filled": filled, "peak": _status("VmHWM"),
            "anon": _status("RssAnon"), "file": _status("RssFile"),
            "table_memory": stats.bytes_used, "budget": memory_rows * table.layout.width * 4,
            "index": stats.bytes_used - memory_rows * table.layout.width * 4, "disk_bytes": stats.disk_bytes,
        }  # fmt: skip
        table.close()
    return result


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def run(quick: bool) -> list[BenchRecord]:
    rows = 200_000 if quick else 2_000_000
    memory_rows = rows // BUDGET_FRACTION
    rounds, per_round = (3, 8) if quick else (5, 16)
    keys = _keys(rows)
    records = []
    with tempfile.TemporaryDirectory(prefix="sparseps-bench-tier-") as folder:
        tiered = SparseTable(_config(memory_rows), disk_dir=folder)
        memory = SparseTable(_config(None))
        fill_t, fill_m = _fill(tiered, keys), _fill(memory, keys)
        params = {"dim": DIM, "rule": "adagrad", "rows": rows, "memory_rows": memory_rows,
                  "batch": BATCH, "fill_ratio": round(fill_m / fill_t, 3)}  # fmt: skip
        rng = np.random.default_rng(5)
        for zipf, suffix in ((True, ""), (False, "_uniform")):
            best, hit = _compare(tiered, memory, rng, keys, zipf, rounds, per_round)
            total = per_round * BATCH
            p = {**params, "keys": f"zipf({ZIPF_A})" if zipf else "uniform",
                 "hit_rate": round(hit, 3)}  # fmt: skip
            for op in ("pull", "push", "step"):
                records.append(BenchRecord(f"tier_{op}_rows_per_s{suffix}", total / best[f"{op}_t"],
                                           "rows/s", total / best[f"{op}_m"], p))  # fmt: skip
                records.append(BenchRecord(f"tier_{op}_rows_per_s{suffix}_no_prefetch",
                                           total / best[f"{op}_c"], "rows/s",
                                           total / best[f"{op}_m"], p))  # fmt: skip
        all_rows_bytes = rows * tiered.layout.width * 4
        tiered.close()
    del tiered, memory
    gc.collect()
    child = subprocess.run(
        [sys.executable, __file__, "--rss-child", str(rows), str(memory_rows), str(per_round)],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    rss = json.loads(child.stdout.strip().splitlines()[-1])
    bound = rss["base"] + rss["index"] + RSS_SLACK * rss["budget"]
    records.append(
        BenchRecord(
            "tier_peak_rss_bytes",
            float(rss["peak"]),
            "bytes",
            float(bound),
            {
                **params,
                "base_rss": rss["base"],
                "fill_peak_rss": rss["fill_peak"],
                "index_bytes": rss["index"],
                "budget_bytes": rss["budget"],
                "end_rss_anon": rss["anon"],
                "end_rss_file": rss["file"],
                "disk_bytes": rss["disk_bytes"],
                "all_rows_bytes": all_rows_bytes,
            },
        )  # fmt: skip
    )
    return records


def scale_run(
    rows: int, memory_rows: int, steps: int, folder: str, prefetch: bool, compute_ms: float
) -> dict:
    """Fill and train a tiered table through one real server process and sample the
    server's RSS every second (``python bench/tier.py --scale ROWS MEMORY_ROWS STEPS DIR
    [--no-prefetch] [--compute-ms MS]``; ``MEMORY_ROWS`` 0: the table in memory).

    The table (dim 16, Adagrad) gets ``rows`` keys in pushes of 65536, then ``steps``
    training steps (pull + push of a Zipf(1.1) batch of 8192 keys), each preceded by a
    ``prefetch`` of the next batch's keys unless ``prefetch`` is False, with ``compute_ms``
    of sleep between the pull and the push (a worker's forward and backward).
    """
    import threading

    from sparseps.testing import local_cluster

    samples: list[tuple[float, int]] = []
    done = threading.Event()
    with local_cluster(
        servers=1, environ={"SPARSEPS_DISK_DIR": folder}, timeout=120, fork=False
    ) as cluster:  # a fresh interpreter: the RSS sampled is the server's own
        pid = cluster.pid(0)
        start = time.perf_counter()

        def sample() -> None:
            while not done.wait(1.0):
                with open(f"/proc/{pid}/status") as status:
                    for line in status:
                        if line.startswith("VmRSS:"):
                            samples.append(
                                (time.perf_counter() - start, int(line.split()[1]) << 10)
                            )

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        client = cluster.client(timeout=600)
        client.create_table(_config(memory_rows if memory_rows > 0 else None))  # 0: in memory
        keys = _keys(rows)
        zeros = np.zeros((1 << 16, DIM), np.float32)
        for at in range(0, rows, 1 << 16):
            chunk = keys[at : at + (1 << 16)]
            client.push("tier", chunk, zeros[: chunk.size]).wait()
        fill_s = time.perf_counter() - start
        rng = np.random.default_rng(3)
        grads = rng.normal(0, 0.01, (BATCH, DIM)).astype(np.float32)
        train_start = time.perf_counter()
        batches = _batches(rng, keys, steps, zipf=True)
        for i, batch in enumerate(batches):
            # as a worker's pipeline (which sends nothing for an in-memory table)
            if prefetch and memory_rows > 0 and i + 1 < steps:
                client.prefetch("tier", batches[i + 1]).wait()
            client.pull("tier", batch).wait()
            time.sleep(compute_ms / 1000)
            client.push("tier", batch, grads).wait()
        train_s = time.perf_counter() - train_start
        table = client.stats()["servers"][0]["tables"]["tier"]
        with open(f"/proc/{pid}/status") as status:
            peak = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmHWM"))
        done.set()
        client.close()
        result = {
            "rows": rows, "memory_rows": memory_rows, "fill_s": round(fill_s, 1),
            "fill_rows_per_s": round(rows / fill_s), "steps": steps, "prefetch": prefetch, "compute_ms": compute_ms,
            "step_rows_per_s": round(steps * BATCH / train_s), "server_peak_rss": peak,
            "table": table,
            "rss_over_time": [(round(t), r) for t, r in samples[:: max(1, len(samples) // 40)]],
        }  # fmt: skip
        # printed before the server stops: deleting a file of many GB takes it seconds,
        # longer than local_cluster's stop grace
        print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--scale":
    import argparse

    cli = argparse.ArgumentParser(prog="bench/tier.py --scale")
    cli.add_argument("rows", type=int)
    cli.add_argument("memory_rows", type=int)
    cli.add_argument("steps", type=int)
    cli.add_argument("folder")
    cli.add_argument("--no-prefetch", action="store_true")
    cli.add_argument("--compute-ms", type=float, default=0.0)
    a = cli.parse_args(sys.argv[2:])
    scale_run(a.rows, a.memory_rows, a.steps, a.folder, not a.no_prefetch, a.compute_ms)
    os._exit(0)

if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--rss-child":
    print(json.dumps(_rss_child(*(int(a) for a in sys.argv[2:]))))
    sys.stdout.flush()
    os._exit(0)
