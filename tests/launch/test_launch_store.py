"""The job's key-value store (sparseps.store.client): torch Store semantics, bounded waits
that name the key and the address, a server that survives bad messages, one interface
only, gloo over it across two processes, and CURVE: the job key works, a wrong key gets
a clear error at once."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import msgpack
import pytest
import zmq

from sparseps.errors import ConfigError, DeadlineError, RemoteError, UnavailableError
from sparseps.rpc import security
from sparseps.store.client import StoreServer
from sparseps.store.torch_store import ZmqStore
from sparseps.testing.jobs import clean_env, free_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    with StoreServer("127.0.0.1", 0) as srv:
        yield srv


@pytest.fixture
def store(server):
    with ZmqStore(server.address, timeout_s=2.0, setting="S", what="test store") as s:
        yield s


def test_set_get_add_check_delete(store):
    store.set("a", "1")  # str values are stored as utf-8 bytes, like TCPStore
    store.set("b", b"\x00\xff")
    assert store.get("a") == b"1" and store.get("b") == b"\x00\xff"
    assert store.add("n", 3) == 3 and store.add("n", -1) == 2 and store.add("n", 0) == 2
    assert store.get("n") == b"2"  # counters are decimal text
    assert store.check(["a", "b"]) and not store.check(["a", "missing"])
    assert store.check([])
    assert store.num_keys() == 3
    assert store.delete_key("a") and not store.delete_key("a")
    assert not store.check(["a"]) and store.num_keys() == 2


def test_compare_set_follows_torch(store):
    assert store.compare_set("k", "", "first") == b"first"  # absent + empty expected: set
    assert store.compare_set("k", "wrong", "x") == b"first"  # mismatch: current value
    assert store.compare_set("k", "first", "second") == b"second"
    assert store.get("k") == b"second"
    assert store.compare_set("absent", "e", "d") == b"e"  # absent: expected, nothing set
    assert not store.check(["absent"])


def test_wait_and_get_block_until_another_client_sets(server, store):
    with ZmqStore(server.address, timeout_s=2.0, setting="S") as other:
        threading.Timer(0.2, other.set, args=("late", "v")).start()
        start = time.monotonic()
        store.wait(["late"])
        # it blocked until the set; past the store's 2 s timeout it would have raised
        assert 0.15 < time.monotonic() - start < 10
        threading.Timer(0.2, other.set, args=("later", "w")).start()
        assert store.get("later") == b"w"


def test_wait_timeout_names_the_key_address_and_setting(server):
    # the store's own timeout is long: the wait gives up after the 0.3 s it was given, not
    # the store's 30 s (the bound leaves room for a loaded box)
    with ZmqStore(server.address, timeout_s=30.0, setting="S", what="test store") as store:
        store.set("here", "1")
        start = time.monotonic()
        with pytest.raises(DeadlineError) as info:
            store.wait(["here", "never"], timedelta(seconds=0.3))
        assert 0.3 <= time.monotonic() - start < 10
        exc = info.value
        assert "never" in str(exc) and server.address in str(exc) and "raise S" in str(exc)
        assert (exc.op, exc.address, exc.setting) == ("wait", server.address, "S")
        assert exc.seconds == pytest.approx(0.3)
        store.set_timeout(timedelta(seconds=0.2))  # get uses the store's timeout
        with pytest.raises(DeadlineError, match=r"get for key\(s\) \['never'\]"):
            store.get("never")
        assert server.stats().waiters == 0  # expired waits are dropped by the server too
        assert store.get("here") == b"1"  # the store works after a timeout


def test_malformed_messages_get_errors_and_the_store_lives_on(server, store):
    store.set("k", "v")
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"tcp://{server.address}")
    try:
        bad = [
            [b"\xc1 not msgpack"],
            [msgpack.packb([1, 2, 3])],
            [msgpack.packb({"op": "set", "id": 1})],  # missing fields
            [msgpack.packb({"op": "set", "id": 2, "key": "k", "value": "str", "x": 1})],
            [msgpack.packb({"op": "set", "id": 3, "key": 5, "value": b"v"})],
            [msgpack.packb({"op": "explode", "id": 4})],
            [msgpack.packb({"op": "get", "id": 5, "key": "k", "timeout_ms": -1})],
            [msgpack.packb({"op": "add", "id": 6, "key": "k", "amount": 1})],  # not an int
            [msgpack.packb({"op": "ping", "id": 7}), b"extra frame"],
        ]
        for frames in bad:
            raw.send_multipart(frames)
            assert raw.poll(2000), f"no reply to {frames!r}"
            reply = msgpack.unpackb(raw.recv())
            assert reply["ok"] is False and reply["kind"] == "bad" and reply["error"]
        raw.send(b"x" * (2 << 20))  # over MAXMSGSIZE: zmq drops the connection, not the store
    finally:
        raw.close(linger=0)
        ctx.term()
    assert server.stats().bad_requests == len(bad)
    assert store.get("k") == b"v"
    with pytest.raises(RemoteError, match="does not hold an integer"):
        store.add("k", 1)  # the client raises the server's refusal
    assert store.add("n", 1) == 1


def test_size_bound_refuses_a_set_and_keeps_serving():
    with (
        StoreServer("127.0.0.1", 0, max_bytes=1000) as srv,
        ZmqStore(srv.address, timeout_s=2.0, setting="S") as store,
    ):
        store.set("a", b"x" * 500)
        with pytest.raises(RemoteError, match="bound of 1000") as info:
            store.set("b", b"x" * 600)
        assert info.value.remote_type == "StoreFull"
        store.set("a", b"y" * 900)  # replacing counts the difference
        assert store.get("a") == b"y" * 900


def test_binds_only_the_given_interface():
    with StoreServer("127.0.0.1", 0) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=2):
            pass
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", srv.port), timeout=2)
    with pytest.raises(ConfigError, match="every interface"):
        StoreServer("0.0.0.0", 0)


def test_a_busy_port_and_a_silent_address_are_named():
    with StoreServer("127.0.0.1", 0) as srv, pytest.raises(UnavailableError) as info:
        StoreServer("127.0.0.1", srv.port)
    assert f"cannot listen on 127.0.0.1:{srv.port}" in str(info.value)
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(DeadlineError) as info:
        ZmqStore(address, timeout_s=0.5, setting="S", what="test store")
    assert 0.5 <= time.monotonic() - start < 10  # bounded by the 0.5 s: no hang
    assert (info.value.op, info.value.address, info.value.setting) == ("ping", address, "S")


def test_a_lost_server_is_reported_at_once_not_waited_out(server):
    store = ZmqStore(server.address, timeout_s=30.0, setting="S")
    store.set("k", "v")
    server.close()
    start = time.monotonic()
    with pytest.raises(UnavailableError, match="lost the connection"):
        store.wait(["never"])
    assert time.monotonic() - start < 10.0  # not the 30 s timeout (room for a loaded box)
    store.close()


_GLOO_CHILD = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from sparseps.env import Role, RoleEnv
    from sparseps.runtime.rendezvous import connect_store, store_barrier
    from sparseps.runtime.worker_group import WorkerGroup
    rank, master = int(sys.argv[1]), sys.argv[2]
    env = RoleEnv(role=Role.WORKER, rank=rank, servers=("127.0.0.1:1",), worker_num=2,
                  master=master, log_dir=".", job_id="j", key_dir=sys.argv[3])
    store = connect_store(env, timeout_s=30, setting="S")
    store_barrier(store, "b", rank=rank, world=2, timeout_s=30, warn_s=30, address=master)
    WorkerGroup(timeout_s=30, env=env).form(store, rank=rank, world=2, prefix="sparseps/group")
    t = torch.tensor([float(rank + 1)] * 4)
    dist.all_reduce(t)
    dist.barrier()
    print("SUM", t.tolist(), type(store).__name__, flush=True)
    dist.destroy_process_group()
    """
)


