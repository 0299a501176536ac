"""Online job: a split whose done-marker never appears stops the job cleanly; rerun, the
same command resumes and waits for the marker, and while it runs a second ``sparseps
online`` of the folder exits at once; the marker appears and the resumed job finishes.

One scenario serves both tests (each job start costs seconds of imports): the resumed
job is the running job the lock test needs (before, that test ran a job of its own).
The lock's unit tests are in test_online_lock.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from _onlinetools import (
    clean_env,
    online_argv,
    run_online,
    write_config,
)

from sparseps.online import Ledger, write_stream
from sparseps.online.lock import LOCK_NAME
from sparseps.online.model_dir import ModelDir
from sparseps.testing import wait_until

pytestmark = pytest.mark.timeout(400)


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _files(model: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in model.rglob("*") if p.is_file()}


def _status(model: ModelDir) -> dict:
    try:
        return json.loads(model.status_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    """Stop on the missing marker of split 0010; resume (the same model directory, a
    config that waits for the marker) and, while the resumed job waits, run a second
    ``sparseps online``; then write the marker. Returns what each step saw."""
    root = tmp_path_factory.mktemp("missing")
    data, model_dir = root / "data", root / "model"
    write_stream(data, start_day="20240101", days=1, splits_per_day=4, rows_per_split=400,
                 seed=7, skip=(("20240101", 2),))  # fmt: skip
    # delta_every 0: no inference save before the end of the day's base (nothing here
    # reads one): the stopped job never exports its head (~0.2 s of CPU an export, ~1.5 s
    # more for a process's first where no zygote warmed torch.export), the resumed one once
    cfg = write_config(root / "job.yaml", data_root=data, model_dir=model_dir,
                       days=1, passes_per_day=4, data={"wait_timeout_s": 2},
                       save={"delta_every": 0})  # fmt: skip
    seen: dict = {"data": data, "model_dir": model_dir, "stopped": run_online(cfg)}
    model = ModelDir(model_dir)
    seen["stopped_status"] = _status(model)
    seen["stopped_ledger"] = [r["seq"] for r in Ledger.of(model_dir).passes()]
    latest = model.latest_checkpoint()
    seen["stopped_latest"] = None if latest is None else latest[1]["online"]["seq"]
    seen["stopped_checkpoints"] = sorted(p.name for p in model.checkpoints.iterdir())
    if seen["stopped"].returncode == 0:
        return seen  # test_missing... fails on it; nothing waits for the marker now

    # the producer is late, not gone: the same job, waiting long enough
    waiting = write_config(root / "wait.yaml", data_root=data, model_dir=model_dir,
                           days=1, passes_per_day=4, data={"wait_timeout_s": 120},
                           save={"delta_every": 0})  # fmt: skip
    first = subprocess.Popen(online_argv(waiting), env=clean_env(), cwd=root, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    seen["first_pid"] = first.pid
    try:
        # worker 0 resumed (holding the folder too) and marked the job running: it waits
        # for split 0010 now
        def waiting_for_the_split() -> bool:
            assert first.poll() is None, ("the resumed job ended", first.communicate(timeout=10))
            return _status(model).get("state") == "running"

        wait_until(waiting_for_the_split, 120, "the resumed job to wait for split 0010", 0.2)
        seen["holder"] = json.loads((model_dir / LOCK_NAME).read_text())
        seen["before"] = _files(model_dir)
        start = time.monotonic()
        seen["second"] = run_online(waiting, timeout=60)
        seen["second_took"] = time.monotonic() - start
        seen["after_second"] = _files(model_dir)
        (data / "20240101" / "0010" / "_SUCCESS").touch()
        out, err = first.communicate(timeout=150)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    seen["resumed"] = subprocess.CompletedProcess(first.args, first.returncode, out, err)
    seen["final_ledger"] = [r["seq"] for r in Ledger.of(model_dir).passes()]
    seen["final_status"] = _status(model)
    return seen


def test_missing_done_marker_stops_with_clear_message(scenario):
    data, result = scenario["data"], scenario["stopped"]
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    print(f"\n{last}")
    assert last.startswith("sparseps online: error:")
    assert str(data / "20240101" / "0010") in last and "_SUCCESS" in last
    assert "data.wait_timeout_s" in last
    status = scenario["stopped_status"]
    assert status["state"] == "failed" and "0010" in status["error"]
    # the ledger and the newest checkpoint agree: passes 0 and 1 done, nothing of pass 2
    assert scenario["stopped_ledger"] == [0, 1]
    assert scenario["stopped_latest"] == 1
    assert not any("000002" in name for name in scenario["stopped_checkpoints"])

    # the producer catches up: the same command resumes and finishes
    _ok(scenario["resumed"])
    assert scenario["final_ledger"] == [0, 1, 2, 3]
    assert scenario["final_status"]["state"] == "completed"


def test_a_second_sparseps_online_exits_at_once_while_the_first_runs(scenario):
    """(Moved here from test_online_lock.py: the running job is the resumed one above.)"""
    model, first_pid = scenario["model_dir"], scenario["first_pid"]
    assert scenario["holder"]["pid"] == first_pid
    second = scenario["second"]
    assert second.returncode == 1, second.stderr
    assert scenario["second_took"] < 20, scenario["second_took"]  # no launch: it stops first
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith("sparseps online: error: model directory ")
    assert str(model) in lines[0] and f"pid {first_pid} on host" in lines[0]
    # the first job's files (its logs, pids.json and ledger included) are as they were
    before, now = scenario["before"], scenario["after_second"]
    changed = {p for p in before if now.get(p) != before[p]}
    assert changed <= {p for p in before if p.suffix == ".log"}  # the first job logs on
    _ok(scenario["resumed"])
    assert scenario["final_ledger"] == [0, 1, 2, 3]
