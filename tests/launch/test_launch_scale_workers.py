"""The supervisor side of worker membership (``sparseps scale --workers N``, issue 23),
with plain Python children instead of an online job: the launcher announces the world in
the workers' store (``elastic/workers`` = ``{"version", "world"}``), starts the new ranks
with the worker count set to N (recorded in pids.json), counts any worker's exit 0 as
done, and completes the job only once every worker ever started has exited 0."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from sparseps.env import MASTER, RANK, WORKER_NUM, Role
from sparseps.launch.records import ChildSpec, SupervisorConfig
from sparseps.launch.scaling import (
    ACCEPTS_WORKERS_KEY,
    WORKERS_KEY,
    JobScaler,
    ScaleError,
    ScaleService,
    plan_workers,
)
from sparseps.launch.supervisor import Supervisor
from sparseps.store.client import StoreClient
from sparseps.store.server import StoreServer
from sparseps.testing import wait_until

# a worker: note its rank and world, wait for its release file, exit 0
WORKER = """
import os, sys, time, pathlib
folder = pathlib.Path(sys.argv[1]); rank = sys.argv[2]
# written aside, then renamed: a test that sees the file reads all of it
(folder / f".seen.{rank}").write_text(os.environ["SPARSEPS_WORKER_NUM"])
os.replace(folder / f".seen.{rank}", folder / f"seen.{rank}")
deadline = time.monotonic() + 60
while not (folder / f"release.{rank}").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
"""


def _worker(folder: Path, rank: int, world: int, master: str) -> ChildSpec:
    env = {**os.environ, WORKER_NUM: str(world), MASTER: master}
    return ChildSpec(role=Role.WORKER, rank=rank, argv=(sys.executable, "-c", WORKER,
                     str(folder), str(rank)), env=env,
                     log_path=folder / f"worker.{rank}.log")  # fmt: skip


def _running(folder: Path, master: str, ranks: tuple[int, ...], *, world: int):
    """Workers ``ranks`` (of ``world``) under a running Supervisor, and the JobScaler that
    starts new ones: ``(supervisor, scaler, outcome, thread)``; ``outcome`` gets the
    Outcome once the supervisor's run ends."""
    supervisor = Supervisor(
        children=[_worker(folder, r, world, master) for r in ranks],
        config=SupervisorConfig(poll_s=0.05),
        pids_path=folder / "pids.json",
    )
    scaler = JobScaler(
        supervisor=supervisor, endpoints=["127.0.0.1:1"], new_server=None,  # type: ignore[arg-type]
        new_worker=lambda rank, world: _worker(folder, rank, world, master),
        host="127.0.0.1", master=lambda: master,
    )  # fmt: skip
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(supervisor.run()), daemon=True)
    thread.start()
    return supervisor, scaler, outcome, thread


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    wait_until(predicate, timeout, what)


def test_new_workers_start_with_the_new_world_and_the_job_waits_for_them(tmp_path):
    with StoreServer("127.0.0.1", 0) as server:
        master = server.address
        supervisor, scaler, outcome, thread = _running(tmp_path, master, (0, 1), world=2)
        with StoreClient(master, timeout_s=5, setting="-") as store:
            _wait(lambda: (tmp_path / "seen.1").exists(), "the workers to start")
            store.set(ACCEPTS_WORKERS_KEY, b"1")  # what the online driver sets
            report = scaler.worker_scaling.workers(3, 2)
            assert report == {"workers_before": 2, "workers_after": 3, "workers_started": [2],
                              "version": 1}  # fmt: skip
            assert json.loads(store.get(WORKERS_KEY)) == {"version": 1, "world": 3}
            _wait(lambda: (tmp_path / "seen.2").exists(), "the new worker")
            assert (tmp_path / "seen.2").read_text() == "3"  # its worker count is the new world
            children = json.loads((tmp_path / "pids.json").read_text())["children"]
            assert [(c["role"], c["rank"], c["attempt"]) for c in children] == [
                ("worker", 0, 0), ("worker", 1, 0), ("worker", 2, 0)]  # fmt: skip
            # the world shrinks back: rank 2 leaves by itself (exit 0), counted as done
            assert scaler.worker_scaling.workers(2, 3)["workers_started"] == []
            assert json.loads(store.get(WORKERS_KEY)) == {"version": 2, "world": 2}
            (tmp_path / "release.2").write_text("")
            (tmp_path / "release.0").write_text("")
            time.sleep(0.5)
            assert thread.is_alive() and not outcome  # worker 1 is still running
            (tmp_path / "release.1").write_text("")
            thread.join(30)
        assert outcome and outcome[0].exit_code == 0 and outcome[0].reason == "completed"


