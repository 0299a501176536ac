"""A worker training a model whose tables have a memory budget: its pipeline sends each
batch's keys ahead (``prefetch``), the server promotes their disk rows in the background,
and the trained model is exactly the model trained with every row in memory (sync mode,
one worker: deterministic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.files import shards
from sparseps.models import WideDeep
from sparseps.testing import local_cluster

pytestmark = pytest.mark.timeout(180)

SLOTS = ("C1", "C2", "C3")


def _train(batches, environ: dict, memory_rows: int | None, folder):
    """Train one pass; returns (every table's saved columns by key, the server's stats)."""
    torch.manual_seed(0)
    model = WideDeep(SLOTS, 2, emb_dim=4, hidden=(8,), memory_rows=memory_rows)
    with local_cluster(servers=1, environ=environ) as cluster:
        client = cluster.client()
        trainer = sps.Trainer(model, strategy=sps.Strategy(mode="sync"), client=client)
        trainer.train_from_dataset(batches, print_period=0)
        tables = {}
        for name in ("deep_emb", "wide_emb"):
            records = client.save(name, folder / name)
            rows = [r for r in records if r.get("kind") == "rows"]
            assert len(rows) == 1, records
            _, columns = shards.read_shard(rows[0]["path"])
            order = np.argsort(columns["key"])
            tables[name] = {column: values[order] for column, values in columns.items()}
        stats = client.stats()["servers"][0]
        trainer.stop()
        client.close()
    return tables, stats


def test_prefetched_tiered_training_equals_in_memory_training(tmp_path, planted):
    batches = planted(3, 12, 64, SLOTS, vocab=400)
    expected, _ = _train(batches, {}, None, tmp_path / "memory")
    disk = tmp_path / "disk"
    disk.mkdir()
    got, stats = _train(batches, {"SPARSEPS_DISK_DIR": str(disk)}, 64, tmp_path / "tiered")
    for name, columns in expected.items():
        assert columns["key"].size > 500, "the tables must be several times the budget"
        for column, values in columns.items():
            np.testing.assert_array_equal(got[name][column], values, f"{name}.{column}")
    table = stats["tables"]["deep_emb"]
    assert table["disk_rows"] > table["memory_rows"], "most rows must live on disk"
    # one prefetch per batch and table, every one handled, rows promoted ahead of pulls
    assert stats["prefetch"]["requests"] == 2 * len(batches)
    assert stats["prefetch"]["failed"] == 0
    assert table["prefetched"] > 0
