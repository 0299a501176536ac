"""Online job on drifting data: online training beats a frozen model; the inference
chain (base + deltas) reproduces the trainer after every pass."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from _onlinetools import (
    run_online,
    write_config,
)

from sparseps.online import Ledger, write_stream

pytestmark = pytest.mark.timeout(300)


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_online_beats_frozen_on_drift_and_inference_matches(tmp_path):
    data = tmp_path / "data"
    info = write_stream(data, start_day="20240101", days=3, splits_per_day=2, rows_per_split=1500,
                        seed=5, drift=0.9)  # fmt: skip
    online = write_config(tmp_path / "online.yaml", data_root=data, model_dir=tmp_path / "online",
                          days=3, passes_per_day=2,
                          save={"keep_checkpoints": 10, "check_inference": True})  # fmt: skip
    _ok(run_online(online))
    passes = Ledger.of(tmp_path / "online").passes()
    assert [(r["day"], r["pass"]) for r in passes] == [
        (d, p) for d in ("20240101", "20240102", "20240103") for p in (0, 1)
    ]
    # 3: after each pass the base + delta chain reproduces the trainer's predictions
    assert all(r["inference_max_diff"] <= 1e-6 for r in passes)
    assert [sorted(k for k in r["saved"] if k != "checkpoint") for r in passes] == [
        ["base"],
        ["base"],
        ["delta"],
        ["base"],
        ["delta"],
        ["base"],
    ]

    day1 = tmp_path / "online/checkpoints/000001-20240101-001"
    frozen = write_config(tmp_path / "frozen.yaml", data_root=data, model_dir=tmp_path / "frozen",
                          days=2, passes_per_day=2, start_day="20240102",
                          schedule={"evaluate_only": True},
                          model={"init_checkpoint": str(day1)})  # fmt: skip
    _ok(run_online(frozen))
    frozen_passes = Ledger.of(tmp_path / "frozen").passes()
    assert len(frozen_passes) == 4 and not any(r["trained"] for r in frozen_passes)
    assert not (tmp_path / "frozen/checkpoints").exists()
    online_auc = [r["eval"]["auc"] for r in passes[2:]]
    frozen_auc = [r["eval"]["auc"] for r in frozen_passes]
    assert [r["eval"]["count"] for r in passes[2:]] == [r["eval"]["count"] for r in frozen_passes]
    print(f"\nbayes auc per day {info['bayes_auc']}\nprogressive auc days 2-3: online "
          f"{np.round(online_auc, 4).tolist()} (mean {np.mean(online_auc):.4f}), frozen after "
          f"day 1 {np.round(frozen_auc, 4).tolist()} (mean {np.mean(frozen_auc):.4f})")  # fmt: skip
    assert np.mean(online_auc) > np.mean(frozen_auc) + 0.01
    assert online_auc[-1] > frozen_auc[-1]
