"""examples/wide_deep/train.py runs as the issue says: under the launcher, no data given."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "wide_deep" / "train.py"


def _env() -> dict:
    return clean_environ()


def test_quick_start_generates_its_data_and_learns_under_the_launcher(tmp_path):
    cmd = [
        sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1", "--worker-num", "2",
        "--log-dir", "log", str(SCRIPT),
        # small: the defaults (100k rows, 400-400-400) take a few minutes on 2 cores
        "--rows", "20000", "--passes", "2", "--hidden", "32", "--batch-size", "128",
        "--print-period", "0",
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # worker 0 wrote the data set under the default --data-dir, relative to the cwd
    meta = json.loads((tmp_path / "out" / "wide_deep_data" / "meta.json").read_text())
    assert meta["rows"] == 20000 and meta["bayes_auc_test"] > 0.8
    summary = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert summary["rows"] == meta["test_rows"] == 2000  # global: both workers' shares
    # Async mode with two workers: not bit-reproducible. 8 runs on the 2-core machine gave
    # 0.7692 .. 0.7811 (mean 0.7751, sd 0.0036): the 0.7 floor is about 20 sd under the
    # mean. It only says "learned"; it stays loose on purpose while the model defaults are
    # being tuned (docs/training.md), a tight bound would pin today's defaults.
    print(f"\ntest AUC {summary['test_auc']:.4f}")
    assert summary["test_auc"] > 0.7, summary
    assert f"test auc: {summary['test_auc']:.4f}" in done.stdout


def _run_in_process(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """The script's exit code, stdout and stderr for ``argv``, run in this process: both
    cases stop in argument parsing, before any role starts. A fresh interpreter per case
    took 5-13 s of imports here; the quick-start test above runs the script in fresh
    processes (under the launcher) and so still catches a script that fails to import."""
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr()
    return stopped.value.code, out.out, out.err


def test_usage_and_bad_arguments(monkeypatch, capsys):
    code, out, _ = _run_in_process(monkeypatch, capsys, "--help")
    assert code == 0 and out.startswith("usage: train.py")
    assert "--data-dir" in out and "out/wide_deep_data" in out
    code, _, err = _run_in_process(monkeypatch, capsys, "--train", "somewhere")
    assert code == 2 and "give both --train and --test" in err
