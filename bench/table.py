"""Sparse table engine: pull and push rows/s against numpy on the same rows, memory per row.

Records (``sparseps bench table [--quick] [--json]``), for dim 8, 16 and 64 with Adagrad:

- ``pull_rows_per_s``: ``SparseTable.pull`` (hash find + gather, fresh output) of Zipf
  batches of 8192 keys from a table of 10M live keys (quick: 1M). Baseline: the numpy
  fancy-index gather ``storage[ids, :dim]`` of the *same row indices* from the table's
  own storage matrix, i.e. the same memory layout with the hashing already done.
- ``push_rows_per_s``: ``SparseTable.push`` (merge repeated keys + find + statistics +
  fused Adagrad update). Baseline: the numpy multi-pass version on the same row indices
  (``np.unique`` + ``np.add.at`` to merge, then gather / compute / scatter of weights and
  accumulators; it skips the statistics the table also updates).
- ``bytes_per_row``: table bytes (storage, hash index, free lists) / live rows after
  inserting every key through ``push`` (the growth path, no ``reserve``). Baseline: the
  payload, 8-byte key + embedding + optimizer state + 4 statistics floats.

Keys are splitmix64 of 0..N-1 (distinct, spread over the whole uint64 range); batch keys
are ``keys[mix(rank) % N]`` for ``rank ~ Zipf(1.1)``, so hot keys are scattered in memory.
Timings are the best of 5 rounds over all batches, table and baseline timed alternately
(the machine is shared).
Targets: pull >= 0.5x, push >= 1.0x, bytes <= 1.5x payload.

Then the CTR accessor's memory (``bench/_table_memory.py``, issue 54), at embedx dim 8
and 64 on a Zipf(1.1) stream of 10M distinct ids (quick: 1M):

- ``bytes_per_feature``: a split table's bytes per live feature (embedx part stored for
  the 10-20% of ids whose score reaches the threshold). Baseline: today's full-row layout
  (dim D, Adagrad) on the same stream. Targets: <= 0.5x at dim 8, <= 0.25x at dim 64.
- ``bytes_per_feature_vs_paddle``: the same against Paddle's ``CtrCommonAccessor``
  layout, computed from its field list (target <= 1x).
"""

from __future__ import annotations

import gc
import importlib.util
import time
from pathlib import Path

import numpy as np

from sparseps import optim
from sparseps.benchmarking import BenchRecord
from sparseps.config import Initializer, TableConfig
from sparseps.core.hashing import mix64_array
from sparseps.table import SparseTable

BATCH = 8192
ZIPF_A = 1.1
DIMS = (8, 16, 64)
LR, EPS = 0.05, 1e-10


def _best_pair(fn, baseline, rounds: int) -> tuple[float, float]:
    """Best seconds of ``fn`` and of ``baseline``, timed alternately so that a noisy
    neighbour on the shared machine hits both sides alike."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for side, call in enumerate((fn, baseline)):
            start = time.perf_counter()
            call()
            best[side] = min(best[side], time.perf_counter() - start)
    return best[0], best[1]


def _numpy_adagrad(storage: np.ndarray, ids: np.ndarray, grads: np.ndarray, dim: int) -> None:
    """The multi-pass numpy update a table without compiled kernels would do."""
    rows, inverse = np.unique(ids, return_inverse=True)
    merged = np.zeros((rows.size, dim), np.float32)
    np.add.at(merged, inverse, grads)
    acc = storage[rows, dim : 2 * dim] + merged * merged
    weights = storage[rows, :dim] - LR * merged / (np.sqrt(acc) + EPS)
    storage[rows, dim : 2 * dim] = acc
    storage[rows, :dim] = weights


def _one_dim(dim: int, n_keys: int, n_batches: int, rounds: int) -> list[BenchRecord]:
    config = TableConfig(name=f"bench{dim}", dim=dim, rule=optim.Adagrad(lr=LR, eps=EPS),
                         initializer=Initializer.uniform(-0.01, 0.01))  # fmt: skip
    table = SparseTable(config)
    keys = mix64_array(np.arange(n_keys, dtype=np.uint64))
    fill = 1 << 16
    zeros = np.zeros((fill, dim), np.float32)
    start = time.perf_counter()
    for at in range(0, n_keys, fill):
        chunk = keys[at : at + fill]
        table.push(chunk, zeros[: chunk.size])
    fill_s = time.perf_counter() - start
    assert len(table) == n_keys

    rng = np.random.default_rng(dim)
    ranks = [rng.zipf(ZIPF_A, BATCH).astype(np.uint64) for _ in range(n_batches)]
    batches = [np.ascontiguousarray(keys[mix64_array(r) % np.uint64(n_keys)]) for r in ranks]
    grads = [rng.normal(0, 0.01, (BATCH, dim)).astype(np.float32) for _ in range(n_batches)]
    ids = [table._storage.index.find(b) for b in batches]  # the baselines get the rows for free
    unique_frac = float(np.mean([np.unique(b).size / BATCH for b in batches]))
    storage = table._storage.rows
    total = n_batches * BATCH

    def pull():
        for b in batches:
            table.pull(b)

    def gather():
        for i in ids:
            storage[i, :dim]

    def push():
        for b, g in zip(batches, grads, strict=True):
            table.push(b, g)

    def update():
        for i, g in zip(ids, grads, strict=True):
            _numpy_adagrad(storage, i, g, dim)

    pull()
    push()  # warm-up: compile / page in
    pull_s, gather_s = _best_pair(pull, gather, rounds)
    push_s, update_s = _best_pair(push, update, rounds)
    assert table._storage.rows is storage  # nothing was inserted while timing

    params = {"dim": dim, "rows": n_keys, "batch": BATCH, "zipf_a": ZIPF_A, "rule": "adagrad",
              "unique_frac": round(unique_frac, 3)}  # fmt: skip
    records = [
        BenchRecord("pull_rows_per_s", total / pull_s, "rows/s", total / gather_s, params),
        BenchRecord("push_rows_per_s", total / push_s, "rows/s", total / update_s, params),
        BenchRecord(
            "bytes_per_row",
            table.nbytes / len(table),
            "bytes",
            float(table.layout.payload_bytes),
            {
                "dim": dim,
                "rows": n_keys,
                "rule": "adagrad",
                "fill_rows_per_s": round(n_keys / fill_s),
            },
        ),
    ]
    return records


def _memory_bench():
    """``bench/_table_memory.py`` (benchmarks are loaded by path, not as a package)."""
    path = Path(__file__).with_name("_table_memory.py")
    spec = importlib.util.spec_from_file_location("sparseps_bench__table_memory", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(quick: bool) -> list[BenchRecord]:
    n_keys = 1_000_000 if quick else 10_000_000
    records = []
    for dim in DIMS:
        records.extend(_one_dim(dim, n_keys, n_batches=24 if quick else 48, rounds=5))
        gc.collect()  # free this dim's table before building the next one
    records.extend(_memory_bench().run(quick))
    return records
