"""Checkpoint save/load speed of a 5M-row table against plain numpy file IO.

A real server (``local_cluster(servers=1)``) holds a 5M-row Adagrad table of dim 16; we
time ``client.save`` (Arrow IPC shard files, uncompressed, fsynced, with checksums and an
atomic rename; see ``sparseps/files/shards.py``) and ``client.load`` into a fresh table,
and, in the same run, ``ndarray.tofile`` / ``np.fromfile`` of the same columns (the bytes
a checkpoint must hold, fsynced, with no format, checksum, table export/import or
routing). Parquet, the first format, was ~30x slower to write for the fixed-size-list
columns (bench/RESULTS.md).
Records ``save_mb_per_s`` and ``load_mb_per_s`` (MB = 1e6 bytes of row payload), each the
best of three runs against the best of three baseline runs made beside them. The save
computes SHA-256 and xxh3-128 of each file in one read, beside its fsync; the load verifies
the xxh3-128 (in a thread beside the import), so ``xxh3_128_mb_per_s`` (the same shard file,
same run) is a floor under its time on 2 cores. ``load_sha256_mb_per_s`` loads the same
files from records without ``xxh3_128`` (a save made before it was recorded: verified by
SHA-256, ``sha256_mb_per_s`` on one core), beside the same numpy baseline.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from sparseps.benchmarking import BenchRecord

ROWS, QUICK_ROWS = 5_000_000, 500_000
DIM = 16
BATCH = 1 << 16
REPEATS = 3


def _numpy_save(columns: dict, folder: Path) -> float:
    start = time.perf_counter()
    for name, values in columns.items():
        with open(folder / f"{name}.bin", "wb") as f:
            values.tofile(f)
            f.flush()
            os.fsync(f.fileno())  # a checkpoint must be durable: same as the shard writer
    return time.perf_counter() - start


def _numpy_load(columns: dict, folder: Path) -> float:
    start = time.perf_counter()
    for name, values in columns.items():
        np.fromfile(folder / f"{name}.bin", dtype=values.dtype)
    return time.perf_counter() - start


def run(quick: bool = False) -> list[BenchRecord]:
    import sparseps as sps
    from sparseps.files import shards
    from sparseps.table import SparseTable
    from sparseps.testing import local_cluster

    rows = QUICK_ROWS if quick else ROWS
    config = sps.TableConfig(name="emb", dim=DIM, rule=sps.optim.Adagrad(lr=0.05))
    keys = np.random.default_rng(0).permutation(
        np.arange(1, rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    )
    reference = SparseTable(config)
    for start in range(0, rows, BATCH):
        chunk = keys[start : start + BATCH]
        reference.push(chunk, np.full((chunk.size, DIM), 0.01, np.float32))
    columns = reference.export_rows()
    payload = sum(v.nbytes for v in columns.values())
    del reference
    folder = Path(tempfile.mkdtemp(prefix="sparseps-bench-save-"))
    (folder / "npy").mkdir()
    # Best of REPEATS, each run beside its numpy baseline: on a shared 2-core machine one
    # run of either swings several-fold with what else runs (and with first-touch memory)
    save_s = np_save_s = load_s = np_load_s = old_load_s = float("inf")
    try:
        with local_cluster(servers=1, timeout=60) as cluster, cluster.client() as client:
            client.create_table(config)
            for start in range(0, rows, BATCH):
                chunk = keys[start : start + BATCH]
                client.push("emb", chunk, np.full((chunk.size, DIM), 0.01, np.float32)).wait()
            for _ in range(REPEATS):
                start = time.perf_counter()
                records = client.save("emb", folder / "ckpt", timeout=600)
                save_s = min(save_s, time.perf_counter() - start)
                np_save_s = min(np_save_s, _numpy_save(columns, folder / "npy"))
            client.create_table(
                sps.TableConfig(name="emb2", dim=DIM, rule=sps.optim.Adagrad(lr=0.05))
            )
            for _ in range(REPEATS):  # a load replaces: each one restores the checkpoint
                start = time.perf_counter()
                loaded = client.load("emb2", records)
                load_s = min(load_s, time.perf_counter() - start)
                assert loaded["rows"] == rows, loaded
                np_load_s = min(np_load_s, _numpy_load(columns, folder / "npy"))
                # the same files as a save made before xxh3_128 records them: SHA-256
                old_style = [{k: v for k, v in r.items() if k != "xxh3_128"} for r in records]
                start = time.perf_counter()
                client.load("emb2", old_style)
                old_load_s = min(old_load_s, time.perf_counter() - start)
        shard = next(r for r in records if r["kind"] == "rows")
        checksum_mb_per_s = {}
        for kind in shards.CHECKSUMS:
            start = time.perf_counter()
            shards.checksums_of(shard["path"], (kind,))
            checksum_mb_per_s[kind] = shard["bytes"] / 1e6 / (time.perf_counter() - start)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    mb = payload / 1e6
    params = {"rows": rows, "dim": DIM, "rule": "adagrad", "servers": 1, "mb": round(mb, 1),
              "best_of": REPEATS}  # fmt: skip
    load_params = {**params, **{f"{k}_mb_per_s": round(v) for k, v in checksum_mb_per_s.items()}}
    return [
        BenchRecord("save_mb_per_s", mb / save_s, "MB/s", mb / np_save_s, params),
        BenchRecord("load_mb_per_s", mb / load_s, "MB/s", mb / np_load_s, load_params),
        BenchRecord("load_sha256_mb_per_s", mb / old_load_s, "MB/s", mb / np_load_s, load_params),
    ]
