"""Sync-mode training over the secure group equals training over gloo, bit for bit.

The same seeded sync-mode job (1 server + 2 workers, wide&deep, 2 passes; the dense
gradients all-reduced every step, the sparse ones all-gathered, the metrics all-reduced at
the end) runs once plain (gloo) and once with ``--secure`` (the CURVE group). With two
workers a sum has one order, so every dense parameter must end with the same bytes and
the global test AUC must be the same number.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparseps.testing.jobs import run_launch

pytestmark = pytest.mark.timeout(600)

SCRIPT = Path(__file__).resolve().parent / "scripts" / "sync_job.py"


def _train(tmp_path: Path, data: Path, name: str, *options: str) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    done = run_launch(
        "--server-num", "1", "--worker-num", "2", *options, "--log-dir", str(out / "log"),
        str(SCRIPT), str(data / "train"), str(data / "test"), str(out),
        cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"worker.{rank}.json").read_text()) for rank in (0, 1)]


def test_secure_sync_training_equals_plain_bit_for_bit(tmp_path):
    from sparseps.data.synthetic import write_dataset

    data = tmp_path / "data"
    write_dataset(data, rows=20_000, seed=7, files=4)
    plain = _train(tmp_path, data, "plain")
    secure = _train(tmp_path, data, "secure", "--secure")
    print(f"\nplain {plain[0]}\nsecure {secure[0]}")
    assert [r["backend"] for r in plain + secure] == ["gloo"] * 2 + ["sparseps_curve"] * 2
    for record in plain + secure:  # every worker of both jobs holds the same model
        assert record["dense_sha256"] == plain[0]["dense_sha256"], (plain, secure)
        assert record["test_auc"] == plain[0]["test_auc"], (plain, secure)
    assert plain[0]["test_auc"] > 0.7  # it learnt something
