"""``sparseps launch --backend ray`` on a real two-node Ray cluster on this machine
(:mod:`sparseps.testing.ray_cluster`: a head and a node with the custom resource
``node_b``, the ``ray_cluster`` fixture of tests/launch/conftest.py). Jobs are placed
across the two nodes by giving the workers ``node_b`` resources. Skipped only when ``ray``
cannot be imported (CI installs the ``ray`` extra).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparseps.testing import scaled_jobs, wait_until
from sparseps.testing.jobs import (
    alive,
    can_bind,
    clean_env,
    finish,
    job_processes,
    launch_argv,
)
from sparseps.testing.jobs import text as read_text
from sparseps.testing.ray_cluster import (
    ANYWHERE,
    HEAD,
    NODE_B,
    ON_B,
    actor_pids,
    ray_env,
    ray_launch,
)

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "scripts" / "job.py"  # the launcher tests' job

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
pytestmark = [
    pytest.mark.timeout(200),
    pytest.mark.skipif(not can_bind("127.0.0.3"), reason="127.0.0.2/3 cannot be bound here"),
]
WIDE_DEEP = ROOT / "sparseps" / "jobs" / "wide_deep_job.py"


@pytest.fixture(scope="module", autouse=True)
def _data_job(tmp_path_factory):
    """Generates the wide&deep data in the background (first: while the cluster starts)."""
    out = tmp_path_factory.mktemp("ray-data")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparseps.cli", "gen-data", "--rows", "6000", "--files", "2",
         "--test-rows", "2000", "--out", str(out), "--no-progress"],
        env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    yield out, proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _started(log: Path, count: int) -> dict | None:
    """pids.json once it lists ``count`` processes, else None."""
    try:
        record = json.loads((log / "pids.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return record if len(record["children"]) == count else None


@pytest.fixture(scope="module")
def data(_data_job) -> Path:
    out, proc = _data_job
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out


def _wide_deep(data: Path, out: Path) -> list[str]:
    return [
        str(WIDE_DEEP), "--train", str(data / "train"), "--test", str(data / "test"),
        "--result", str(out / "result.json"), "--hidden", "32", "--print-period", "0",
        "--calibrate-rows", "0", "--prior-rows", "1000", "--batch-size", "128", "--mode", "sync",
        "--lr", "0.003", "--sparse-lr", "0.05",
    ]  # fmt: skip


def test_wide_deep_across_two_ray_nodes_matches_the_local_launcher(ray_cluster, data, tmp_path):
    (tmp_path / "ray").mkdir()
    (tmp_path / "local").mkdir()
    ray_log, local_log = tmp_path / "ray" / "log", tmp_path / "local" / "log"
    on_ray = subprocess.Popen(
        ray_launch(ray_cluster, ray_log, "--server-num", "2", "--worker-num", "2",
                    "--server-resources", ANYWHERE, "--worker-resources", ON_B, "--no-metrics",
                    *_wide_deep(data, tmp_path / "ray")),
        cwd=tmp_path, env=ray_env(ray_cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    local = subprocess.Popen(
        launch_argv("--server-num", "2", "--worker-num", "2", "--log-dir", str(local_log),
                    "--no-metrics", *_wide_deep(data, tmp_path / "local")),
        cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    ray_out, local_out = finish([on_ray, local], 170)
    assert on_ray.returncode == 0, ray_out[-3000:] + read_text(ray_log / "server.0.log")[-2000:]
    assert local.returncode == 0, local_out[-3000:]
    ours = json.loads((tmp_path / "ray" / "result.json").read_text())
    theirs = json.loads((tmp_path / "local" / "result.json").read_text())
    # sync mode: both apply the same updates in the same order
    assert abs(ours["test_auc"] - theirs["test_auc"]) < 0.005, (ours, theirs)
    assert ours["test_auc"] > 0.6
    # the role logs came back to the driver's log dir; pids.json lists every process
    record = json.loads((ray_log / "pids.json").read_text())
    roles = sorted((c["role"], c["rank"], c["attempt"]) for c in record["children"])
    assert roles == [("server", 0, 0), ("server", 1, 0), ("worker", 0, 0), ("worker", 1, 0)]
    assert {c["node"] for c in record["children"] if c["role"] == "worker"} == {NODE_B}
    assert "running server with rank id: 1" in read_text(ray_log / "server.1.log")
    assert "sparseps worker 1 of 2" in read_text(ray_log / "worker.1.log")
    assert re.search(r"start-up: connected to Ray in [\d.]+ s, 4 role actors placed",
                     read_text(ray_log / "launcher.log"))  # fmt: skip
    assert not any(alive(c["pid"]) for c in record["children"])
    assert job_processes(record["job_id"]) == []


def test_a_worker_exiting_3_fails_the_ray_job_fast_and_names_it(ray_cluster, tmp_path):
    # worker 1 exits 3 in every generation: --max-restarts 1 restarts the worker group
    # once (a fresh rendezvous), then the second exit fails the job
    log = tmp_path / "log"
    r = subprocess.run(
        ray_launch(ray_cluster, log, "--server-num", "1", "--worker-num", "2", "--no-metrics",
                    "--max-restarts", "1", "--server-resources", ANYWHERE,
                    "--worker-resources", ON_B, str(JOB), "fail", "--dir", str(tmp_path)),
        cwd=tmp_path, env=ray_env(ray_cluster), capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    ended = time.time()
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-3000:]
    failed = re.search(
        r"worker 1 \(pid \d+\) exited with code 3 on node (\S+) \(no restarts left: 1 of 1",
        r.stderr,
    )
    assert failed and failed.group(1) == NODE_B, r.stderr
    assert "worker 1: exiting with code 3" in r.stderr  # the tail of its log, pulled back
    # fail fast: the driver ended within seconds of worker 1's last line, not after
    # worker 0's 120 s sleep (room for a loaded box: a 15 s bound of the two-launcher
    # local job once failed there)
    assert ended - (log / "worker.1.log").stat().st_mtime < 60.0
    assert "restarting all workers (restart 1 of 1" in read_text(log / "launcher.log")
    assert "----- restart attempt 1 -----" in read_text(log / "worker.1.log")
    record = json.loads((log / "pids.json").read_text())
    attempts = sorted((c["role"], c["rank"], c["attempt"]) for c in record["children"])
    assert attempts == [("server", 0, 0), ("worker", 0, 0), ("worker", 0, 1), ("worker", 1, 0),
                        ("worker", 1, 1)]  # fmt: skip
    wait_until(lambda: not any(alive(c["pid"]) for c in record["children"]), 10, "roles to exit")
    assert job_processes(record["job_id"]) == []


def test_killing_the_driver_leaves_no_actor_or_process_behind(ray_cluster, tmp_path):
    log = tmp_path / "log"
    driver = subprocess.Popen(
        ray_launch(ray_cluster, log, "--server-num", "1", "--worker-num", "2", "--no-metrics",
                    "--server-resources", ON_B, "--worker-resources", ANYWHERE,
                    str(JOB), "sleep", "--dir", str(tmp_path)),
        cwd=tmp_path, env=ray_env(ray_cluster), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # every role's process has started (the driver writes pids.json after each start)
        record = wait_until(lambda: _started(log, 3), 120, "the job's 3 processes to start")
        pids = [c["pid"] for c in record["children"]]
        assert all(alive(p) for p in pids) and len(actor_pids()) == 3
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        wait_until(lambda: not any(alive(p) for p in pids), 20, f"roles {pids} to exit")
        wait_until(lambda: not actor_pids(), 20, "the role actors to exit")
        assert job_processes(record["job_id"]) == []
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=10)


def _tests_module(folder: str, name: str):
    """``tests/FOLDER/NAME.py``, a helper module another test folder keeps (one home)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sparseps_scale_grows_and_shrinks_a_ray_job_and_rows_equal_the_unscaled_job(
    ray_cluster, tmp_path, capsys
):
    # A Ray job (2 servers, workers on node_b, sync mode) is grown to 3 servers and back
    # to 2 through `sparseps scale` while it trains; the same job under the local
    # launcher, never scaled, runs to its end before the scales: every saved row and
    # dense parameter equal.
    start = time.time()
    gate, hold = tmp_path / "go", tmp_path / "hold"
    job = [str(scaled_jobs.JOB), "--steps", "160", "--step-sleep", "0.08", "--gate", str(gate)]
    for name in ("ray", "plain"):
        (tmp_path / name).mkdir()
    log, out = tmp_path / "ray" / "log", tmp_path / "ray" / "out"
    with open(tmp_path / "ray" / "launch.out", "wb") as console:
        scaled = subprocess.Popen(
            ray_launch(ray_cluster, log, "--server-num", "2", "--worker-num", "2",
                        "--server-resources", ANYWHERE, "--worker-resources", ON_B,
                        "--no-metrics", job[0], str(out), *job[1:], "--hold", str(hold)),
            cwd=tmp_path, env=ray_env(ray_cluster), stdout=console, stderr=subprocess.STDOUT,
        )  # fmt: skip
    plain = None
    try:
        # the reference runs while the Ray job starts, and ends before the scales: a job
        # starting beside the scales (five processes importing torch) held the scaled
        # job's steps up for seconds on CI's two cores. No gate, hold or step sleep:
        # they change the timing, not what is trained
        with open(tmp_path / "plain" / "launch.out", "wb") as console:
            plain = subprocess.Popen(
                launch_argv("--server-num", "2", "--worker-num", "2", "--no-metrics",
                            "--log-dir", str(tmp_path / "plain" / "log"), job[0],
                            str(tmp_path / "plain" / "out"), "--steps", job[2]),
                cwd=tmp_path, env=clean_env(), stdout=console, stderr=subprocess.STDOUT,
            )  # fmt: skip
        assert plain.wait(120) == 0, read_text(tmp_path / "plain" / "launch.out")[-3000:]
        wait_until(lambda: (out / "progress").exists() or scaled.poll() is not None, 90,
                 "the Ray job to train")  # fmt: skip
        assert scaled.poll() is None, read_text(tmp_path / "ray" / "launch.out")[-3000:]
        hold.write_text("go")  # worker 0 waited at step 10: the job trains on from here
        with scaled_jobs.StallWatch(out, log) as watch:  # a stall's report: where roles waited
            t0 = time.time()
            grown = scaled_jobs.scale(log, "--servers", "3", capsys=capsys)
            t_mid = time.time()
            assert len(actor_pids()) == 5  # the new server's own actor
            shrunk = scaled_jobs.scale(log, "--servers", "2", capsys=capsys)
            t1 = time.time()
            wait_until(lambda: len(actor_pids()) == 4, 20, "the retired server's actor to end")
            gate.write_text("go")  # the watch goes on until worker 0 is at the gate
            assert scaled.wait(90) == 0, read_text(tmp_path / "ray" / "launch.out")[-3000:]
        t_done = time.time()
    finally:
        gate.write_text("go")
        hold.write_text("go")
        for proc in (scaled, plain):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert (grown["servers_before"], grown["servers_after"], grown["started"]) == (2, 3, [2])
    assert grown["vshards_moved"] > 0 and grown["rows_moved"] > 0
    assert shrunk["stopped"] == [2] and shrunk["vshards_moved"] == grown["vshards_moved"]
    # the third server ran through Ray (an actor on a node, its log pulled back), and
    # pids.json lists it; its exit was planned: the job completed (exit 0 above)
    record = json.loads((log / "pids.json").read_text())
    third = [c for c in record["children"] if (c["role"], c["rank"]) == ("server", 2)]
    assert len(third) == 1 and third[0]["node"] in (HEAD, NODE_B), record
    assert "running server with rank id: 2" in read_text(log / "server.2.log")
    assert not any(alive(c["pid"]) for c in record["children"])
    assert job_processes(record["job_id"]) == []
    wait_until(lambda: not actor_pids(), 20, "the role actors to exit")
    with capsys.disabled():  # before the checks below: a failure's report shows them
        print(f"\nray scale: grow {grown['seconds']:.2f} s (cut-over "
              f"{grown['longest_cutover_s'] * 1000:.1f} ms), shrink {shrunk['seconds']:.2f} s "
              f"(cut-over {shrunk['longest_cutover_s'] * 1000:.1f} ms); test wall "
              f"{time.time() - start:.1f} s (training from {t0 - start:.1f} s, scaled by "
              f"{t1 - start:.1f} s, both jobs done at {t_done - start:.1f} s)")  # fmt: skip
    try:
        stall, _ = scaled_jobs.stall_while_scaled(out, t0, t_mid, t1)
    except AssertionError as exc:  # what the launcher and the workers logged meanwhile
        logs = "\n".join(f"--- {name}\n{read_text(log / name)[-1500:]}"
                         for name in ("launcher.log", "worker.0.log", "worker.1.log"))  # fmt: skip
        raise AssertionError(
            f"{exc}\ngrow {grown}\nshrink {shrunk}\n{logs}\n{watch.report()}"
        ) from None
    print(f"longest step gap while scaled {stall * 1000:.0f} ms")
    assert stall < scaled_jobs.STALL_BOUND_S, watch.report()
    try:
        scaled_jobs.assert_same_training(tmp_path / "plain" / "out", out)
    except AssertionError as exc:  # when the scales ran, beside the first diverging step
        raise AssertionError(f"{exc}\nscales: grow {t0:.3f}-{t_mid:.3f}, shrink "
                             f"{t_mid:.3f}-{t1:.3f} (wall times)") from None  # fmt: skip


