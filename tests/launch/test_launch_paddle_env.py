"""Issue 27: roles from Paddle's variables (TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST,
PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID, POD_IP, PADDLE_PORT) when no SPARSEPS_* is set.

- the mapping, its precedence and the errors naming the variable (no processes);
- a job of 1 server + 2 workers started by this test with only Paddle's variables trains.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparseps.data.synthetic import write_dataset
from sparseps.env import Role, from_environ
from sparseps.errors import ConfigError
from sparseps.rpc.client import PSClient
from sparseps.testing.jobs import clean_env, free_port

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).parent / "scripts" / "paddle_env_job.py"
SERVERS = "10.0.0.1:6170,10.0.0.2:6170"


def paddle(role: str, **extra: str) -> dict[str, str]:
    return {"TRAINING_ROLE": role, "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
            "PADDLE_TRAINERS_NUM": "2", **extra}  # fmt: skip


def test_trainer_and_pserver_roles_from_paddle_variables():
    worker = from_environ(paddle("TRAINER", PADDLE_TRAINER_ID="1"))
    assert (worker.role, worker.rank, worker.worker_num) == (Role.WORKER, 1, 2)
    assert worker.servers == ("10.0.0.1:6170", "10.0.0.2:6170") and not worker.local
    assert worker.master == "10.0.0.1:6171"  # server 0's host, highest server port + 1
    server = from_environ(paddle("PSERVER", POD_IP="10.0.0.2", PADDLE_PORT="6170"))
    assert (server.role, server.rank) == (Role.SERVER, 1)
    # every process of the job derives the same job id and master
    assert server.job_id == worker.job_id and server.job_id.startswith("paddle-")
    assert server.master == worker.master
    # the first trainer endpoint, or PADDLE_MASTER, name the rendezvous; PADDLE_JOB_ID the job
    ends = "10.0.1.5:6200,10.0.1.6:6200"
    assert from_environ(paddle("TRAINER", PADDLE_TRAINER_ID="0", PADDLE_TRAINER_ENDPOINTS=ends)).master == "10.0.1.5:6200"  # fmt: skip
    env = from_environ(paddle("TRAINER", PADDLE_TRAINER_ID="0", PADDLE_MASTER="10.0.9.9:7000",
                              PADDLE_TRAINER_ENDPOINTS=ends, PADDLE_JOB_ID="ctr-7"))  # fmt: skip
    assert (env.master, env.job_id) == ("10.0.9.9:7000", "ctr-7")


def test_sparseps_variables_take_precedence():
    mine = {"SPARSEPS_ROLE": "worker", "SPARSEPS_RANK": "0", "SPARSEPS_SERVERS": "127.0.0.1:1",
            "SPARSEPS_WORKER_NUM": "1", "SPARSEPS_MASTER": "127.0.0.1:2",
            "SPARSEPS_LOG_DIR": "log", "SPARSEPS_JOB_ID": "j"}  # fmt: skip
    env = from_environ({**paddle("PSERVER"), **mine})
    assert (env.role, env.servers, env.job_id) == (Role.WORKER, ("127.0.0.1:1",), "j")
    assert from_environ({"PADDLE_TRAINER_ID": "0", "POD_IP": "1.2.3.4"}) is None  # local mode


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (paddle("TRAINER"), "PADDLE_TRAINER_ID is not set"),
        (paddle("PSERVER", PADDLE_PORT="6170"), "POD_IP is not set"),
        (paddle("PSERVER", POD_IP="10.0.0.1"), "PADDLE_PORT is not set"),
        (
            paddle("PSERVER", POD_IP="10.0.0.3", PADDLE_PORT="6170"),
            "10.0.0.3:6170 is not in PADDLE_PSERVERS_IP_PORT_LIST",
        ),  # fmt: skip
        ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS}, "TRAINING_ROLE is not set"),
        (
            {**paddle("TRAINER", PADDLE_TRAINER_ID="0"), "PADDLE_TRAINERS_NUM": ""},
            "PADDLE_TRAINERS_NUM is not set",
        ),  # fmt: skip
        ({"TRAINING_ROLE": "TRAINER"}, "PADDLE_PSERVERS_IP_PORT_LIST is not set"),
        (paddle("TRAINER", PADDLE_TRAINER_ID="2"), "PADDLE_TRAINER_ID: 2 out of range 0..1"),
        (paddle("TRAINER", PADDLE_TRAINER_ID="x"), "PADDLE_TRAINER_ID: expected an integer"),
        (paddle("HETER_TRAINER"), "TRAINING_ROLE: expected PSERVER or TRAINER"),
        (
            {**paddle("TRAINER", PADDLE_TRAINER_ID="0"), "PADDLE_PSERVERS_IP_PORT_LIST": "a:b"},
            r"PADDLE_PSERVERS_IP_PORT_LIST\[0\]",
        ),  # fmt: skip
    ],
)
def test_missing_or_malformed_paddle_variables_are_named(environ, message):
    with pytest.raises(ConfigError, match=message):
        from_environ(environ)


def test_a_job_started_with_only_paddle_variables_trains(tmp_path):
    write_dataset(tmp_path / "data", 2000, seed=4, files=2, test_rows=500)
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    base = clean_env(TRAINING_ROLE="", PADDLE_PSERVERS_IP_PORT_LIST=endpoint,
                     PADDLE_TRAINERS_NUM="2",
                     PADDLE_TRAINER_ENDPOINTS=f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}",
                     SPARSEPS_RENDEZVOUS_TIMEOUT_S="60")  # fmt: skip
    base = {k: v for k, v in base.items() if not k.startswith("SPARSEPS_") or "TIMEOUT" in k}
    roles = [
        {**base, "TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": str(port)},
        {**base, "TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "0"},
        {**base, "TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "1"},
    ]
    argv = [sys.executable, str(SCRIPT), str(tmp_path / "data"), str(out)]
    logs = [open(tmp_path / f"role{i}.log", "w") for i in range(3)]  # noqa: SIM115
    procs = [subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)
             for env, f in zip(roles, logs, strict=True)]  # fmt: skip
    try:
        for p in procs[1:]:
            assert p.wait(timeout=90) == 0, (tmp_path / "role1.log").read_text()[-3000:]
        job_id = from_environ(roles[0]).job_id
        with PSClient([endpoint], timeout=20, job_id=job_id) as client:
            rows = client.stats()["total"]["tables"]["emb"]["rows"]
            client.stop_servers()
        assert procs[0].wait(timeout=30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for f in logs:
            f.close()
    records = [json.loads((out / f"worker.{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in records] == [2, 2] and {r["job_id"] for r in records} == {job_id}
    assert [len(r["files"]) for r in records] == [1, 1] and records[0]["files"] != records[1][
        "files"
    ]
    assert [r["train_count"] for r in records] == [2000, 2000]  # global: both workers' shares
    assert records[0]["test_count"] == 500 and records[0]["test_auc"] > 0.5  # wiring, not quality
    assert rows > 0
    server_log = (tmp_path / "role0.log").read_text()
    assert f"running server with rank id: 0, endpoint: {endpoint}" in server_log
