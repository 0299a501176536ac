"""Dead and hung servers: bounded, descriptive failures; late replies are ignored."""

from __future__ import annotations

import os
import signal
import socket
import struct
import time

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.core.routing import server_of
from sparseps.errors import ConfigError, DeadlineError, RemoteError, UnavailableError
from sparseps.rpc.client import PSClient
from sparseps.testing import local_cluster

pytestmark = pytest.mark.timeout(90)

TIMEOUT = 2.0
# Past the timeout a failing call may take this long on a loaded box, still far under
# the client's default (60 s) that a call ignoring its own timeout would wait out.
MARGIN = 5.0
CONFIG = TableConfig(name="emb", dim=4, rule=optim.SGD(lr=1.0), seed=2)


def _keys_on_all(servers: int) -> np.ndarray:
    keys = np.arange(1, 400, dtype=np.uint64)
    assert set(server_of(keys, servers).tolist()) == set(range(servers))
    return keys


def test_killed_server_fails_within_timeout_naming_the_peer():
    with local_cluster(servers=2, timeout=30) as cluster, cluster.client(timeout=TIMEOUT) as client:
        keys = _keys_on_all(2)
        with cluster.client(timeout=30) as setup:  # the set-up is not what is timed
            setup.create_table(CONFIG)
            setup.push("emb", keys, np.ones((len(keys), 4), np.float32)).wait()
        cluster.kill(1)
        start = time.monotonic()
        with pytest.raises((DeadlineError, UnavailableError)) as info:
            client.pull("emb", keys).wait()
        elapsed = time.monotonic() - start
        assert elapsed < TIMEOUT + MARGIN
        error = info.value
        assert (error.op, error.role, error.rank, error.address) == (
            "pull",
            "server",
            1,
            cluster.endpoints[1],
        )
        assert isinstance(error, DeadlineError)
        assert error.seconds == TIMEOUT and "timeout" in error.setting
        assert "SPARSEPS_RPC_TIMEOUT" not in error.setting  # an explicit argument set it
        # The live server still answers for its own keys.
        mine = keys[server_of(keys, 2) == 0]
        assert client.pull("emb", mine).wait().shape == (len(mine), 4)


def test_late_reply_from_hung_server_is_ignored():
    with local_cluster(servers=1, timeout=30) as cluster, cluster.client(timeout=1.0) as client:
        with cluster.client(timeout=30) as setup:  # the set-up is not what is timed
            setup.create_table(CONFIG)
        keys = np.arange(10, dtype=np.uint64)
        expected = client.pull("emb", keys).wait(timeout=30)
        pid = cluster.pid(0)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(DeadlineError):
                client.pull("emb", keys[:3]).wait()
        finally:
            os.kill(pid, signal.SIGCONT)
        # The 3-row reply arrives late; the next call must get its own 10 rows.
        rows = client.pull("emb", keys).wait(timeout=10)
        np.testing.assert_array_equal(rows, expected)


def test_env_timeout_setting_is_named(monkeypatch):
    monkeypatch.setenv("SPARSEPS_RPC_TIMEOUT", "0.5")
    with PSClient(["127.0.0.1:9"]) as client:
        assert client.timeout == 0.5
        start = time.monotonic()
        with pytest.raises(DeadlineError) as info:
            client.ping()
        assert time.monotonic() - start < 0.5 + MARGIN
        assert info.value.setting == "PSClient(timeout=...) or SPARSEPS_RPC_TIMEOUT"
        assert info.value.rank == 0 and info.value.address == "127.0.0.1:9"
    monkeypatch.setenv("SPARSEPS_RPC_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="SPARSEPS_RPC_TIMEOUT"):
        PSClient(["127.0.0.1:9"])


def test_client_rejects_bad_arguments():
    with pytest.raises(ConfigError, match="endpoints"):
        PSClient([])
    with pytest.raises(ConfigError, match="port"):
        PSClient(["localhost:http"])
    with pytest.raises(ConfigError, match="timeout"):
        PSClient(["127.0.0.1:9"], timeout=0)
    with pytest.raises(ConfigError, match="max_in_flight"):
        PSClient(["127.0.0.1:9"], max_in_flight=0)


def test_ping_detects_a_wrong_endpoint_list():
    with local_cluster(servers=2, timeout=30) as cluster:
        swapped = [cluster.endpoints[1], cluster.endpoints[0]]
        with (
            PSClient(swapped, timeout=5) as client,
            pytest.raises(ConfigError, match="rank 1 of 2"),
        ):
            client.ping()


def test_server_refuses_keys_routed_for_another_cluster_size():
    with local_cluster(servers=2, timeout=30) as cluster:
        with cluster.client(timeout=10) as client:
            client.create_table(CONFIG)
        # A client that believes server 0 is the only server sends it every key.
        with PSClient(cluster.endpoints[:1], timeout=10) as wrong:
            with pytest.raises(ConfigError, match="rank 0 of 2"):
                wrong.ping()
            keys = _keys_on_all(2)
            with pytest.raises(RemoteError, match="belong to other servers"):
                wrong.pull("emb", keys).wait()


def test_connection_reset_during_the_handshake_is_not_an_authentication_failure(caplog):
    """A server that dies while a plain client connects resets the connection mid-handshake
    (zmq: HANDSHAKE_FAILED_NO_DETAIL with ECONNRESET). That is a dead server, not a key
    problem: calls wait and time out naming the timeout, and no "authentication failed"
    (which, before, failed every call to that server at once with the advice to set a key)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(10)
    port = listener.getsockname()[1]
    with PSClient([f"127.0.0.1:{port}"], timeout=TIMEOUT) as client:
        for _ in range(2):  # reset the first connection and the reconnection
            conn, _ = listener.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.settimeout(10)
            # the client's greeting has arrived: its handshake is under way
            assert conn.recv(1, socket.MSG_PEEK)
            conn.close()  # SO_LINGER 0: a reset, not an orderly close
        time.sleep(0.2)  # the monitor event has arrived
        start = time.monotonic()
        with pytest.raises(DeadlineError) as info:
            client.stats()
        assert time.monotonic() - start >= TIMEOUT - 0.1  # waited: not failed at once
    listener.close()
    assert "did not answer within" in str(info.value)
    assert "authentication failed" not in caplog.text + str(info.value)
