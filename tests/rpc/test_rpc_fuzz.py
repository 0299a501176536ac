"""3000 malformed messages at a live server: each gets an error reply, nothing breaks.

Memory bound: the server's resident set may grow by at most 32 MiB over the run (the
messages are small; a leak of the received frames would show as steady growth).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.table import SparseTable
from sparseps.testing import local_cluster
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

        # A frame over the size limit is dropped by the transport (no reply, no crash).
        with RawPeer(cluster.endpoints[0]) as peer:
            peer.send([b"\x80", b"\x00" * (9 << 20)])
            assert peer.replies(1, timeout=1.0) == []

        np.testing.assert_array_equal(client.pull("emb", keys).wait(), reference.pull(keys))
        stats = client.stats()["servers"][0]
        assert stats["bad_messages"] == MESSAGES + 300
        assert cluster.processes[0].poll() is None
