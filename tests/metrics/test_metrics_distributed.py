"""Global metrics over 3 worker processes (gloo on loopback) equal one process's metrics.

The data set is split unevenly (one worker even gets no samples in one scenario); the
global result must be *exactly* (==, every field) the result of one accumulator that saw
all the data, UAUC/GAUC included. A last step checks that a worker missing from the
collective makes the others fail with a timeout instead of hanging.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from sparseps.metrics import CTRMetrics
from sparseps.rpc.transport import free_port
from sparseps.testing import run_ranks

WORKER = Path(__file__).with_name("metrics_worker.py")
WORLD = 3
DEADLINE_S = 180


def _load_worker_module():
    spec = importlib.util.spec_from_file_location("metrics_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    warm = CTRMetrics(num_buckets=8)  # compile (and cache) the kernels once, here, not 3 times
    warm.update([0.5], [1])
    warm.compute()
    port = free_port()
    argv = lambda rank: [rank, WORLD, port, out / f"{rank}.json"]  # noqa: E731
    run_ranks(WORKER, WORLD, argv, timeout_s=DEADLINE_S)
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(WORLD)]


def test_global_grouped_metrics_equal_single_process_exactly(worker_results):
    w = _load_worker_module()
    pred, label, users = w.make_data()
    single = CTRMetrics()
    single.update(pred, label, users)
    expected = single.compute().to_dict()
    assert expected["groups"] > 300 and expected["uauc"] is not None
    for rank, result in enumerate(worker_results):
        assert result["grouped"] == expected, f"rank {rank}"
    splits = w.GROUPED_SPLITS
    assert [r["local_count"] for r in worker_results] == list(np.diff(splits))


def test_global_metrics_with_an_empty_worker_equal_single_process(worker_results):
    w = _load_worker_module()
    pred, label, _ = w.make_data()
    single = CTRMetrics(num_buckets=4096)
    single.update(pred, label)
    expected = single.compute().to_dict()
    assert expected["count"] == w.N and expected["uauc"] is None
    for rank, result in enumerate(worker_results):
        assert result["plain"] == expected, f"rank {rank}"


def test_missing_worker_gives_a_bounded_timeout(worker_results):
    probes = [(r["probe"], r.get("probe_s")) for r in worker_results]
    assert probes[-1] == ("skipped", None)
    for name, seconds in probes[:-1]:
        assert name == "DeadlineError"
        assert seconds < 2.0 + 4.0  # the 2 s limit plus slack for a loaded machine
    assert worker_results[0]["probe_setting"] == "timeout argument of CTRMetrics.compute()"