def _two_workers(tmp_path, key_dir: str = ""):
    master = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _GLOO_CHILD, str(rank), master, key_dir],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (1, 0)  # worker 1 first: it waits for worker 0's store to come up
    ]
    outs = [p.communicate(timeout=50)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
        assert "SUM [3.0, 3.0, 3.0, 3.0] ZmqStore" in out, out


@pytest.mark.timeout(90)
def test_gloo_init_and_all_reduce_over_the_store_in_two_processes(tmp_path):
    _two_workers(tmp_path)


def test_dropping_the_hosting_store_frees_the_port():
    import gc

    srv = StoreServer("127.0.0.1", 0)
    store = ZmqStore(srv.address, timeout_s=2.0, setting="S", owner=srv)
    store.set("k", "v")
    del store  # role.stop() lets go of worker 0's store this way
    gc.collect()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2)
    with StoreServer("127.0.0.1", srv.port):  # the port can be bound again
        pass


# -- CURVE ---------------------------------------------------------------------------


@pytest.fixture
def job_keys(tmp_path):
    return security.write_job_keys(tmp_path / "keys")


def test_secure_round_trip_with_the_job_key(job_keys):
    sec = security.Security(job_keys)
    with (
        StoreServer("127.0.0.1", 0, security=sec) as srv,
        ZmqStore(srv.address, timeout_s=2.0, setting="S", security=sec) as store,
    ):
        store.set("k", b"v")
        assert store.get("k") == b"v" and store.add("n", 2) == 2


@pytest.mark.parametrize("client", ["wrong key", "no key"])
def test_a_wrong_or_missing_key_gets_a_clear_error_at_once(tmp_path, job_keys, client):
    sec = security.Security(job_keys)
    other = security.Security(security.write_job_keys(tmp_path / "other"))
    with StoreServer("127.0.0.1", 0, security=sec) as srv:
        start = time.monotonic()
        with pytest.raises(UnavailableError, match="handshake failed") as info:
            ZmqStore(
                srv.address,
                timeout_s=30.0,  # the error must not wait for the timeout
                setting="S",
                security=other if client == "wrong key" else None,
            )
        assert time.monotonic() - start < 10.0  # room for a loaded box, far under 30 s
        assert info.value.address == srv.address
        assert ("CURVE refused" if client == "wrong key" else "SPARSEPS_KEY_DIR") in str(info.value)
        assert srv.stats().requests == 0  # nothing from the peer reached the store
        with ZmqStore(srv.address, timeout_s=2.0, setting="S", security=sec) as good:
            assert good.check([]) is True  # the store still serves the job


@pytest.mark.timeout(90)
def test_gloo_over_the_secure_store_in_two_processes(tmp_path, job_keys):
    _two_workers(tmp_path, job_keys.source)
