"""Two-tower recall on planted data, 2 workers, then ``sparseps build-index`` and queries.

Planted: users and items fall in clusters; a user engages with items of its own cluster.
The launched job (1 server + 2 workers) trains TwoTower with in-batch negatives and dumps
item and user vectors with ``unique_keys``. Checked: every item is dumped exactly once
(over both workers, though both saw most items); the faiss IVF index's top-10 overlaps
the brute-force top-10 over the same vectors by >= 0.95; the model learned the clusters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

faiss = pytest.importorskip("faiss", reason="the recall extra: pip install sparseps[recall]")

from sparseps.recall import RecallIndex, brute_force_top_k, recall_at_k  # noqa: E402
from sparseps.testing.jobs import clean_env, launch_argv  # noqa: E402
from sparseps.worker.predict import read_manifest, read_predictions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("two_tower_job.py")

CLUSTERS, USERS, ITEMS, ROWS = 10, 300, 200, 2500


def _write_data(folder: Path) -> dict[int, int]:
    rng = np.random.default_rng(0)
    user_cluster = rng.integers(0, CLUSTERS, USERS)
    item_cluster = np.arange(ITEMS) % CLUSTERS
    for part in range(2):
        users = rng.integers(0, USERS, ROWS)
        # a random item of the user's cluster: cluster c holds items c, c + 10, ...
        picks = rng.integers(0, ITEMS // CLUSTERS, ROWS) * CLUSTERS + user_cluster[users]
        table = pa.table({
            "label": np.ones(ROWS, np.float32),
            "user": (users + 1_000_000).astype(np.int64),
            "item": (picks + 2_000_000).astype(np.int64),
            "item_cat": (item_cluster[picks] + 3_000_000).astype(np.int64),
        })  # fmt: skip
        pq.write_table(table, folder / f"train-{part}.parquet")
    return {u + 1_000_000: int(c) for u, c in enumerate(user_cluster)}


def test_two_tower_recall_two_workers(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    user_cluster = _write_data(data)
    run = subprocess.run(
        launch_argv("--server-num", "1", "--worker-num", "2", "--log-dir", str(tmp_path / "log"),
                    str(JOB), str(data), str(out)),
        env=clean_env(), capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    logs = "".join(p.read_text()[-3000:] for p in (tmp_path / "log").glob("*.log"))
    assert run.returncode == 0, run.stderr[-3000:] + logs
    summary = json.loads((out / "summary.json").read_text())
    assert summary["losses"][-1] < summary["losses"][0]

    # each item exactly once, over both workers' parts
    manifest = read_manifest(out / "items")
    assert {p["worker"] for p in manifest["parts"]} == {0, 1}
    items = read_predictions(out / "items")
    keys = items.column("key").to_numpy()
    assert keys.size == np.unique(keys).size == ITEMS == summary["items"]

    index_dir = tmp_path / "index"
    built = subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "build-index", str(out / "items"), "--out",
         str(index_dir), "--kind", "ivf", "--nlist", "16", "--nprobe", "4", "--json"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout.strip().splitlines()[-1])["items"] == ITEMS

    users = read_predictions(out / "users")
    user_keys = users.column("key").to_numpy()
    queries = np.stack(users.column("user_vec").to_numpy(zero_copy_only=False)).astype(np.float32)
    vectors = np.stack(items.column("item_vec").to_numpy(zero_copy_only=False)).astype(np.float32)
    found, scores = RecallIndex(index_dir).search(queries, 10)
    exact = brute_force_top_k(queries, keys, vectors, 10)
    assert recall_at_k(found, exact) >= 0.95
    # the towers learned the planted clusters: most exact top-10 items are the user's cluster
    wanted = np.array([user_cluster[int(u)] for u in user_keys])
    same = ((exact.astype(np.int64) - 2_000_000) % CLUSTERS) == wanted[:, None]
    assert same.mean() > 0.6, same.mean()


def test_missing_faiss_names_the_extra(monkeypatch, tmp_path):
    from sparseps.errors import ConfigError
    from sparseps.recall import build_index

    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    with pytest.raises(ConfigError, match=r"pip install sparseps\[recall\]"):
        build_index(tmp_path, tmp_path / "index")
