"""``--secure`` covers every socket of a job (DESIGN §7; issue 52): the census.

A secure job on two "hosts" of this machine (two launchers, 127.0.0.1 and 127.0.0.2; one
server and one worker each) trains wide&deep in sync mode: the workers' collectives carry
dense gradients every step and metric buckets at the end. Twice while it runs (after the
workers' group formed, and after training), with the workers paused at a point of their
own (tests/security/scripts/census_job.py), the test lists every listening TCP socket of
every process of the job (the launchers, what their ``pids.json`` lists, and every
descendant) and probes each one as a peer that knows the job's public key but not its
secret (tests/security/_census.py): each must be a CURVE server of the job that refuses
that peer. Then it floods each port with raw bytes. The job must still finish correctly:
exact collectives after the probes, a trained model, exit code 0 on both launchers.

Before the worker group ran over CURVE this failed: the gloo pairs' listeners (one per
worker) answered no CURVE handshake, and neither did the plain-HTTP ``/metrics`` of every
role and launcher.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _census import flood, job_processes, listening, probe_all

from sparseps.rpc.security import JobKeys, write_job_keys  # noqa: E402
from sparseps.testing import wait_until
from sparseps.testing.jobs import finish, start_two_launchers

pytestmark = pytest.mark.timeout(600)

SCRIPT = Path(__file__).resolve().parent / "scripts" / "census_job.py"


def _census(nodes, public: bytes) -> dict[str, str]:
    """``{"<what> (pid P) ip:port": verdict}`` for every listening socket of the job."""
    processes = job_processes([proc.pid for _, _, proc in nodes], [d for _, d, _ in nodes])
    sockets = {
        (ip, port): f"{what} (pid {pid}) {ip}:{port}"
        for pid, what in processes.items()
        for ip, port in listening(pid)
    }
    verdicts = dict(zip(sockets.values(), probe_all(list(sockets), public), strict=True))
    for ip, port in sockets:
        flood(ip, port)
    return verdicts


def _wait_ready(job: Path, phase: int, nodes) -> None:
    def ready() -> bool:
        for _, _, proc in nodes:
            if proc.poll() is not None:
                outputs = finish([p for _, _, p in nodes], timeout=30)
                raise AssertionError("a launcher exited early:\n" + "\n\n".join(outputs))
        return all((job / f"ready.{phase}.{rank}").exists() for rank in (0, 1))

    wait_until(ready, 300, f"both workers at pause {phase}")


def test_every_listening_socket_of_a_secure_two_host_job_refuses_an_outsider(tmp_path):
    from sparseps.data.synthetic import write_dataset

    data, job, keys = tmp_path / "data", tmp_path / "job", tmp_path / "keys"
    write_dataset(data, rows=20_000, seed=7, files=4)
    write_job_keys(keys)
    job.mkdir()
    nodes = start_two_launchers(
        tmp_path, SCRIPT, str(job), str(data / "train"), str(data / "test"),
        options=("--secure", "--key-dir", str(keys)),
    )  # fmt: skip
    censuses = []
    try:
        for phase in (1, 2):
            _wait_ready(job, phase, nodes)
            censuses.append(_census(nodes, JobKeys.load(keys).public))
            (job / f"go.{phase}").write_text("1")
        outputs = finish([proc for _, _, proc in nodes], timeout=300)
    finally:
        finish([proc for _, _, proc in nodes], timeout=5)
    for phase, census in enumerate(censuses, 1):
        print(f"\ncensus {phase}:\n" + "\n".join(f"  {k}: {v}" for k, v in sorted(census.items())))
    codes = [proc.returncode for _, _, proc in nodes]
    assert codes == [0, 0], "\n\n".join(o[-4000:] for o in outputs)
    for census in censuses:
        # the census saw the job: both servers, both workers (worker 0 hosts the
        # rendezvous store too) and the launcher hosting the control store
        owners = " ".join(census)
        for role in ("server 0", "server 1", "worker 0", "worker 1", "launcher"):
            assert f"{role} (pid" in owners, (role, census)
        assert len(census) >= 6, census
        plain = {name: verdict for name, verdict in census.items() if verdict != "refused"}
        assert not plain, f"listening sockets that do not refuse an outsider: {plain}"
    for rank in (0, 1):
        record = json.loads((job / f"worker.{rank}.json").read_text())
        print(f"worker {rank}: {record}")
        assert record["checks"] == [True, True], record  # exact collectives before and after
        assert record["backend"] == "sparseps_curve", record
        # trained (seeded: 0.76 here); a broken gradient exchange gives ~0.5
        assert record["test_auc"] > 0.7, record


@pytest.mark.parametrize("flag", [("--metrics",), ("--status-port", "0")])
def test_a_secure_job_refuses_plain_http_and_says_why(tmp_path, flag):
    """``/metrics`` and the status page are plain HTTP: a secure job that asks for one
    does not start (no process of it runs), and the error says which flag and why."""
    from sparseps.testing.jobs import MINIMAL, run_launch

    done = run_launch("--server-num", "1", "--worker-num", "1", "--secure", *flag,
                      "--log-dir", str(tmp_path / "log"), str(MINIMAL), cwd=tmp_path)  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert f"{flag[0]}: serves plain HTTP, which --secure cannot cover" in done.stderr, done.stderr
    assert not (tmp_path / "log" / "pids.json").exists()
