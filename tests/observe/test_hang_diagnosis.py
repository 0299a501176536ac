"""A job that hangs on purpose: worker 1 never reaches the barriers worker 0 waits at.

Worker 0's timeouts (a gloo barrier through ``sparseps.core.collectives`` and the worker
barrier ``sps.barrier_worker``) run the diagnosis by themselves: each error names its
dump folder, whose files hold worker 0's stack at that barrier and worker 1's stack where
it is stuck, and whose summary says who waits on whom. An RPC timeout of a training pass
(the server stopped with SIGSTOP) names its folder too, and so do RPC timeouts outside a
pass (an inference pass, a direct client call) and the pass metrics' all-reduce. Then ``sparseps diagnose LOG_DIR``
on the live job dumps every role again. The job runs with ``--no-metrics``: pids.json
then lists no metrics port.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from _jobtools import SCRIPTS, clean_env, finish, read_pids, start_launch, wait_for

# The rows the job's pass reads: what they hold does not matter (its first pull finds the
# server stopped), so the fixture's 200 Criteo rows as TSV, not the synthetic generator
# (1.5-2.5 s of kernel loading and a planted model in this process).
SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "criteo_sample.csv"


def _folder(message: str) -> Path:
    found = re.search(r"stacks of every role dumped to (\S+) ", message)
    assert found, message
    return Path(found[1])


def test_timeouts_dump_every_stack_and_name_the_folder(tmp_path):
    log = tmp_path / "log"
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "part-00000.tsv").write_text(
        SAMPLE.read_text().split("\n", 1)[1].replace(",", "\t")
    )
    proc = start_launch(
        "--server-num", "1", "--worker-num", "2", "--log-dir", str(log), "--no-metrics",
        str(SCRIPTS / "hang_job.py"), "--dir", str(tmp_path),
        "--train", str(tmp_path / "data" / "train"), cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "errors.json").exists(), 120, "worker 0's timeouts", proc)
        errors = json.loads((tmp_path / "errors.json").read_text())
        gloo, store = _folder(errors["collective"]), _folder(errors["barrier"])
        assert "worker barrier: not every worker joined within 2 s" in errors["collective"]
        assert "worker rank(s) [1] did not arrive" in errors["barrier"]
        for folder, frame, what in (
            (gloo, "in barrier\n", "gloo barrier"),
            (store, "in store_barrier\n", "barrier"),
        ):
            assert folder.parent == log and folder.is_dir()
            assert sorted(p.name for p in folder.iterdir()) == [
                "server.0.txt", "summary.txt", "worker.0.txt", "worker.1.txt",
            ]  # fmt: skip
            hung = (folder / "worker.0.txt").read_text()
            assert frame in hung and "hang_job.py" in hung, hung
            assert "in never_arrive" in (folder / "worker.1.txt").read_text()
            summary = (folder / "summary.txt").read_text()
            assert re.search(rf"worker 0 \(pid \d+\): in {what} .* waits on worker 1", summary), (
                summary
            )
            assert re.search(
                r"worker 1 \(pid \d+\): at hang_job.py:\d+ in wait_for_release", summary
            ), summary
            assert "server 0 (pid" in summary
        # a pull that timed out while the server was stopped
        rpc = _folder(errors["rpc"])
        assert rpc.parent == log and (rpc / "summary.txt").is_file() and rpc not in (gloo, store)
        assert "in never_arrive" in (rpc / "worker.1.txt").read_text()
        summary = (rpc / "summary.txt").read_text()
        assert re.search(r"server 0 \(pid \d+\): stopped \(SIGSTOP", summary), summary
        assert re.search(r"worker 0 \(pid \d+\): in the data pipeline .*"
                         r"\(timed out here: pull 'deep_emb'", summary), summary  # fmt: skip
        # outside a training pass: an inference pass and a direct client call (every
        # server call ends in Handle.wait), then the pass metrics' all-reduce
        folders = {rpc, gloo, store}
        for name, start, state in (
            ("infer", "pull_dense '__dense__'", "waiting on servers in wait"),
            ("client", "stats: server 0", "waiting on servers in stats"),
            ("metrics", "metrics all_reduce", "in metrics all_reduce"),
        ):  # fmt: skip
            assert errors[name] and errors[name].startswith(start), errors
            folder = _folder(errors[name])
            assert folder.parent == log and folder not in folders, (name, folder)
            folders.add(folder)
            assert "in never_arrive" in (folder / "worker.1.txt").read_text()
            summary = (folder / "summary.txt").read_text()
            assert re.search(
                rf"worker 0 \(pid \d+\): {state} .*\(timed out here: {start}", summary
            ), summary
            stopped = re.search(r"server 0 \(pid \d+\): stopped \(SIGSTOP", summary)
            assert bool(stopped) == (name != "metrics"), summary
        assert "waits on worker 1" in summary  # the metrics all-reduce's
        record = read_pids(log)
        assert "launcher_metrics_port" not in record  # --no-metrics
        assert all("metrics_port" not in c for c in record["children"])
        # the command, on the live job
        done = subprocess.run(
            [sys.executable, "-m", "sparseps.cli", "diagnose", str(log)],
            env=clean_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        pids = {(c["role"], c["rank"]): c["pid"] for c in read_pids(log)["children"]}
        for (role, rank), pid in pids.items():
            assert f"{role} {rank} (pid {pid}):" in done.stdout, done.stdout
        assert "server 0 (pid" in done.stdout and "serving requests" in done.stdout
        folder = Path(done.stdout.splitlines()[0].removeprefix("stacks in "))
        assert (folder / "worker.1.txt").is_file() and folder != gloo and folder != store
    finally:
        (tmp_path / "release").write_text("1")
        out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
