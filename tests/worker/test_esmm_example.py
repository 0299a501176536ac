"""examples/esmm: a two-task (CTR, CTCVR) model reports one AUC per task, both learned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_esmm_example_reports_an_auc_per_task():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples/esmm/train.py"), "--rows", "12000", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["test_count_ctr"] == summary["test_count_ctcvr"] == 3000
    assert summary["test_auc_ctr"] > 0.7, summary
    assert summary["test_auc_ctcvr"] > 0.7, summary
