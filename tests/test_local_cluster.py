"""sparseps.testing.local_cluster forks its servers from a fork server of the process
(sparseps.launch.fork_server): each is what ``python -m sparseps.server`` would be; another
environment gets another fork server; a server starts as a fresh interpreter when asked
or when the fork server is switched off."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from sparseps.errors import UnavailableError
from sparseps.launch.fork_server import ForkedProcess
from sparseps.testing import local_cluster


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_servers_are_forked_and_behave_as_started_ones():
    with local_cluster(servers=2) as cluster:
        processes = list(cluster.processes)
        assert all(isinstance(p, ForkedProcess) for p in processes)
        forker = _parent(cluster.pid(0))
        assert forker != os.getpid() and _parent(cluster.pid(1)) == forker
        with cluster.client() as client:
            client.ping()
        # stderr is the server's log; its endpoint is the rank's
        assert f"rank id: 1, endpoint: {cluster.endpoints[1]}" in cluster.log_text(1)
        cluster.kill(1)
        assert processes[1].returncode == -signal.SIGKILL
    assert processes[0].returncode == 0  # stopped by the stop op, cleanly
    with local_cluster(servers=1) as again:  # the same fork server serves the next cluster
        assert _parent(again.pid(0)) == forker


def test_a_forked_server_that_cannot_start_says_why():
    expected = "exited with code 1.*replicas=3 needs at least"
    with (
        pytest.raises(UnavailableError, match=expected),
        local_cluster(servers=1, environ={"SPARSEPS_REPLICAS": "3"}),
    ):
        pass


def test_another_environment_gets_its_own_fork_server(monkeypatch):
    with local_cluster(servers=1) as cluster:
        forker = _parent(cluster.pid(0))
    # what the interpreter reads at start differs: the first fork server cannot serve it
    with local_cluster(servers=1, environ={"PYTHONHASHSEED": "3"}) as cluster:
        assert isinstance(cluster.processes[0], ForkedProcess)
        other = _parent(cluster.pid(0))
        assert other not in (forker, os.getpid())
        assert _environ(cluster.pid(0))["PYTHONHASHSEED"] == "3"
    monkeypatch.setenv("SOME_LIBRARY_SETTING", "1")  # as importing ray does to its process
    with local_cluster(servers=1) as cluster:
        assert _parent(cluster.pid(0)) not in (forker, other, os.getpid())
        assert _environ(cluster.pid(0))["SOME_LIBRARY_SETTING"] == "1"
    monkeypatch.delenv("SOME_LIBRARY_SETTING")
    with local_cluster(servers=1) as cluster:  # back to the first environment, and its server
        assert _parent(cluster.pid(0)) == forker
    # pytest names the running test in the environment: the next test's servers are forked
    # by the same fork server (else each test would start its own)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_next.py::test_next (call)")
    with local_cluster(servers=1) as cluster:
        assert _parent(cluster.pid(0)) == forker
    # and so are those of another xdist worker of the suite, each with its own name
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    with local_cluster(servers=1) as cluster:
        assert _parent(cluster.pid(0)) == forker


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.parametrize("how", ["fork=False", "SPARSEPS_FORK_SERVER=0"])
def test_fresh_interpreters_when_asked(how, monkeypatch):
    options: dict = {"fork": False} if how == "fork=False" else {}
    if how == "SPARSEPS_FORK_SERVER=0":
        monkeypatch.setenv("SPARSEPS_FORK_SERVER", "0")
    with local_cluster(servers=1, **options) as cluster:
        assert isinstance(cluster.processes[0], subprocess.Popen)
        assert _parent(cluster.pid(0)) == os.getpid()
        with cluster.client() as client:
            client.ping()