def test_sparseps_scale_refusals_on_a_ray_job_change_nothing(ray_cluster, tmp_path):
    # --workers on a job whose workers do not follow membership (not `sparseps online`)
    # is refused; a server Ray cannot place (each needs 0.6 of node_b's 1.0) is refused
    # after --rendezvous-timeout-s: no process, the job runs on
    from sparseps.launch import scale_job
    from sparseps.launch.scaling import ScaleError

    log = tmp_path / "log"
    driver = subprocess.Popen(
        ray_launch(ray_cluster, log, "--server-num", "1", "--worker-num", "1", "--no-metrics",
                    "--server-resources", '{"CPU": 0.5, "node_b": 0.6}', "--worker-resources",
                    ANYWHERE, "--rendezvous-timeout-s", "2", str(JOB), "sleep", "--dir",
                    str(tmp_path)),
        cwd=tmp_path, env=ray_env(ray_cluster), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        record = wait_until(lambda: _started(log, 2), 120, "the job's 2 processes to start")
        assert isinstance(record["control"], str)
        # a --workers request asks the workers' store, which worker 0 hosts once it is up
        # (a request before that is refused for another reason: "does not answer")
        wait_until(lambda: "worker 0 ready" in read_text(log / "worker.0.log"), 120,
                 "worker 0 to host the workers' store")  # fmt: skip
        with pytest.raises(ScaleError, match="needs a job whose workers follow membership"):
            scale_job(log, workers=2, timeout_s=30)
        with pytest.raises(ScaleError, match=r"could not place server 1 .* within 2 s"):
            scale_job(log, servers=2, timeout_s=30)
        assert len(json.loads((log / "pids.json").read_text())["children"]) == 2
        assert all(alive(c["pid"]) for c in record["children"]) and driver.poll() is None
        assert len(actor_pids()) == 2
    finally:
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait(timeout=10)


def _online_helpers():
    """tests/online/_onlinetools.py: the online tests' config writer."""
    return _tests_module("online", "_onlinetools")


def test_online_job_on_ray_grows_to_3_workers_and_back(ray_cluster, tmp_path, capsys):
    # `sparseps online` with job.backend: ray (async, workers on node_b) is grown 2 -> 3
    # workers after pass 0 and back to 2 after pass 2 through `sparseps scale --workers`;
    # the passes' _SUCCESS markers are written one pass at a time, so each scale lands
    # between known passes (tests/online/test_online_scale_workers.py, under Ray)
    from sparseps.launch import scale_job
    from sparseps.online import DataLayout, Ledger, load_config, write_stream
    from sparseps.online.lock import ModelDirBusyError, ModelDirLock

    rows_per_file, files, passes = 150, 3, 5
    start = time.time()
    stream = tmp_path / "stream"
    write_stream(stream, start_day="20240101", days=1, splits_per_day=passes,
                 rows_per_split=rows_per_file * files, files_per_split=files,
                 skip=tuple(("20240101", s) for s in range(passes)), seed=5)  # fmt: skip
    path = _online_helpers().write_config(
        tmp_path / "job.yaml", data_root=stream, model_dir=tmp_path / "model", days=1,
        passes_per_day=passes, save={"delta_every": 1, "checkpoint_every": 2},
        job={"mode": "async", "worker_num": 2, "backend": "ray",
             "server_resources": json.loads(ANYWHERE), "worker_resources": json.loads(ON_B)},
    )  # fmt: skip
    config = load_config(path)
    layout, book = DataLayout(config), Ledger.of(config.model_dir)

    def ready(seq: int) -> None:
        for folder in layout.splits(layout.passes()[seq]):
            (folder / "_SUCCESS").touch()

    def wait_pass(seq: int) -> None:
        def recorded() -> bool:
            assert job.poll() is None, read_text(out)[-3000:]
            return book.path.exists() and seq in {r["seq"] for r in book.passes()}

        wait_until(recorded, 120, f"pass {seq} in the ledger")

    out = tmp_path / "online.out"
    with open(out, "wb") as console:
        job = subprocess.Popen(
            [sys.executable, "-m", "sparseps.cli", "online", str(path)], cwd=tmp_path,
            env=ray_env(ray_cluster), stdout=console, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        ready(0)
        wait_pass(0)
        # the command holds the model directory for the whole job (worker 0 took it over
        # by the job id it recorded): another job is refused while the passes run
        with pytest.raises(ModelDirBusyError, match=r"sparseps online, pid \d+ .*job sps-ray-"):
            ModelDirLock(config.model_dir).acquire()
        t_grow = time.time()
        grown = scale_job(config.log_dir, workers=3, timeout_s=120)
        t_grown = time.time()
        assert (grown["workers_before"], grown["workers_after"]) == (2, 3)
        assert grown["workers_started"] == [2]
        assert len(actor_pids()) == 4  # the new worker's own actor
        for seq in (1, 2):
            ready(seq)
            wait_pass(seq)
        shrunk = scale_job(config.log_dir, workers=2, timeout_s=120)
        assert (shrunk["workers_before"], shrunk["workers_after"]) == (3, 2)
        for seq in (3, 4):
            ready(seq)
        assert job.wait(120) == 0, read_text(out)[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    records = book.passes()
    assert [r["seq"] for r in records] == list(range(passes))
    assert [r["seq"] for r in book.records() if r["kind"] == "pass"] == list(range(passes))
    workers = [r["workers"] for r in records]
    # 2 for pass 0, 3 from pass 1 or 2 on, 3 for pass 2, 2 again from pass 3 or 4 on
    assert workers[0] == 2 and workers[2] == 3 and workers[4] == 2, workers
    assert workers == sorted(workers[:3]) + sorted(workers[3:], reverse=True), workers
    per_pass = rows_per_file * files
    for record in records:
        assert record["samples"] == per_pass, record  # each pass's rows, exactly
        expected = {2: [2 * rows_per_file, rows_per_file], 3: [rows_per_file] * 3}
        assert record["worker_rows"] == expected[record["workers"]]  # worker 2: its third
    # worker 2 ran as a Ray actor on node_b, its log came back to the driver's log dir
    record = json.loads((config.log_dir / "pids.json").read_text())
    assert record["backend"] == "ray"
    added = [c for c in record["children"] if (c["role"], c["rank"]) == ("worker", 2)]
    assert len(added) == 1 and added[0]["node"] == NODE_B, record
    assert read_text(config.log_dir / "worker.2.log")
    assert not any(alive(c["pid"]) for c in record["children"])
    assert job_processes(record["job_id"]) == []
    wait_until(lambda: not actor_pids(), 20, "the role actors to exit")
    with capsys.disabled():
        print(f"\nray online workers: grow to 3 answered in {t_grown - t_grow:.2f} s; test "
              f"wall {time.time() - start:.1f} s")  # fmt: skip


def test_a_worker_killed_in_an_online_ray_job_leaves_and_the_job_goes_on(ray_cluster, tmp_path):
    # tests/online/test_online_worker_dies.py under Ray: 3 workers (async, split: steal,
    # a lease), each claims one of pass 0's files behind a gate; worker 1 SIGKILLs itself
    # at its second batch; the Ray driver records its leave (nothing stopped or restarted),
    # the survivors re-read its file; then `sparseps scale --workers 3` starts rank 3 as a
    # new actor (every later file read waits for a second gate, opened after the scale, so
    # pass 0 cannot end first): pass 1 runs on workers 0, 2, 3 and the job exits 0
    import shlex

    from sparseps.launch import scale_job
    from sparseps.online import Ledger, load_config, write_stream
    from sparseps.online.online_cli import launch_argv as online_launch_argv

    rows, files, batch = 150, 3, 32
    start = time.time()
    stream, claims, gate = tmp_path / "stream", tmp_path / "claims", tmp_path / "gate"
    regrown = tmp_path / "gate2"
    claims.mkdir()
    write_stream(stream, start_day="20240101", days=1, splits_per_day=2,
                 rows_per_split=rows * files, files_per_split=files, seed=7)  # fmt: skip
    folder = shlex.quote(str(claims))
    pipe = (f"mktemp {folder}/c.XXXXXX >/dev/null; g={shlex.quote(str(gate))}; "
            f"if [ $(ls {folder} | wc -l) -gt {files} ]; then g={shlex.quote(str(regrown))}; fi; "
            "while [ ! -e $g ]; do sleep 0.02; done; cat")  # fmt: skip
    path = _online_helpers().write_config(
        tmp_path / "job.yaml", data_root=stream, model_dir=tmp_path / "model", days=1,
        passes_per_day=2, save={"delta_every": 1, "checkpoint_every": 1},
        data={"split": "steal", "lease_s": 2.0, "batch_size": batch, "pipe_command": pipe},
        job={"mode": "async", "worker_num": 3, "backend": "ray",
             "server_resources": json.loads(ANYWHERE),
             "worker_resources": {"CPU": 0.25, "node_b": 0.1}},  # 4 workers fit node_b
    )  # fmt: skip
    config = load_config(path)
    config.model_dir.mkdir(parents=True, exist_ok=True)
    argv = online_launch_argv(config, path, script=ROOT / "tests" / "online" / "_leave_job.py",
                              script_args=[1, 0, 2])  # fmt: skip
    assert argv[argv.index("--backend") + 1] == "ray"
    out = tmp_path / "launch.out"
    with open(out, "wb") as console:
        job = subprocess.Popen([sys.executable, "-m", "sparseps.cli", "launch", *argv],
                               cwd=tmp_path, env=ray_env(ray_cluster), stdout=console,
                               stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(lambda: len(list(claims.iterdir())) >= files or job.poll() is not None, 120,
                 "each worker to claim one of pass 0's files")  # fmt: skip
        assert job.poll() is None, read_text(out)[-3000:]
        gate.touch()
        wait_until(lambda: "LEFT the job" in read_text(out) or job.poll() is not None, 60,
                 "the driver to record worker 1's leave")  # fmt: skip
        assert job.poll() is None, read_text(out)[-3000:]
        report = scale_job(config.log_dir, workers=3, timeout_s=60)
        assert report["workers_started"] == [3] and report["members"] == [0, 2, 3], report
        assert report["left"] == [1] and report["workers_before"] == 2, report
        regrown.touch()
        assert job.wait(150) == 0, read_text(out)[-4000:]
    finally:
        gate.touch()
        regrown.touch()
        if job.poll() is None:
            job.kill()
            job.wait(10)
    first, second = Ledger.of(config.model_dir).passes()
    (left,) = first["left"]
    assert left["rank"] == 1 and first["rows_reread"] == 2 * batch, first
    assert first["samples"] == rows * files and first["members"] == [0, 2], first
    assert second["workers"] == 3 and second["samples"] == rows * files, second
    record = json.loads((config.log_dir / "pids.json").read_text())
    workers = [c for c in record["children"] if c["role"] == "worker"]
    assert [c["rank"] for c in workers] == [0, 1, 2, 3]  # no restart; rank 1 not reused
    assert workers[3]["node"] == NODE_B  # the added worker: a Ray actor
    assert not any(alive(c["pid"]) for c in record["children"])
    wait_until(lambda: not actor_pids(), 20, "the role actors to exit")
    print(f"ray worker death: test wall {time.time() - start:.1f} s")


def test_online_config_backend_keys_are_checked_and_reach_the_launcher(tmp_path):
    # no cluster: job.backend / job.ray_address / job.*_resources are validated at load
    # and become `sparseps launch --backend ray` options
    from sparseps.errors import ConfigError
    from sparseps.online import load_config
    from sparseps.online.online_cli import launch_argv as online_launch_argv

    def config(**job):
        path = _online_helpers().write_config(
            tmp_path / "job.yaml", data_root=tmp_path / "stream", model_dir=tmp_path / "m",
            days=1, passes_per_day=1, job=job,
        )  # fmt: skip
        return load_config(path), path

    loaded, path = config(backend="ray", ray_address="10.0.0.1:6379",
                          worker_resources={"CPU": 2, "GPU": 1})  # fmt: skip
    argv = online_launch_argv(loaded, path)
    assert argv[argv.index("--backend") + 1] == "ray"
    assert argv[argv.index("--address") + 1] == "10.0.0.1:6379"
    assert json.loads(argv[argv.index("--worker-resources") + 1]) == {"CPU": 2.0, "GPU": 1.0}
    assert "--server-resources" not in argv
    assert "--backend" not in online_launch_argv(*config())  # local: the launcher's default
    for job, message in [
        ({"backend": "k8s"}, "job.backend: expected one of local, ray"),
        ({"worker_resources": {"CPU": 1}}, "job.worker_resources: applies only to job.backend: ray"),
        ({"ray_address": "x:1"}, "job.ray_address: applies only to job.backend: ray"),
        ({"backend": "ray", "server_resources": {"CPU": 0}}, "job.server_resources: 'CPU' must be a number > 0"),
        ({"backend": "ray", "server_resources": [1]}, "job.server_resources: expected a mapping"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(message)):
            config(**job)