def test_a_new_worker_that_fails_fails_the_job(tmp_path):
    with StoreServer("127.0.0.1", 0) as server:
        master = server.address
        supervisor = Supervisor(
            children=[_worker(tmp_path, 0, 1, master)],
            config=SupervisorConfig(poll_s=0.05),
            pids_path=tmp_path / "pids.json",
        )
        failing = ChildSpec(role=Role.WORKER, rank=1, argv=(sys.executable, "-c", "exit(3)"),
                            env=dict(os.environ), log_path=tmp_path / "worker.1.log")  # fmt: skip
        outcome: list = []
        thread = threading.Thread(target=lambda: outcome.append(supervisor.run()), daemon=True)
        thread.start()
        _wait(lambda: (tmp_path / "seen.0").exists(), "worker 0")
        supervisor.add_child(failing)
        thread.join(30)
        assert outcome and outcome[0].exit_code == 3 and outcome[0].failure.rank == 1


def test_plan_workers_after_a_leave_skips_the_dead_ranks_and_shrinks_from_the_top():
    plain = {"version": 2, "world": 2}
    assert plan_workers(plain, 3) == ([0, 1, 2], [], {"version": 3, "world": 3})
    assert plan_workers(plain, 1) == ([0], [], {"version": 3, "world": 1})
    died = {"version": 4, "world": 2, "members": [0, 2], "left": [1]}
    # a grow starts the lowest ranks that are neither members nor dead: 1 is never reused
    grown = {"version": 5, "world": 4, "members": [0, 2, 3, 4], "left": [1]}
    assert plan_workers(died, 4) == ([0, 2, 3, 4], [1], grown)
    # a shrink removes the highest members; the record keeps the dead ranks
    assert plan_workers(grown, 2) == ([0, 2], [1], {**died, "version": 6})
    assert plan_workers(grown, 1) == ([0], [1], {"version": 6, "world": 1, "members": [0],
                                                 "left": [1]})  # fmt: skip
    # a rank shrunk away (not dead) may be started again, as without a death
    assert plan_workers({"version": 6, "world": 1, "members": [0], "left": [1]}, 2)[0] == [0, 2]


def test_a_grow_after_a_worker_left_starts_a_new_rank_with_a_worker_count_above_it(tmp_path):
    with StoreServer("127.0.0.1", 0) as server:
        master = server.address
        supervisor, scaler, outcome, thread = _running(tmp_path, master, (0, 2), world=3)
        with StoreClient(master, timeout_s=5, setting="-") as store:
            _wait(lambda: (tmp_path / "seen.2").exists(), "the workers to start")
            store.set(ACCEPTS_WORKERS_KEY, b"1")
            # what the launcher wrote when worker 1 died (ScaleService.worker_died)
            store.set(WORKERS_KEY, json.dumps({"version": 1, "world": 2, "members": [0, 2],
                                               "left": [1]}).encode())  # fmt: skip
            report = scaler.worker_scaling.workers(3, 2)
            assert report == {"workers_before": 2, "workers_after": 3, "workers_started": [3],
                              "version": 2, "members": [0, 2, 3], "left": [1]}  # fmt: skip
            assert json.loads(store.get(WORKERS_KEY)) == {
                "version": 2, "world": 3, "members": [0, 2, 3], "left": [1]}  # fmt: skip
            _wait(lambda: (tmp_path / "seen.3").exists(), "the new worker")
            assert (tmp_path / "seen.3").read_text() == "4"  # SPARSEPS_RANK 3 < 4
            # shrink back: the highest member (3) leaves by itself at its boundary
            assert scaler.worker_scaling.workers(2, 3)["workers_started"] == []
            assert json.loads(store.get(WORKERS_KEY)) == {
                "version": 3, "world": 2, "members": [0, 2], "left": [1]}  # fmt: skip
            for rank in (0, 2, 3):
                (tmp_path / f"release.{rank}").write_text("")
            thread.join(30)
        assert outcome and outcome[0].exit_code == 0 and outcome[0].reason == "completed"


# a worker of a restartable group: attempt 0 does what its rank's action says, a restarted
# one notes its rank and world and exits 0
GROUP_WORKER = """
import os, sys, time, pathlib
folder, actions = pathlib.Path(sys.argv[1]), dict(a.split(":") for a in sys.argv[2].split(","))
rank, attempt = os.environ["SPARSEPS_RANK"], os.environ["SPARSEPS_RESTART_COUNT"]
(folder / f"seen.{rank}.{attempt}").write_text(os.environ["SPARSEPS_WORKER_NUM"])
action = actions[rank] if attempt == "0" else "exit0"
deadline = time.monotonic() + 60
while action in ("wait", "fail") and time.monotonic() < deadline:
    if action == "fail" and (folder / "go").exists():
        sys.exit(3)
    time.sleep(0.02)
sys.exit(9 if action == "die" else 0)
"""


