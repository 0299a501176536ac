"""fleet.metrics-style numbers over 2 worker processes equal one process's (within 1e-6).

Accuracy (at a threshold), MSE, RMSE, MAE of the global CTRMetrics against the pure
functions on all the data; user statistics (sum / max / min) and ``sps.all_reduce``
against numpy on all the data.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from sparseps.metrics import CTRMetrics, accuracy, mae, mse, rmse
from sparseps.rpc.transport import free_port
from sparseps.testing import run_ranks

WORKER = Path(__file__).with_name("fleet_worker.py")


def test_fleet_metrics_two_workers_equal_one_process(tmp_path):
    spec = importlib.util.spec_from_file_location("fleet_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    CTRMetrics(num_buckets=8).update([0.5], [1])  # compile the kernels once, here
    port = free_port()
    run_ranks(WORKER, 2, lambda r: [r, 2, port, tmp_path / f"{r}.json"], timeout_s=120)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]
    got = results[0]
    pred, label = worker.make_data()
    m = got["metrics"]
    assert m["count"] == worker.N and m["threshold"] == 0.3
    assert m["accuracy"] == pytest.approx(accuracy(pred, label, 0.3), abs=1e-6)
    assert m["mse"] == pytest.approx(mse(pred, label), abs=1e-6)
    assert m["rmse"] == pytest.approx(rmse(pred, label), abs=1e-6)
    assert m["mae"] == pytest.approx(mae(pred, label), abs=1e-6)
    one = CTRMetrics(num_buckets=1024, threshold=0.3)
    one.update(pred, label)
    assert m == pytest.approx(one.compute().to_dict(), abs=1e-6)
    s = got["stats"]
    assert s["clicks"] == pytest.approx(label.sum(), abs=1e-6)
    assert s["max_pred"] == pytest.approx(pred.max(), abs=1e-6)  # a 0-d tensor
    assert s["min_pred"] == pytest.approx(pred.min(), abs=1e-6)
    assert s["per_class"] == [float((label == 0).sum()), float((label == 1).sum())]
    assert s["rank0_only"] == 3.0  # 3 batches on rank 0; rank 1 contributes the identity
    assert got["reduced"] == {"number": 3.0, "array_max": [1.0, 0.0], "tensor_min": [0.5]}


def test_pure_functions_worked_examples():
    assert accuracy([0.2, 0.7, 0.5], [0, 0, 1]) == pytest.approx(2 / 3)
    assert mse([0.5, 1.0], [0.0, 1.0]) == pytest.approx(0.125)
    assert rmse([0.5, 1.0], [0.0, 1.0]) == pytest.approx(np.sqrt(0.125))
    assert mae([0.5, 1.0, 3.0], [0.0, 1.0, 1.0]) == pytest.approx(2.5 / 3)  # regression labels
