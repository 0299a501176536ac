"""A scale racing a Ray job's end (docs/elastic.md, "Protocol", 6), as under the local
launcher (tests/launch/test_launch_scale_workers.py): a request in flight holds the job's
completion, and once every worker has exited 0 a new request is refused and starts
nothing. The Ray driver's supervision loop runs for real; its roles are handles whose
exit codes the test sets (no Ray cluster is needed to order completion)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from sparseps.env import Role
from sparseps.launch.records import SupervisorConfig
from sparseps.launch.scaling import JobScaler, ScaleService
from sparseps.store.client import StoreClient

pytest.importorskip("ray")  # the [ray] extra: RayJob imports it

from sparseps.launch.config import LaunchConfig  # noqa: E402
from sparseps.launch.ray_job import RayJob  # noqa: E402
from sparseps.launch.ray_placement import RoleHandle  # noqa: E402
from sparseps.launch.ray_scale import RayRoles  # noqa: E402
from sparseps.testing import wait_until


def _job(folder: Path) -> tuple[RayJob, RoleHandle, list]:
    """A RayJob with one server and one worker that are still running, supervised in a
    thread; ``(job, worker, outcome)``: ``outcome`` gets the Outcome once it returns."""
    config = LaunchConfig(script=str(folder / "train.py"), grace_s=1.0, log_dir=str(folder),
                          job_id="ray-gate")  # fmt: skip
    job = RayJob(config, folder / "train.py", out=None)
    job.config = SupervisorConfig(poll_s=0.02)
    server = RoleHandle(Role.SERVER, 0, actor=None, log_path=folder / "server.0.log",
                        running=True)  # fmt: skip
    worker = RoleHandle(Role.WORKER, 0, actor=None, log_path=folder / "worker.0.log",
                        running=True)  # fmt: skip
    job.roles = [server, worker]
    stopped: list = []
    job.poll = lambda roles: None  # the handles' states are the test's
    job._stop_servers = lambda servers: stopped.extend(servers)
    outcome: list = []
    threading.Thread(target=lambda: outcome.append(job.supervise()), daemon=True).start()
    return job, worker, outcome


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    wait_until(predicate, timeout, what)


def test_a_scale_in_flight_delays_a_ray_jobs_completion_and_one_after_it_is_refused(tmp_path):
    job, worker, outcome = _job(tmp_path)
    roles = RayRoles(job)
    assert roles.begin_change() == ""  # a scale request is being served
    worker.code, worker.running = 0, False  # the last worker exits 0 meanwhile
    time.sleep(0.3)
    assert not outcome and not job.finishing  # the job waits for the request
    roles.end_change()
    _wait(lambda: outcome, "the job's completion")
    assert outcome[0].reason == "completed" and job.finishing
    # a request after that, through the job's control store: refused, nothing started
    scaler = JobScaler(supervisor=roles, endpoints=["127.0.0.1:1"], host="127.0.0.1",
                       launch_servers=lambda ranks, endpoints: pytest.fail("started a server"),
                       new_worker=roles.new_worker, master=roles.master)  # fmt: skip
    service = ScaleService(scaler, "127.0.0.1", workers=1)
    try:
        with StoreClient(service.address, timeout_s=5, setting="-") as control:
            control.set("scale/request", json.dumps({"id": "late", "servers": 2,
                                                     "workers": 2}).encode())  # fmt: skip
            _wait(lambda: control.check(["scale/result/late"]), "the answer")
            result = json.loads(control.get("scale/result/late"))
    finally:
        service.close()
    assert not result["ok"] and "the job is finishing" in result["error"], result
    assert [(r.role, r.rank) for r in job.roles] == [(Role.SERVER, 0), (Role.WORKER, 0)]
    assert job._gate.in_flight == 0
