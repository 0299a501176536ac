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
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "scripts" / "train_job.py"
STEPS = 400
STEP_SLEEP_S = 0.05
# The longest a training step may wait while servers join or leave: a step waits only for
# the cut-over of the shards it touches (measured: tens to a few hundred ms on this box).
STALL_BOUND_S = 5.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


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


def _scale(log_dir: Path, *args: str, capsys) -> dict:
    """``sparseps scale LOG_DIR ARGS --json`` through the command line's entry point."""
    from sparseps.cli import main

    capsys.readouterr()
    code = main(["scale", str(log_dir), *args, "--json"])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    with capsys.disabled():
        print(printed.out.splitlines()[0])
    return json.loads(printed.out.splitlines()[-1])


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def _steps(out: Path) -> np.ndarray:
    return np.array(json.loads((out / "steps.0.json").read_text())["times"])


def _tables(ckpt: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every saved sparse file kind (``deep_emb.shard`` ...), its rows sorted by key."""
    parts: dict[str, list] = {}
    for path in sorted(ckpt.glob("*.arrow")):
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        parts.setdefault(path.name.rsplit("-", 3)[0], []).append(table)
    out = {}
    for kind, tables in parts.items():
        table = pa.concat_tables(tables)
        order = np.argsort(table.column("key").to_numpy())
        out[kind] = {
            name: np.stack(table.column(name).to_numpy(zero_copy_only=False))[order]
            if pa.types.is_fixed_size_list(table.schema.field(name).type)
            or pa.types.is_list(table.schema.field(name).type)
            else table.column(name).to_numpy()[order]
            for name in table.column_names
        }
    return out


def test_scale_a_launched_job_2_to_3_to_2_equals_the_unscaled_job(tmp_path, capsys):
    start = time.time()
    gate = tmp_path / "go"
    plain = _launch(tmp_path, "plain", "--gate", str(gate))
    scaled = _launch(tmp_path, "scaled", "--gate", str(gate))
    log_dir, out = tmp_path / "scaled" / "log", tmp_path / "scaled" / "out"
    try:
        _wait(lambda: (out / "progress").exists(), 60, "training to start")
        t0 = time.time()
        grown = _scale(log_dir, "--servers", "3", capsys=capsys)
        t_mid = time.time()
        shrunk = _scale(log_dir, "--servers", "2", capsys=capsys)
        t1 = time.time()
        gate.write_text("go")
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
    times = _steps(out)
    for lo, hi, what in ((t0, t_mid, "grown"), (t_mid, t1, "shrunk")):
        steps = np.count_nonzero((times >= lo) & (times <= hi))
        assert steps > 5, f"training did not go on while the job was {what} ({steps} steps)"
    gate_at = float((out / "at_gate").read_text())
    inside = times[(times >= t0) & (times <= min(t1, gate_at))]
    window = np.concatenate([[t0], inside])
    stall = float(np.max(np.diff(window)))
    usual = float(np.median(np.diff(_steps(tmp_path / "plain" / "out"))))
    with capsys.disabled():
        print(f"\nscale: grow {grown['seconds']:.2f} s (cut-over "
              f"{grown['longest_cutover_s'] * 1000:.1f} ms), shrink {shrunk['seconds']:.2f} s "
              f"(cut-over {shrunk['longest_cutover_s'] * 1000:.1f} ms); {len(inside)} steps "
              f"while scaled, longest step gap {stall * 1000:.0f} ms (median step of the "
              f"plain job {usual * 1000:.0f} ms); test wall {time.time() - start:.1f} s")  # fmt: skip
    assert stall < STALL_BOUND_S
    # the saved tables and the dense parameters equal the unscaled job's, bit for bit
    want, got = _tables(tmp_path / "plain" / "out" / "ckpt"), _tables(out / "ckpt")
    assert sorted(got) == sorted(want) and want["deep_emb.shard"]["key"].size > 0
    for kind in want:
        assert sorted(got[kind]) == sorted(want[kind]), kind
        for column in want[kind]:
            np.testing.assert_array_equal(got[kind][column], want[kind][column],
                                          err_msg=f"{kind}.{column}")  # fmt: skip
    dense_want = np.load(tmp_path / "plain" / "out" / "dense.npz")
    dense_got = np.load(out / "dense.npz")
    for name in dense_want.files:
        np.testing.assert_array_equal(dense_got[name], dense_want[name], err_msg=name)
