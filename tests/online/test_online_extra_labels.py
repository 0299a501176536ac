"""The online job trains a two-label model read from files: a schema with ``extra_labels``,
``data.format: multislot``, ``model.builder`` / ``model.loss`` naming a two-head model and a
loss whose first task is the extra label.

1 server + 2 workers, 3 passes. The ledger's metrics are those of the loss's first task, the
``conversion`` column: each pass's positives equal the conversions written in its files (not
the clicks), so the extra label went from the files through the global shuffle into the
loss, and the progressive AUC of the last pass shows the conversion head learned.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from _onlinetools import BUILDERS, clean_env, online_argv, write_config

from sparseps.online import DataLayout, Ledger
from sparseps.online.config import load_config

pytestmark = pytest.mark.timeout(400)

ROWS_PER_FILE = 400
SCHEMA = {"label": "click", "extra_labels": ["conversion"], "dense": ["x"],
          "slots": ["u", "i"], "dense_transform": "raw"}  # fmt: skip


def write_pass(folder: Path, seed: int) -> tuple[int, int, int]:
    """Two multislot files of planted impressions; returns (rows, clicks, conversions).

    Line: ``1 click 1 conversion 1 x 1 u 1 i`` (labels first: the schema's default order).
    Conversion needs a click and depends on the user ``u`` only.
    """
    planted = np.random.default_rng(100)
    w_user, w_item = planted.normal(0, 2.0, 50), planted.normal(0, 1.0, 50)
    rng = np.random.default_rng(seed)
    rows = 2 * ROWS_PER_FILE
    u, i = rng.integers(0, 50, rows), rng.integers(0, 50, rows)
    click = (rng.random(rows) < 1 / (1 + np.exp(-w_item[i]))).astype(int)
    conv = click * (rng.random(rows) < 1 / (1 + np.exp(-w_user[u])))
    x = rng.normal(size=rows).round(3)
    lines = [f"1 {click[r]} 1 {conv[r]} 1 {x[r]} 1 {u[r]} 1 {1000 + i[r]}" for r in range(rows)]
    for f in range(2):
        part = lines[f * ROWS_PER_FILE : (f + 1) * ROWS_PER_FILE]
        (folder / f"part-{f:05d}.txt").write_text("\n".join(part) + "\n")
    (folder / "_SUCCESS").touch()
    return rows, int(click.sum()), int(conv.sum())


def test_online_job_trains_on_two_label_columns(tmp_path):
    config = write_config(
        tmp_path / "job.yaml", data_root=tmp_path / "data", model_dir=tmp_path / "model",
        days=1, passes_per_day=3,
        data={"schema": SCHEMA, "format": "multislot", "batch_size": 64},
        model={"builder": f"{BUILDERS}:two_heads", "params": {"emb_dim": 4},
               "loss": f"{BUILDERS}:ConversionThenClick"},
        save={"delta_every": 0, "checkpoint_every": 3},
    )  # fmt: skip
    layout = DataLayout(load_config(config))
    written = []
    for pass_id in layout.passes():
        (folder,) = layout.splits(pass_id)
        folder.mkdir(parents=True)
        written.append(write_pass(folder, seed=pass_id.seq))

    done = subprocess.run(online_argv(config), env=clean_env(), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    records = Ledger.of(tmp_path / "model").passes()
    assert [r["seq"] for r in records] == [0, 1, 2]
    for record, (rows, clicks, conversions) in zip(records, written, strict=True):
        assert 0 < conversions < clicks  # the columns differ: the counts tell which was read
        assert record["eval"]["count"] == record["train"]["count"] == rows
        assert record["eval"]["clicks"] == record["train"]["clicks"] == conversions
    assert records[-1]["eval"]["auc"] > 0.65, records[-1]["eval"]  # progressive, conversion
