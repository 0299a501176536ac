"""The launchers' control store in-process: restart generations across two "nodes", and
bounded waits when a node does not follow (an error naming it, never a hang)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from sparseps.errors import DeadlineError, UnavailableError
from sparseps.launch.node_sync import StoreCoordinator
from sparseps.testing.jobs import free_port

pytestmark = pytest.mark.timeout(60)


# What must end before a timeout runs against a long one (LONG_S) and is bounded well under
# it: a loaded CI box can stretch an in-process round trip past a second.
LONG_S = 10.0


@pytest.fixture
def nodes(request):
    """Two coordinators; their timeout is 2 s, or the test's ``indirect`` parameter."""
    endpoint = f"127.0.0.1:{free_port()}"
    timeout_s = getattr(request, "param", 2.0)
    common = dict(peers=("a", "b"), job_id="job", worker_num=2, timeout_s=timeout_s)
    a = StoreCoordinator(endpoint, host_it=True, node="a", **common)
    b = StoreCoordinator(endpoint, host_it=False, node="b", **common)
    yield a, b
    b.close()
    a.close()  # the host closes last: it waits for b's "done"


def _poll(predicate, seconds: float = 5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"nothing from {predicate} within {seconds} s")


def test_a_restart_asked_by_one_node_is_followed_by_the_other(nodes):
    a, b = nodes
    a.report_workers_done(1)  # generation 0: node a's worker had finished
    reason = "worker 1 (pid 42) on b exited with code 7"
    asker = threading.Thread(target=b.restart, args=(reason,), daemon=True)
    asker.start()  # b waits until a has stopped its workers too
    assert _poll(a.remote_restart) == reason
    assert not a.all_workers_done()  # a new generation has work to do
    a.restart(None)
    asker.join(timeout=5)
    assert not asker.is_alive() and (a.generation, b.generation) == (1, 1)
    assert a.remote_restart() is None and b.remote_restart() is None
    # "all workers done" counts generation 1 only
    a.report_workers_done(1)
    assert not a.all_workers_done()
    b.report_workers_done(1)
    assert a.all_workers_done() and b.all_workers_done()


def test_a_node_that_never_stops_its_workers_times_the_restart_out(nodes):
    a, _ = nodes
    start = time.monotonic()
    with pytest.raises(DeadlineError, match=r"launchers on b did not stop") as info:
        a.restart("worker 0 on a exited with code 7")
    # the fixture's 2 s limit, not the 300 s default (room for a loaded box)
    assert 2.0 <= time.monotonic() - start < LONG_S
    assert (info.value.op, info.value.setting) == ("restart", "--rendezvous-timeout-s")
    assert a.generation == 0


@pytest.mark.parametrize("nodes", [LONG_S], indirect=True)
def test_a_failure_reported_during_the_restart_abandons_it(nodes):
    a, b = nodes
    timer = threading.Timer(0.3, b.report_failure, args=("server 1 on b exited with code 1",))
    timer.start()
    start = time.monotonic()
    with pytest.raises(UnavailableError, match="server 1 on b exited with code 1"):
        a.restart("worker 0 on a exited with code 7")
    assert time.monotonic() - start < LONG_S / 2  # the failure ended it, not the timeout
    timer.join()


@pytest.mark.parametrize("nodes", [LONG_S], indirect=True)
def test_a_cancelled_restart_stops_waiting_at_once(nodes):
    a, _ = nodes
    start = time.monotonic()
    with pytest.raises(UnavailableError, match="cancelled"):
        a.restart("worker 0 on a exited with code 7", cancelled=lambda: True)
    assert time.monotonic() - start < LONG_S / 2


def test_the_control_store_binds_the_endpoint_host_only():
    endpoint = f"127.0.0.1:{free_port()}"
    port = int(endpoint.rsplit(":", 1)[1])
    a = StoreCoordinator(
        endpoint, host_it=True, node="a", peers=("a",), job_id="j", worker_num=1, timeout_s=2.0
    )
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", port), timeout=2)
    finally:
        a.close()
    with pytest.raises(ConnectionRefusedError):  # close() stopped the server
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_a_secure_control_store_admits_the_job_key_only(tmp_path):
    from sparseps.rpc.security import Security, write_job_keys

    job, other = (Security(write_job_keys(tmp_path / name)) for name in ("job", "other"))
    endpoint = f"127.0.0.1:{free_port()}"
    common = dict(peers=("a", "b"), job_id="job", worker_num=2, timeout_s=LONG_S)
    a = StoreCoordinator(endpoint, host_it=True, node="a", security=job, **common)
    b = StoreCoordinator(endpoint, host_it=False, node="b", security=job, **common)
    try:
        b.report_failure("worker 1 on b exited with code 3")
        assert _poll(a.remote_failure) == "worker 1 on b exited with code 3"
        start = time.monotonic()
        with pytest.raises(UnavailableError, match="handshake failed"):
            StoreCoordinator(endpoint, host_it=False, node="c", security=other, **common)
        assert time.monotonic() - start < LONG_S / 2  # not the timeout: the handshake failed
    finally:
        b.close()
        a.close()
