"""The online job's optional prediction step, with a model and loss named in the config.

A job of 3 passes (checkpoints after seq 1 and at the end of the day) with ``predict``
enabled, ``model.builder`` / ``model.loss`` naming a DNN and a weighted loss. Worker 0
crashes right after the prediction of seq 2 (before its checkpoint): the rerun keeps the
predictions of the checkpointed passes untouched, redoes seq 2's, and in the end every
pass has exactly one complete prediction folder holding each of its samples once, listed
once in the effective ledger.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _onlinetools import BUILDERS, clean_env, online_argv, write_config

from sparseps.errors import ConfigError
from sparseps.online import Ledger, write_stream
from sparseps.online.config import OnlineConfig
from sparseps.testing.crash import CRASH_EXIT_CODE
from sparseps.worker.predict import read_manifest, read_predictions

pytestmark = pytest.mark.timeout(400)

HERE = Path(__file__).resolve().parent
ROWS = 300


def _config(root: Path) -> Path:
    return write_config(
        root / "job.yaml", data_root=root / "data", model_dir=root / "model", days=1,
        passes_per_day=3,
        data={"schema": "criteo"},
        model={"builder": f"{BUILDERS}:dnn", "params": {"emb_dim": 4, "hidden": [8]},
               "loss": f"{BUILDERS}:weighted_bce", "emb_dim": 4, "hidden": [16]},
        save={"checkpoint_every": 2, "keep_checkpoints": 10},
        predict={"enabled": True, "key": "sample_id", "keep": 10},
    )  # fmt: skip


def _crash(config: Path, phase: str, seq: int) -> subprocess.CompletedProcess:
    from sparseps.online.config import load_config
    from sparseps.online.online_cli import launch_argv

    loaded = load_config(config)
    loaded.model_dir.mkdir(parents=True, exist_ok=True)
    argv = launch_argv(loaded, config, script=HERE / "_crash_job.py", script_args=[phase, seq, 1])
    return subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "launch", *argv], env=clean_env(),
        capture_output=True, text=True, timeout=200, cwd=config.parent,
    )  # fmt: skip


def test_predict_step_survives_a_crash(tmp_path):
    write_stream(tmp_path / "data", start_day="20240101", days=1, splits_per_day=3,
                 rows_per_split=ROWS, seed=5)  # fmt: skip
    config = _config(tmp_path)
    crashed = _crash(config, "predicted", 2)
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-2000:]
    predict = tmp_path / "model" / "predict"
    folders = sorted(p.name for p in predict.iterdir())
    assert folders == ["000000-20240101-000", "000001-20240101-001", "000002-20240101-002"]
    kept = {n: (predict / n / "MANIFEST.json").stat().st_mtime_ns for n in folders[:2]}

    done = subprocess.run(online_argv(config), env=clean_env(), capture_output=True, text=True,
                          timeout=200, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name, mtime in kept.items():  # covered by the checkpoint: not redone
        assert (predict / name / "MANIFEST.json").stat().st_mtime_ns == mtime
    records = Ledger.of(tmp_path / "model").passes()
    assert [r["seq"] for r in records] == [0, 1, 2]
    assert [Path(r["saved"]["predict"]["dir"]).name for r in records] == folders
    for record, name in zip(records, folders, strict=True):
        table = read_predictions(predict / name)
        ids = table.column("key").to_numpy()
        assert ids.size == np.unique(ids).size == ROWS == record["predict"]["rows"]
        assert read_manifest(predict / name)["workers"] == 2
        pred = table.column("pred").to_numpy()
        assert ((pred > 0) & (pred < 1)).all()


def test_config_names_any_job(tmp_path):
    base = {"data": {"root": "d"}, "schedule": {"start_day": "20240101"},
            "save": {"model_dir": "m"}}  # fmt: skip
    schema = {"label": "click", "extra_labels": ["buy"], "dense": ["x"], "slots": ["u", "i"],
              "dense_transform": "raw"}  # fmt: skip
    cfg = OnlineConfig.from_dict({**base, "data": {"root": "d", "schema": schema,
                                                   "pipe_command": "cat"}})  # fmt: skip
    built = cfg.data.dataset_schema()
    assert built.labels == ("click", "buy") and built.slots == ("u", "i")
    with pytest.raises(ConfigError, match="data.schema: unknown keys colour"):
        OnlineConfig.from_dict({**base, "data": {"root": "d", "schema": {**schema, "colour": 1}}})
    with pytest.raises(ConfigError, match="model.builder"):
        OnlineConfig.from_dict({**base, "model": {"builder": "no colon"}})
    with pytest.raises(ConfigError, match="predict.typo"):
        OnlineConfig.from_dict({**base, "predict": {"typo": 1}})
    with pytest.raises(ConfigError, match="model.params: only used with model.builder"):
        OnlineConfig.from_dict({**base, "model": {"params": {"a": 1}}})
