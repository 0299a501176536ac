"""Bad requests at live servers: each gets an error reply, nothing breaks.

Two kinds: 3000 malformed messages (protocol violations, answered with ProtocolError),
and well-formed requests that the servers must refuse on their merits (wrong dim, a
missing table, misrouted keys, a conflicting config, sizes that would exhaust memory).

Memory bound: a server's resident set may grow by at most 32 MiB over the run (the
messages are small or refused before anything is allocated; a leak of the received
frames, or an allocation for a refused request, would show as growth).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.core.routing import dense_server_of, server_of
from sparseps.errors import RemoteError
from sparseps.rpc.client import PSClient
from sparseps.rpc.protocol import Limits, encode_request
from sparseps.table import SparseTable
from sparseps.testing import local_cluster, wait_until
from sparseps.testing.faults import RawPeer, malformed_messages

pytestmark = pytest.mark.timeout(120)

MESSAGES = 3000
RSS_BOUND = 32 << 20


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def test_malformed_frames_get_error_replies_and_server_keeps_serving():
    config = TableConfig(name="emb", dim=8, rule=optim.Adagrad(lr=0.1), seed=1)
    reference = SparseTable(config)
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**63, 5000, dtype=np.uint64)
    grads = rng.standard_normal((5000, 8)).astype(np.float32)
    reference.push(keys, grads)
    with local_cluster(servers=1, timeout=30, max_message_bytes=8 << 20) as cluster:
        client = cluster.client(timeout=20)
        client.create_table(config)
        client.push("emb", keys, grads).wait()
        pid = cluster.pid(0)
        messages = list(malformed_messages(MESSAGES + 300, seed=42))
        with RawPeer(cluster.endpoints[0]) as peer:
            # Warm-up: the first messages grow allocator pools and the log buffers.
            for _, frames in messages[:300]:
                peer.send(frames)
            assert len(peer.replies(300, timeout=30)) == 300
            rss_before = _rss_bytes(pid)
            replies = []
            for start in range(300, len(messages), 500):
                batch = messages[start : start + 500]
                for _, frames in batch:
                    peer.send(frames)
                replies += peer.replies(len(batch), timeout=30)
            rss_after = _rss_bytes(pid)
        assert len(replies) == MESSAGES
        assert all(r.get("ok") is False and r["error"]["type"] == "ProtocolError" for r in replies)
        assert all(r["error"]["message"] for r in replies)
        assert rss_after - rss_before < RSS_BOUND, (rss_before, rss_after)

        # A frame over the size limit is dropped by the transport with its connection (no
        # reply, no crash), and the server logs the closed connection naming the limit.
        line = f"over max_message_bytes={8 << 20}"
        with RawPeer(cluster.endpoints[0]) as peer:
            time.sleep(0.5)  # connected, and earlier peers' closings logged
            closed_before = cluster.log_text(0).count(line)
            peer.send([b"\x80", b"\x00" * (9 << 20)])
            assert peer.replies(1, timeout=1.0) == []
            # Logged while this peer is still open: the server dropped the connection.
            logged = lambda: cluster.log_text(0).count(line) > closed_before  # noqa: E731
            try:
                wait_until(logged, 10, f"the server to log {line!r}")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{cluster.log_text(0)[-2000:]}") from None

        np.testing.assert_array_equal(client.pull("emb", keys).wait(), reference.pull(keys))
        stats = client.stats()["servers"][0]
        assert stats["bad_messages"] == MESSAGES + 300
        assert cluster.processes[0].poll() is None


MAX_MESSAGE = 8 << 20
ROUNDS = 20


def _expect_remote(call, remote_type: str, *fragments: str) -> None:
    """``call()`` must raise RemoteError of ``remote_type`` whose message has every fragment."""
    with pytest.raises(RemoteError) as info:
        call()
    assert info.value.remote_type == remote_type, str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def _bad_requests(cluster, client, wrong_client, keys) -> int:
    """One round of well-formed but bad requests; returns how many server-side failures
    it causes (each server that refuses its part counts one)."""
    n = len(keys)
    # Wrong dim: the table is [*, 8], the gradients [*, 4]; both servers own some keys.
    _expect_remote(
        lambda: client.push("emb", keys, np.ones((n, 4), np.float32)).wait(),
        "InputError",
        "grads must be a C-contiguous float32 array of shape (",
        ", 8), found dtype float32, shape (",
    )
    # A table that does not exist is an error, never a silent create.
    _expect_remote(
        lambda: client.push("nope", keys, np.ones((n, 8), np.float32)).wait(),
        "InputError",
        "'nope' does not exist",
    )
    # A client that believes server 0 is alone sends it every key (pull and push).
    _expect_remote(
        lambda: wrong_client.pull("emb", keys).wait(), "InputError", "belong to other servers"
    )
    _expect_remote(
        lambda: wrong_client.push("emb", keys, np.ones((n, 8), np.float32)).wait(),
        "InputError",
        "belong to other servers",
    )
    # Same name, another config.
    other = TableConfig(name="emb", dim=8, rule=optim.SGD(lr=0.1), seed=1)
    _expect_remote(
        lambda: client.create_table(other), "ConfigError", "rule.name: existing='adagrad'"
    )
    # 2**31-1 floats with Adam would be ~24 GiB on one server.
    _expect_remote(
        lambda: client.create_dense("huge", 2**31 - 1, optim.Adam()),
        "ConfigError",
        f"size must be 1..{Limits(MAX_MESSAGE).max_dense_size}",
        f"Limits.max_message_bytes={MAX_MESSAGE}",
        "--max-message-bytes",
    )
    # A pull whose reply would not fit in one message: 3 * 2**15 keys per server of a
    # 64-float table is 24 MiB each, over the 8 MiB limit (the request is only 768 KiB).
    wide = np.arange(1, 6 * 2**15 + 1, dtype=np.uint64)
    _expect_remote(
        lambda: client.pull("wide", wide).wait(),
        "InputError",
        f"Limits.max_message_bytes={MAX_MESSAGE}",
        "--max-message-bytes",
        "send at most 32752 keys",
    )
    # An absurd sparse dim, sent raw (TableConfig refuses to build one on the client).
    config = TableConfig(name="big", dim=8).to_dict() | {"dim": 2**31}
    with RawPeer(cluster.endpoints[0]) as peer:
        peer.send(encode_request("create_table", 9, "big", args={"config": config}))
        [reply] = peer.replies(1, timeout=20)
    assert reply["ok"] is False and reply["error"]["type"] == "ConfigError", reply
    assert "dim" in reply["error"]["message"] and "65536" in reply["error"]["message"]
    return 2 + 2 + 1 + 1 + 2 + 1 + 2 + 1


def _failed(client) -> int:
    return sum(server["failed"] for server in client.stats()["servers"])


def test_well_formed_bad_requests_get_errors_and_servers_keep_serving():
    config = TableConfig(name="emb", dim=8, rule=optim.Adagrad(lr=0.1), seed=1)
    reference = SparseTable(config)
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**63, 2000, dtype=np.uint64)
    grads = rng.standard_normal((2000, 8)).astype(np.float32)
    reference.push(keys, grads)
    assert set(server_of(keys, 2)) == {0, 1}
    with local_cluster(servers=2, timeout=30, max_message_bytes=MAX_MESSAGE) as cluster:
        client = cluster.client(timeout=20)
        client.create_table(config)
        client.create_table(TableConfig(name="wide", dim=64, rule=optim.SGD(lr=0.1)))
        client.push("emb", keys, grads).wait()
        with PSClient(cluster.endpoints[:1], timeout=20) as wrong_client:
            expected = _bad_requests(cluster, client, wrong_client, keys)  # warm-up
            rss_before = [_rss_bytes(cluster.pid(rank)) for rank in range(2)]
            for _ in range(ROUNDS):
                expected += _bad_requests(cluster, client, wrong_client, keys)
            rss_after = [_rss_bytes(cluster.pid(rank)) for rank in range(2)]
        for before, after in zip(rss_before, rss_after, strict=True):
            assert after - before < RSS_BOUND, (rss_before, rss_after)

        # The servers still answer correctly, and created nothing for the bad requests.
        np.testing.assert_array_equal(client.pull("emb", keys).wait(), reference.pull(keys))
        stats = client.stats()
        assert set(stats["total"]["tables"]) == {"emb", "wide"}
        assert stats["total"]["tables"]["emb"]["rows"] == len(np.unique(keys))
        assert stats["total"]["tables"]["wide"]["rows"] == 0
        assert all(not server["dense"] for server in stats["servers"])
        assert stats["total"]["bad_messages"] == 0
        # Every refusal was counted; a handle raises at its first error, so the other
        # server's refusal of the same call may still be on its way for a moment.
        deadline = time.monotonic() + 10
        while _failed(client) < expected and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _failed(client) == expected
        assert all(process.poll() is None for process in cluster.processes)

        # The dense bound is exact: the largest allowed table can be pulled and pushed
        # whole through 8 MiB messages.
        size = Limits(MAX_MESSAGE).max_dense_size
        client.create_dense("largest", size, optim.SGD(lr=1.0))
        with pytest.raises(RemoteError, match=f"got {size + 1}"):
            client.create_dense("larger", size + 1, optim.SGD(lr=1.0))
        client.push_dense("largest", np.ones(size, np.float32)).wait()
        values = client.pull_dense("largest").wait()
        assert values.shape == (size,) and (values == -1.0).all()
        owner = dense_server_of("largest", 2)
        assert client.stats()["servers"][owner]["dense"]["largest"]["size"] == size