@pytest.mark.parametrize("change", ["shrunk", "left"])
def test_a_group_restart_starts_the_current_members_only_as_ranks_0_to_n(tmp_path, change):
    actions = {"shrunk": "0:wait,1:fail,2:exit0", "left": "0:fail,1:die,2:wait"}[change]
    children = [
        ChildSpec(
            role=Role.WORKER,
            rank=r,
            argv=(sys.executable, "-c", GROUP_WORKER, str(tmp_path), actions),
            env={**os.environ, WORKER_NUM: "3", RANK: str(r), MASTER: "127.0.0.1:1"},
            log_path=tmp_path / f"worker.{r}.log",
        )  # fmt: skip
        for r in range(3)
    ]
    supervisor = Supervisor(children=children, config=SupervisorConfig(poll_s=0.05,
                            max_restarts=1), pids_path=tmp_path / "pids.json")  # fmt: skip
    if change == "left":  # worker 1's death is a leave (ScaleService.worker_died)
        supervisor.worker_left = lambda rank, code: "" if rank == 1 else None
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(supervisor.run()), daemon=True)
    thread.start()
    if change == "shrunk":  # sparseps scale --workers 2: rank 2 exits 0 by itself
        _wait(lambda: (tmp_path / "seen.2.0").exists(), "worker 2")
        supervisor.set_world(2)
    else:
        _wait(lambda: supervisor.members == [0, 2], "worker 1's leave")
    (tmp_path / "go").write_text("")  # a member fails: the group restarts
    thread.join(30)
    assert outcome and outcome[0].exit_code == 0 and outcome[0].reason == "completed", outcome
    restarted = sorted(p.name for p in tmp_path.glob("seen.*.1"))
    assert restarted == ["seen.0.1", "seen.1.1"]  # 2 workers, ranks 0 and 1: never rank 2
    assert {(tmp_path / name).read_text() for name in restarted} == {"2"}  # world 2
    children = json.loads((tmp_path / "pids.json").read_text())["children"]
    assert [(c["rank"], c["attempt"]) for c in children] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]  # fmt: skip


def test_a_scale_in_flight_delays_completion_and_one_after_it_is_refused(tmp_path):
    with StoreServer("127.0.0.1", 0) as server:
        master = server.address
        supervisor = Supervisor(children=[_worker(tmp_path, 0, 1, master)],
                                config=SupervisorConfig(poll_s=0.05),
                                pids_path=tmp_path / "pids.json")  # fmt: skip
        scaler = JobScaler(supervisor=supervisor, endpoints=["127.0.0.1:1"], host="127.0.0.1",
                           master=lambda: master)  # fmt: skip
        service = ScaleService(scaler, "127.0.0.1", workers=1)
        try:
            outcome: list = []
            thread = threading.Thread(target=lambda: outcome.append(supervisor.run()),
                                      daemon=True)  # fmt: skip
            thread.start()
            _wait(lambda: (tmp_path / "seen.0").exists(), "worker 0")
            assert supervisor.begin_change() == ""  # a scale request is being served
            (tmp_path / "release.0").write_text("")  # the last worker exits 0 meanwhile
            time.sleep(0.5)
            assert thread.is_alive() and not outcome  # the job waits for the request
            supervisor.end_change()
            thread.join(30)
            assert outcome and outcome[0].reason == "completed"
            # a request after that: refused, nothing started
            with StoreClient(service.address, timeout_s=5, setting="-") as control:
                control.set("scale/request", json.dumps({"id": "late", "servers": 2,
                                                         "workers": None}).encode())  # fmt: skip
                _wait(lambda: control.check(["scale/result/late"]), "the answer")
                result = json.loads(control.get("scale/result/late"))
            assert not result["ok"] and "the job is finishing" in result["error"], result
            children = json.loads((tmp_path / "pids.json").read_text())["children"]
            assert [(c["role"], c["rank"]) for c in children] == [("worker", 0)]
        finally:
            service.close()


def test_scale_workers_after_the_last_pass_is_refused(tmp_path):
    with StoreServer("127.0.0.1", 0) as server, StoreClient(server.address, timeout_s=5,
                                                         setting="-") as store:  # fmt: skip
        started: list = []
        scaler = JobScaler(supervisor=None, endpoints=["127.0.0.1:1"], host="127.0.0.1",
                           new_worker=lambda rank, world: started.append(rank),
                           master=lambda: server.address)  # fmt: skip
        store.set(ACCEPTS_WORKERS_KEY, b"1")
        # worker 0 of an online job wrote its end decision: no boundary left to join at
        store.set("sparseps/online/members/decision/3", json.dumps({"end": True}).encode())
        store.set("sparseps/online/members/latest", b"3")
        with pytest.raises(ScaleError, match="the job is finishing: its last pass is done"):
            scaler.worker_scaling.workers(3, 2)
        assert not store.check([WORKERS_KEY]) and not started  # nothing announced or started
