"""Sync mode's packed gradient exchange: one buffer per worker carries every table, and
unpacking gives back exactly the arrays packed (the multi-worker path is checked end to
end by test_training_modes: sync equals one process on the global batch)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.worker import sync_exchange


def _grads(rng, sizes):
    out = []
    for name, n, dim in sizes:
        out.append((
            name,
            rng.integers(0, 2**64, n, dtype=np.uint64),
            rng.normal(0, 1, (n, dim)).astype(np.float32),
            rng.integers(0, 3, n).astype(np.float32),
            rng.integers(0, 2, n).astype(np.float32),
        ))  # fmt: skip
    return out


def test_two_workers_buffers_unpack_to_their_arrays_in_rank_order(monkeypatch):
    rng = np.random.default_rng(4)
    tables = [("wide", 1), ("deep", 8)]
    workers = [_grads(rng, [(t, n, d) for (t, d), n in zip(tables, sizes, strict=True)])
               for sizes in ((5, 3), (0, 7))]  # fmt: skip
    packed = [sync_exchange._pack(sorted(w, key=lambda g: g[0])) for w in workers]
    monkeypatch.setattr(
        sync_exchange.collectives, "all_gather_arrays", lambda b, sizes, timeout: packed
    )
    merged = sync_exchange.gather_sparse_grads(workers[0], timeout=1.0)
    assert [m[0] for m in merged] == ["deep", "wide"]  # by name on every worker
    for table, *arrays in merged:
        parts = [next(g for g in w if g[0] == table) for w in workers]
        for i, got in enumerate(arrays):
            want = np.concatenate([p[i + 1] for p in parts])
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_a_worker_with_other_tables_is_named():
    rng = np.random.default_rng(5)
    buffer = sync_exchange._pack(_grads(rng, [("t", 3, 4)]))
    with pytest.raises(RuntimeError, match="different sparse tables"):
        sync_exchange._unpack(buffer, [4, 2])
    with pytest.raises(RuntimeError, match="different sparse tables"):
        sync_exchange._unpack(np.concatenate([buffer, buffer]), [4])
