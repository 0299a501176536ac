"""Online job: a split whose done-marker never appears stops the job cleanly."""

from __future__ import annotations

import json
import subprocess

import pytest
from _onlinetools import (
    run_online,
    write_config,
)

from sparseps.online import Ledger, write_stream
from sparseps.online.model_dir import ModelDir

pytestmark = pytest.mark.timeout(300)


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_missing_done_marker_stops_with_clear_message(tmp_path):
    data = tmp_path / "data"
    write_stream(data, start_day="20240101", days=1, splits_per_day=4, rows_per_split=400,
                 seed=7, skip=(("20240101", 2),))  # fmt: skip
    cfg = write_config(tmp_path / "job.yaml", data_root=data, model_dir=tmp_path / "model",
                       days=1, passes_per_day=4, data={"wait_timeout_s": 2})  # fmt: skip
    result = run_online(cfg)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    print(f"\n{last}")
    assert last.startswith("sparseps online: error:")
    assert str(data / "20240101" / "0010") in last and "_SUCCESS" in last
    assert "data.wait_timeout_s" in last
    model = ModelDir(tmp_path / "model")
    status = json.loads(model.status_path.read_text())
    assert status["state"] == "failed" and "0010" in status["error"]
    # the ledger and the newest checkpoint agree: passes 0 and 1 done, nothing of pass 2
    ledger = Ledger.of(tmp_path / "model")
    assert [r["seq"] for r in ledger.passes()] == [0, 1]
    assert model.latest_checkpoint()[1]["online"]["seq"] == 1
    assert not any("000002" in p.name for p in model.checkpoints.iterdir())

    # the producer catches up: the same command resumes and finishes
    (data / "20240101" / "0010" / "_SUCCESS").touch()
    _ok(run_online(cfg))
    assert [r["seq"] for r in ledger.passes()] == [0, 1, 2, 3]
    assert json.loads(model.status_path.read_text())["state"] == "completed"
