"""A trainer that trained past its checkpoint and then loads it (a worker-group restart:
the servers kept their tables, docs/launch.md) holds exactly what a fresh job that loads
the same checkpoint holds: same rows, optimizer state, counters, pending keys and dense
model, bit for bit. Before loads restored, the rows made after the checkpoint survived."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_trainer_model_files import run_job  # the test folder is on sys.path

from sparseps.files.shards import read_shard

pytestmark = pytest.mark.timeout(300)


def _contents(folder: Path) -> dict:
    """Every shard file's columns, merged per (table, kind) and sorted by key; dense arrays."""
    parts: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(folder.glob("*.arrow")):
        meta, columns = read_shard(str(path))
        parts.setdefault((meta["table"], meta["kind"]), []).append(columns)
    out = {}
    for name, shards in parts.items():
        merged = {c: np.concatenate([s[c] for s in shards]) for c in shards[0]}
        order = np.argsort(merged["key"], kind="stable")
        out[name] = {c: v[order] for c, v in merged.items()}
    with np.load(folder / "dense.npz") as dense:
        out["dense"] = {k: dense[k] for k in dense.files}
    return out


def test_loading_after_training_further_equals_a_fresh_load(tmp_path):
    from sparseps.data.synthetic import write_dataset

    data = tmp_path / "data"
    write_dataset(data, rows=800, seed=5, files=2, test_rows=200)
    # admission by count keeps pending keys in play; the second pass creates new rows
    options = ("--admission", "count", "--admit-count", "2")
    a, resumed, fresh = tmp_path / "a", tmp_path / "resumed", tmp_path / "fresh"
    run_job(
        tmp_path / "w1",
        data,
        ["train", f"save={a}", "train", f"load={a}", f"save={resumed}"],
        *options,
    )
    run_job(tmp_path / "w2", data, [f"load={a}", f"save={fresh}"], *options)
    got, want, saved = _contents(resumed), _contents(fresh), _contents(a)
    assert got.keys() == want.keys() == saved.keys()
    for name in want:
        assert got[name].keys() == want[name].keys(), name
        for column in want[name]:
            np.testing.assert_array_equal(got[name][column], want[name][column], f"{name} {column}")
            np.testing.assert_array_equal(
                got[name][column], saved[name][column], f"{name} {column}"
            )
    assert any(len(v["key"]) for k, v in want.items() if k != "dense" and k[1] == "pending")
