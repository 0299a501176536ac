"""One job per model directory: a second job on a locked folder fails at once, naming the
folder and the holder, and touches nothing; the lock dies with its holder.

The same with two real ``sparseps online`` commands is
test_online_missing.py::test_a_second_sparseps_online_exits_at_once_while_the_first_runs
(the resumed job of that module's scenario is the running job it needs).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _fakes import FakeDriver, FakeTrainer, fake_config
from _onlinetools import clean_env

from sparseps.online.lock import LOCK_NAME, ModelDirBusyError, ModelDirLock

pytestmark = pytest.mark.timeout(300)


def _hold(model_dir: Path, *, spawn: str = "", job_id: str | None = None) -> subprocess.Popen:
    """A process that takes the lock (for ``job_id``), says ``locked`` and sleeps; with
    ``spawn``, it then runs that code in a child of its own (which prints the child's verdict)."""
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        from sparseps.online.lock import ModelDirLock
        lock = ModelDirLock({str(model_dir)!r}, what="test holder", job_id={job_id!r}).acquire()
        print("locked", flush=True)
        if {spawn!r}:
            sys.exit(subprocess.run([sys.executable, "-c", {spawn!r}]).returncode)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=clean_env(), text=True,
                            stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _first_jobs_files(model_dir: Path) -> dict[Path, bytes]:
    """What a running job has in its folder: an in-progress save and a ledger."""
    saving = model_dir / "checkpoints" / "000003-20240101-003"
    saving.mkdir(parents=True)
    (saving / "part-0.arrow").write_bytes(b"half written")
    (model_dir / "checkpoints" / ".staging-x").mkdir()
    record = {"kind": "pass", "seq": 0, "day": "20240101", "pass": 0, "splits": [], "eval": {}}
    (model_dir / "ledger.jsonl").write_text(json.dumps(record) + "\n")
    return {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file() and p.name != LOCK_NAME}


def _unchanged(model_dir: Path, before: dict[Path, bytes]) -> None:
    now = {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file() and p.name != LOCK_NAME}
    assert now == before
    assert (model_dir / "checkpoints" / ".staging-x").is_dir()


def test_a_second_driver_fails_fast_and_touches_nothing_until_the_holder_dies(tmp_path):
    config = fake_config(tmp_path, days=1, passes_per_day=2)
    before = _first_jobs_files(config.model_dir)
    holder = _hold(config.model_dir)
    try:
        trainer = FakeTrainer()
        start = time.monotonic()
        with pytest.raises(ModelDirBusyError) as err:
            FakeDriver(config, trainer).run()
        assert time.monotonic() - start < 10  # at once (the lock is not retried), not a hang
        text = str(err.value)
        assert "\n" not in text and str(config.model_dir) in text
        assert f"pid {holder.pid} on host {socket.gethostname()}" in text and "test holder" in text
        assert trainer.calls == []
        _unchanged(config.model_dir, before)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    # the kernel dropped the dead holder's lock: the next job runs, and now holds it
    records = FakeDriver(config, FakeTrainer()).run()
    assert [r["seq"] for r in records] == [0, 1]
    assert json.loads((config.model_dir / LOCK_NAME).read_text())["pid"] == os.getpid()
    # and released it when its run ended
    with ModelDirLock(config.model_dir):
        pass


def test_only_the_holders_own_child_may_share_its_lock(tmp_path):
    check = textwrap.dedent(f"""
        import sys
        from sparseps.online.lock import ModelDirBusyError, ModelDirLock
        try:
            ModelDirLock({str(tmp_path)!r}).acquire()
            sys.exit(10)
        except ModelDirBusyError:
            pass
        lock = ModelDirLock({str(tmp_path)!r}).acquire(accept_ancestor=True)
        sys.exit(20 if lock.inherited else 30)
    """)
    holder = _hold(tmp_path, spawn=check)
    assert holder.wait(timeout=60) == 20
    # not an ancestor of ours: refused even with accept_ancestor
    holder = _hold(tmp_path)
    try:
        with pytest.raises(ModelDirBusyError, match=f"pid {holder.pid} "):
            ModelDirLock(tmp_path).acquire(accept_ancestor=True)
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_lock_held_for_a_job_is_shared_only_with_that_jobs_worker_0(tmp_path, monkeypatch):
    # the holder is no parent of ours (a Ray job: worker 0 runs under an actor): only the
    # job id it recorded lets worker 0 go on
    config = fake_config(tmp_path, days=1, passes_per_day=1)
    holder = _hold(config.model_dir, job_id="sps-ray-a")
    try:
        for other in (None, "", "sps-ray-b"):
            with pytest.raises(ModelDirBusyError, match=f"pid {holder.pid} .*job sps-ray-a"):
                ModelDirLock(config.model_dir).acquire(accept_ancestor=True, accept_job=other)
        lock = ModelDirLock(config.model_dir).acquire(accept_job="sps-ray-a")
        assert lock.inherited and lock.held
        lock.release()
        assert not lock.held
        # worker 0's driver, under another job's id, refuses; under the holder's, it runs
        monkeypatch.setenv("SPARSEPS_JOB_ID", "sps-ray-b")
        trainer = FakeTrainer()
        with pytest.raises(ModelDirBusyError):
            FakeDriver(config, trainer).run()
        assert trainer.calls == []
        monkeypatch.setenv("SPARSEPS_JOB_ID", "sps-ray-a")
        assert [r["seq"] for r in FakeDriver(config, FakeTrainer()).run()] == [0]
        assert holder.poll() is None  # still the holder: worker 0 took nothing from it
        assert json.loads((config.model_dir / LOCK_NAME).read_text())["job"] == "sps-ray-a"
    finally:
        holder.kill()
        holder.wait(timeout=10)
