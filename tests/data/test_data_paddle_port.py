"""examples/paddle_port: the Paddle-ported DNN job (generator script as pipe_command,
format="multislot") runs alone and trains on every line of PaddleRec's sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "fixtures" / "criteo_slot_sample.txt"


def test_paddle_port_example_trains_every_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARSEPS_", "PADDLE_"))}
    env.pop("TRAINING_ROLE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, str(ROOT / "examples" / "paddle_port" / "train.py"),
            "--train", str(SAMPLE), "--test", str(SAMPLE), "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    lines = sum(1 for line in SAMPLE.read_text().splitlines() if line.strip())
    assert summary["rows"] == summary["test_rows"] == lines
    assert (tmp_path / "ckpt").is_dir() and (tmp_path / "infer").is_dir()
