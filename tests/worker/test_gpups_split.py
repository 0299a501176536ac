"""GPUPS over servers whose tables live mostly on disk, with passes split by a small
device budget: the same model as sync mode with every row in memory.

One worker, one server (local_cluster) whose tables keep 10% of their rows in memory
(``memory_rows``, the rest in the disk tier under ``SPARSEPS_DISK_DIR``): two GPUPS
passes, each over ``GpuPS.memory_bytes`` (a third of the pass's bytes), so each is cut
into sub-passes, equal two sync passes over in-memory tables (every saved column of
every row: embedding, optimizer state, show, click; dense parameters; predictions),
within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.files import shards
from sparseps.models import WideDeep
from sparseps.testing import local_cluster
from sparseps.worker.gpups_table import bytes_per_key

pytestmark = pytest.mark.timeout(300)

SLOTS = ("C1", "C2", "C3")
TABLES = ("deep_emb", "wide_emb")


def _model(memory_rows: int | None, lifecycle: sps.Lifecycle | None = None) -> WideDeep:
    torch.manual_seed(0)
    kwargs = {} if lifecycle is None else {"lifecycle": lifecycle}
    return WideDeep(SLOTS, 2, emb_dim=4, hidden=(8,), memory_rows=memory_rows, **kwargs)


def _train(batches, strategy, environ: dict, memory_rows, folder, lifecycle=None):
    """Two passes; returns (every table's saved columns by key, dense, predictions, timings)."""
    model = _model(memory_rows, lifecycle)
    with local_cluster(servers=1, environ=environ) as cluster:
        client = cluster.client()
        trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), strategy, client=client)
        timings = [trainer.train_from_dataset(batches, print_period=0).timings for _ in range(2)]
        predictions = trainer.infer_from_dataset(batches).predictions
        tables = {}
        for name in TABLES:
            records = client.save(name, folder / name)
            rows = [r for r in records if r.get("kind") == "rows"]
            _, columns = shards.read_shard(rows[0]["path"])
            order = np.argsort(columns["key"])
            tables[name] = {column: values[order] for column, values in columns.items()}
        dense = np.concatenate([p.detach().cpu().numpy().ravel() for p in model.parameters()])
        stats = client.stats()["servers"][0]["tables"]
        trainer.stop()
        client.close()
    return tables, dense, predictions, timings, stats


def _compare(want, got):
    for name, columns in want[0].items():
        for column, values in columns.items():
            if column in ("key", "unseen_days"):
                np.testing.assert_array_equal(got[0][name][column], values, f"{name}.{column}")
            elif values.dtype.kind == "f":
                np.testing.assert_allclose(
                    got[0][name][column], values, rtol=1e-5, atol=1e-6, err_msg=f"{name}.{column}"
                )
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)  # dense parameters
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-6)  # predictions


def test_split_gpups_passes_over_a_disk_tier_equal_sync_passes(tmp_path, planted):
    batches = planted(5, 12, 64, SLOTS, vocab=400)
    keys = np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))
    sync = _train(batches, sps.Strategy(mode="sync"), {}, None, tmp_path / "sync")
    config = _model(None).embeddings[0].config
    budget = 2 * keys.size * bytes_per_key(config) // 3  # both tables: a third of the pass
    disk = tmp_path / "disk"
    disk.mkdir()
    memory_rows = keys.size // 10
    strategy = sps.Strategy(mode=sps.GpuPS(device="cpu", memory_bytes=budget))
    gpups = _train(batches, strategy, {"SPARSEPS_DISK_DIR": str(disk)}, memory_rows,
                   tmp_path / "gpups")  # fmt: skip
    assert all(t["sub_passes"] >= 3 for t in gpups[3]), gpups[3]
    assert gpups[4]["deep_emb"]["disk_rows"] > gpups[4]["deep_emb"]["memory_rows"]  # most on disk
    assert sync[0]["deep_emb"]["key"].size == keys.size
    _compare(sync, gpups)


ADMISSIONS = {
    "count": sps.Lifecycle(admission="count", admit_count=4),
    "score": sps.Lifecycle(admission="score", admit_score=3.0),
    "probability": sps.Lifecycle(admission="probability", admit_probability=0.3),
}


@pytest.mark.parametrize("kind", list(ADMISSIONS))
def test_gpups_under_admission_over_a_disk_tier_and_sub_passes_equals_sync(tmp_path, planted,
                                                                           kind):  # fmt: skip
    """Each admission kind on: pending keys are admitted on the device at the step the
    server would admit them (count, score: their counters before the pass plus the
    pass's; probability: the server's draw of the key at the attempt of its shows before
    the step), their rows and the pending keys' counters equal sync mode's after two
    passes split in sub-passes."""
    batches = planted(7, 12, 64, SLOTS, vocab=400)
    lifecycle = ADMISSIONS[kind]
    sync = _train(batches, sps.Strategy(mode="sync"), {}, None, tmp_path / "sync", lifecycle)
    keys = np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))
    rows = sync[0]["deep_emb"]["key"].size
    assert 0 < rows < keys.size, "some keys must stay pending after the two passes"
    config = _model(None).embeddings[0].config
    disk = tmp_path / "disk"
    disk.mkdir()
    strategy = sps.Strategy(
        mode=sps.GpuPS(device="cpu", memory_bytes=2 * keys.size * bytes_per_key(config) // 3)
    )
    gpups = _train(batches, strategy, {"SPARSEPS_DISK_DIR": str(disk)}, keys.size // 10,
                   tmp_path / "gpups", lifecycle)  # fmt: skip
    assert all(t["sub_passes"] >= 3 for t in gpups[3]), gpups[3]
    _compare(sync, gpups)
    for name in TABLES:  # the keys still pending hold the same counters
        assert gpups[4][name]["pending"] == sync[4][name]["pending"] > 0
