"""``sparseps scale`` on a real launched job (issue 23, the must-show test).

A ``sparseps launch`` job (2 servers, 2 workers, sync mode: deterministic) is grown to 3
servers and shrunk back to 2 through the CLI while its workers train. A second launch of
the same job, never scaled, runs beside it. Afterwards the saved tables (every row of
every table: embedding, optimizer state, counters; pending admission counters too) and
the dense parameters of the two jobs are equal bit for bit, the scaled job's pids.json
lists the third server with its planned exit, and the longest gap between two training
steps while the job was scaled stays under ``STALL_BOUND_S`` (printed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from sparseps.testing import wait_until
from sparseps.testing.environ import clean_environ
from sparseps.testing.scaled_jobs import (
    JOB,
    STALL_BOUND_S,
    StallWatch,
    assert_same_training,
    scale,
    stall_while_scaled,
    step_times,
)

ROOT = Path(__file__).resolve().parents[2]
STEPS = 400
STEP_SLEEP_S = 0.05


def _env() -> dict[str, str]:
    return clean_environ()


def _launch(tmp: Path, name: str, *extra: str) -> subprocess.Popen:
    out = tmp / name
    out.mkdir()
    argv = [sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "2",
            "--worker-num", "2", "--log-dir", str(out / "log"), "--no-metrics", str(JOB),
            str(out / "out"), "--steps", str(STEPS), "--step-sleep", str(STEP_SLEEP_S),
            *extra]  # fmt: skip
    with open(out / "launch.out", "wb") as console:  # a file: a pipe could fill and block
        return subprocess.Popen(argv, cwd=tmp, env=_env(), stdout=console,
                                stderr=subprocess.STDOUT)  # fmt: skip


def _wait(predicate, timeout: float, what: str) -> None:
    wait_until(predicate, timeout, what)


def test_scale_a_launched_job_2_to_3_to_2_equals_the_unscaled_job(tmp_path, capsys):
    start = time.time()
    gate = tmp_path / "go"
    plain = _launch(tmp_path, "plain", "--gate", str(gate))
    scaled = _launch(tmp_path, "scaled", "--gate", str(gate))
    log_dir, out = tmp_path / "scaled" / "log", tmp_path / "scaled" / "out"
    try:
        _wait(lambda: (out / "progress").exists(), 60, "training to start")
        with StallWatch(out, log_dir) as watch:  # a stall's report says where roles waited
            t0 = time.time()
            grown = scale(log_dir, "--servers", "3", capsys=capsys)
            t_mid = time.time()
            shrunk = scale(log_dir, "--servers", "2", capsys=capsys)
            t1 = time.time()
            gate.write_text("go")  # the watch goes on until worker 0 is at the gate
            assert scaled.wait(90) == 0, (tmp_path / "scaled" / "launch.out").read_text()[-3000:]
        assert plain.wait(90) == 0, (tmp_path / "plain" / "launch.out").read_text()[-3000:]
    finally:
        gate.write_text("go")
        for proc in (plain, scaled):
            if proc.poll() is None:
                proc.kill()
    assert grown["servers_before"] == 2 and grown["servers_after"] == 3
    assert grown["started"] == [2] and grown["vshards_moved"] > 0 and grown["rows_moved"] > 0
    assert shrunk["stopped"] == [2] and shrunk["vshards_moved"] == grown["vshards_moved"]
    children = json.loads((log_dir / "pids.json").read_text())["children"]
    assert {"role": "server", "rank": 2} in [{k: c[k] for k in ("role", "rank")} for c in children]
    assert (log_dir / "server.2.log").exists()
    # the stall: the longest gap between two steps while the job was scaled
    try:
        stall, inside = stall_while_scaled(out, t0, t_mid, t1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{watch.report()}") from None
    usual = float(np.median(np.diff(step_times(tmp_path / "plain" / "out"))))
    with capsys.disabled():
        print(f"\nscale: grow {grown['seconds']:.2f} s (cut-over "
              f"{grown['longest_cutover_s'] * 1000:.1f} ms), shrink {shrunk['seconds']:.2f} s "
              f"(cut-over {shrunk['longest_cutover_s'] * 1000:.1f} ms); {inside} steps "
              f"while scaled, longest step gap {stall * 1000:.0f} ms (median step of the "
              f"plain job {usual * 1000:.0f} ms); test wall {time.time() - start:.1f} s")  # fmt: skip
    assert stall < STALL_BOUND_S, watch.report()
    # the saved tables and the dense parameters equal the unscaled job's, bit for bit
    assert_same_training(tmp_path / "plain" / "out", out)
