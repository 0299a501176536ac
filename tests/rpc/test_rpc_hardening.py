"""Hardening of the request path: job identity, idempotent retried pushes, no tracebacks
to peers, rate-limited logs, liveness behind long ops, separate file-op timeouts, names."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import threading
import time

import msgpack
import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.env import settings
from sparseps.errors import ConfigError, DeadlineError, ProtocolError
from sparseps.rpc.client import PSClient
from sparseps.rpc.protocol import Limits, decode_request, encode_request
from sparseps.server.handlers import ServerState
from sparseps.server.loop import process
from sparseps.testing import local_cluster, wait_until
from sparseps.testing.faults import RawPeer

pytestmark = pytest.mark.timeout(120)

CONFIG = TableConfig(name="emb", dim=4, rule=optim.SGD(lr=1.0), seed=3)
KEYS = np.arange(1, 65, dtype=np.uint64)


def _ones():
    return np.ones((len(KEYS), 4), np.float32)


def test_a_client_of_another_job_is_refused_and_changes_nothing():
    with local_cluster(servers=2, job_id="job-new") as cluster:
        with cluster.client() as mine:
            mine.create_table(CONFIG)
            before = mine.pull("emb", KEYS).wait()
        for other in ("job-old", None):
            with PSClient(cluster.endpoints, timeout=10, job_id=other) as stale:
                if other is None:
                    stale._channel.job_id = None  # a tool that sends no job id at all
                with pytest.raises(ProtocolError) as info:
                    stale.push("emb", KEYS, _ones()).wait()
                text = str(info.value)
                assert "'job-new'" in text
                assert ("'job-old'" in text) if other else ("no job id" in text)
        with cluster.client() as mine:
            np.testing.assert_array_equal(mine.pull("emb", KEYS).wait(), before)
            assert mine.stats()["total"]["bad_messages"] >= 2


def test_the_job_id_defaults_to_the_launchers_environment(monkeypatch):
    monkeypatch.setenv("SPARSEPS_JOB_ID", "job-env")
    with (
        local_cluster(servers=1, job_id="job-env") as cluster,
        PSClient(cluster.endpoints, timeout=10) as client,
    ):
        assert client.job_id == "job-env"
        client.create_table(CONFIG)  # accepted: same job


def test_a_push_sent_again_after_a_timeout_is_applied_once():
    with (
        local_cluster(servers=1) as cluster,
        # retries reach 6 s past the stop: the server resumes at 1.6 s, and on a loaded
        # machine may take seconds to answer the first copies (2 retries failed once)
        cluster.client(timeout=1.0, update_retries=5) as client,
    ):
        with cluster.client(timeout=30) as setup:
            setup.create_table(CONFIG)
        initial = client.pull("emb", KEYS).wait(timeout=30)
        pid = cluster.pid(0)
        os.kill(pid, signal.SIGSTOP)  # the server takes the request but cannot answer
        resume = threading.Timer(1.6, os.kill, (pid, signal.SIGCONT))
        resume.start()
        try:
            client.push("emb", KEYS, _ones()).wait()  # times out once, sent again
        finally:
            resume.join()
            os.kill(pid, signal.SIGCONT)
        # both copies reached the server; SGD lr=1 applied once: initial - 1
        np.testing.assert_array_equal(client.pull("emb", KEYS).wait(), initial - 1.0)
        assert client.stats()["total"]["duplicates"] >= 1


def test_the_same_update_frames_twice_are_applied_once_but_a_new_seq_is_applied():
    with local_cluster(servers=1) as cluster, cluster.client() as client:
        client.create_table(CONFIG)
        initial = client.pull("emb", KEYS).wait()
        grads = _ones()

        def frames(request_id, seq):
            return [bytes(f) for f in encode_request(
                "push", request_id, "emb", [KEYS, grads], client=77, seq=seq
            )]  # fmt: skip

        with RawPeer(cluster.endpoints[0]) as peer:
            for request_id, seq in ((1, 5), (2, 5), (3, 6)):
                peer.send(frames(request_id, seq))
            replies = peer.replies(3, timeout=10)
        assert [r["ok"] for r in replies] == [True, True, True]
        assert sorted(bool((r.get("result") or {}).get("duplicate")) for r in replies) == [
            False,
            False,
            True,
        ]
        np.testing.assert_array_equal(client.pull("emb", KEYS).wait(), (initial - 1.0) - 1.0)


def _state() -> ServerState:
    return ServerState(0, 1, "127.0.0.1:1")


def test_a_repeated_push_dense_with_pull_is_applied_once_and_still_reads_the_values():
    state, limits = _state(), Limits()
    init = np.arange(4, dtype=np.float32)
    rule = optim.SGD(lr=0.5).to_dict()
    create = encode_request("create_dense", 1, "d", [init], {"size": 4, "rule": rule})
    state.handle(decode_request([bytes(f) for f in create], limits))
    frames = [bytes(f) for f in encode_request(
        "push_dense", 2, "d", [np.ones(4, np.float32)], {"pull": True}, client=7, seq=1
    )]  # fmt: skip
    first = state.handle(decode_request(frames, limits))
    again = state.handle(decode_request(frames, limits))  # a retry of the same update
    assert first[0] is None and again[0] == {"duplicate": True}
    np.testing.assert_array_equal(first[1][0], init - 0.5)
    np.testing.assert_array_equal(again[1][0], init - 0.5)  # read back, not applied twice
    plain = [bytes(f) for f in encode_request(
        "push_dense", 3, "d", [np.ones(4, np.float32)], client=7, seq=2
    )]  # fmt: skip
    assert state.handle(decode_request(plain, limits)) == (None, [])  # no pull, no values
    assert state.handle(decode_request(plain, limits)) == ({"duplicate": True}, [])


def _ping_frames():
    return [bytes(f) for f in encode_request("ping", 9)]


def test_a_handler_bug_reaches_the_peer_without_a_traceback(caplog):
    state = _state()

    def broken(request):
        raise KeyError("secret internal detail")

    state.ops["ping"] = dataclasses.replace(state.ops["ping"], handler=broken)  # the op table
    with caplog.at_level(logging.ERROR, logger="sparseps.server.loop"):
        reply = msgpack.unpackb(process(state, _ping_frames(), Limits(), "peer")[0])
    error = reply["error"]
    assert reply["ok"] is False and error["type"] == "KeyError"
    assert error["traceback"] == ""
    assert "incident" in error["message"] and "Traceback" not in error["message"]
    assert "Traceback" in caplog.text  # the server's log keeps it


def test_repeated_bad_messages_are_counted_but_rate_limited_in_the_log(caplog):
    state = _state()
    with caplog.at_level(logging.WARNING, logger="sparseps.server.loop"):
        for _ in range(200):
            process(state, [b"\xc1garbage"], Limits(), "peer")
    lines = [r for r in caplog.records if "bad message" in r.getMessage()]
    assert 1 <= len(lines) <= state.log_budget.burst
    assert state.counters.snapshot()["bad_messages"] == 200


def test_table_names_with_a_trailing_newline_or_control_characters_are_refused():
    with pytest.raises(ConfigError):
        TableConfig(name="emb\n", dim=4)
    for name in ("emb\n", "e\x00mb", "emb ", ""):
        frames = [bytes(f) for f in encode_request("pull", 1, name, [KEYS])]
        with pytest.raises(ProtocolError):
            decode_request(frames)


def test_timeouts_must_be_finite():
    for bad in (math.inf, math.nan, -1.0, 0):
        with pytest.raises(ConfigError):
            PSClient(["127.0.0.1:9"], timeout=bad)
        with pytest.raises(ConfigError):
            PSClient(["127.0.0.1:9"], timeout=5, file_timeout=bad)
    for text in ("inf", "nan", "-inf", "0"):
        with pytest.raises(ConfigError):
            settings({"SPARSEPS_RPC_TIMEOUT": text})


def test_ping_is_answered_while_long_ops_queue_and_saves_have_their_own_timeout(tmp_path):
    big = TableConfig(name="big", dim=64, rule=optim.Adam(lr=0.01), seed=1)
    with local_cluster(servers=1, threads=1) as cluster:
        with cluster.client(timeout=60) as setup:
            setup.create_table(big)
            rng = np.random.default_rng(0)
            # 500k rows of 192 floats (~380 MB): a save of 0.55-5 s here, so a ping queued
            # behind it would miss its alone / 2 deadline by far; 6 pushes (3x the rows)
            # took 3x as long in each of the four saves and checked nothing more. A box
            # that saves them faster gets more rows (each round 250k more, at most two).
            for pushes in range(4):
                keys = rng.integers(1, 2**63, 250_000, dtype=np.uint64)
                setup.push("big", keys, np.ones((len(keys), 64), np.float32)).wait()
                if pushes == 0:
                    continue
                start = time.monotonic()
                setup.save("big", tmp_path / f"alone{pushes}")
                alone = time.monotonic() - start
                if alone > 0.5:
                    break
        assert alone > 0.5, f"the table saves too fast ({alone:.2f} s) to show queueing"
        # A data-plane timeout far below the save's duration: saves use file_timeout.
        # alone / 2: a ping queued on the pool thread waits at least a whole save (two
        # more are queued ahead of it), while one answered beside the saves may still be
        # slowed by the save's CPU on a loaded box (alone / 4 may be as little as 0.13 s)
        with cluster.client(timeout=alone / 2, file_timeout=120) as client:
            saves = [
                threading.Thread(target=client.save, args=("big", tmp_path / f"s{i}"))
                for i in range(3)
            ]
            for thread in saves:
                thread.start()
            # The ping leaves once all three saves were sent (their threads wait for the
            # replies): one connection delivers in order, so the server takes them before
            # the ping, one on the only pool thread and two waiting for it.
            wait_until(lambda: client._channel.waiting() == 3, 60, "the three saves sent")
            start = time.monotonic()
            client.ping()
            waited = time.monotonic() - start
            for thread in saves:
                thread.join(120)
        print(f"\nsave alone {alone:.2f} s, ping behind three saves {waited * 1000:.1f} ms")
        assert waited < alone / 2, f"ping waited {waited:.2f} s behind saves of {alone:.2f} s"
        for i in range(3):
            assert any((tmp_path / f"s{i}").iterdir())


def test_a_data_plane_timeout_still_names_its_setting():
    with local_cluster(servers=1) as cluster, cluster.client(timeout=0.5) as client:
        client.create_table(CONFIG)
        os.kill(cluster.pid(0), signal.SIGSTOP)
        try:
            with pytest.raises(DeadlineError) as info:
                client.pull("emb", KEYS).wait()
        finally:
            os.kill(cluster.pid(0), signal.SIGCONT)
        assert info.value.seconds == 0.5


def test_file_ops_only_touch_paths_under_the_servers_file_roots(tmp_path):
    from sparseps.errors import RemoteError

    root = tmp_path / "models"
    root.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    environ = {"SPARSEPS_FILE_ROOTS": str(root)}
    with local_cluster(servers=1, environ=environ) as cluster, cluster.client() as client:
        client.create_table(CONFIG)
        client.push("emb", KEYS, _ones()).wait()
        records = client.save("emb", root / "ck")
        assert {r["kind"] for r in records} == {"rows", "pending"}
        assert not [p for p in (root / "ck").iterdir() if p.name.startswith(".writing-")]
        for where in (outside / "ck", root / "escape" / "ck", root / ".." / "elsewhere"):
            with pytest.raises(RemoteError, match="outside this server's file roots"):
                client.save("emb", where)
        assert list(outside.iterdir()) == []  # nothing was written there
        with pytest.raises(RemoteError, match="outside this server's file roots"):
            client.load("emb", ["/etc/passwd"])  # no probing of paths either
        with pytest.raises(RemoteError, match="outside this server's file roots"):
            client.load_dense("anything", "/etc/passwd")
        assert client.load("emb", records)["rows"] == len(KEYS)


def test_a_retried_save_does_not_delete_a_folder_a_server_is_still_writing(tmp_path):
    from sparseps.checkpoint import staging
    from sparseps.files.writer_lock import being_written, writer_lock

    target = tmp_path / "ck"
    busy = staging.new_staging(target)
    dead = staging.new_staging(target)
    with writer_lock(busy, "0-1"):  # a server still writing the first attempt's folder
        assert being_written(busy) and not being_written(dead)
        staging.remove_stale(target)
        assert busy.is_dir() and not dead.exists()
    assert not being_written(busy)  # the lock file is gone with the write
    staging.remove_stale(target)
    assert not busy.exists()


def test_crafted_keys_do_not_stall_the_clients_grouping():
    """Keys built to collide under the old unseeded multiplicative hash of the client's
    dedup set (top bits of key * 0x9E37...): with a per-call secret seed they cost about
    what random keys cost, measured as a ratio in the same run."""
    from sparseps.core.routing import group_by_server

    n = 40_000
    inverse_phi = pow(0x9E3779B97F4A7C15, -1, 1 << 64)
    # key * phi == i (mod 2^64) for small i: the top bits, the old slot, are 0 for every
    # crafted key, whatever the set size.
    crafted = np.array([(i * inverse_phi) & (2**64 - 1) for i in range(1, n + 1)], np.uint64)
    random_keys = np.random.default_rng(0).integers(1, 2**63, n, dtype=np.uint64)
    group_by_server(random_keys[:100], 3)  # compile first

    def cost(keys):
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            grouped, offsets, inverse = group_by_server(keys, 3)
            best = min(best, time.perf_counter() - start)
        np.testing.assert_array_equal(grouped[inverse], keys)  # still right
        return best

    assert cost(crafted) < 5 * cost(random_keys) + 0.005


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 0, -1.0])
def test_strategy_and_dataset_timeouts_must_be_finite(bad, tmp_path):
    import sparseps as sps
    from sparseps.data import CRITEO, QueueDataset

    with pytest.raises(ConfigError, match="finite"):
        sps.Strategy(rpc_timeout=bad)
    with pytest.raises(ConfigError, match="finite"):
        sps.Strategy(collective_timeout=bad)
    with pytest.raises(ConfigError, match="finite"):
        QueueDataset([str(tmp_path)], CRITEO, batch_size=8, pipe_timeout=bad)


def test_local_cluster_with_a_key_dir_serves_only_key_holders(tmp_path):
    from sparseps.errors import UnavailableError
    from sparseps.rpc.security import Security, write_job_keys

    keys = tmp_path / "keys"
    write_job_keys(keys)
    other = write_job_keys(tmp_path / "other")
    with local_cluster(servers=1, key_dir=keys) as cluster, cluster.client() as client:
        client.create_table(CONFIG)
        assert client.pull("emb", KEYS).wait().shape == (len(KEYS), 4)
        with PSClient(cluster.endpoints, timeout=60, security=Security(other)) as stranger:
            start = time.monotonic()
            with pytest.raises(UnavailableError, match="authentication failed"):
                stranger.pull("emb", KEYS).wait()
            # refused at once, not after the 60 s RPC timeout (room for a loaded box)
            assert time.monotonic() - start < 10
