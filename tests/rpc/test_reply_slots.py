"""Reply slots (sparseps.rpc.reply_slots): a same-host server writes pull answers into the
client's shared memory.

Real servers on loopback: answers through a slot equal answers over the socket, the
slot is not reused while the caller holds the rows, a server that does not know the
offered segment answers over the socket and the client attaches again, and what a peer
could send wrong on either side (a slot of another op, an index past the segment, sizes
out of range, a reply claiming a slot it was not offered or more of it than there is, an
attach answer naming a file outside /dev/shm) is refused by name while the other side
keeps working. No segment name is left in /dev/shm.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.core.routing import server_of
from sparseps.errors import ConfigError, InputError, ProtocolError, ResourceError
from sparseps.rpc import transport
from sparseps.rpc.client import PSClient
from sparseps.rpc.protocol import decode_reply, encode_request
from sparseps.rpc.reply_slots import SEGMENT_DIR, SEGMENT_PREFIX, same_host
from sparseps.server import reply_segments
from sparseps.server.reply_segments import ReplySegments, remove_orphans
from sparseps.testing import local_cluster
from sparseps.testing.faults import FakeServer

DIM = 8
KEYS = np.arange(1, 2001, dtype=np.uint64)
ON_0 = KEYS[server_of(KEYS, 2) == 0]  # the keys of server 0: one slot per pull


def _config() -> TableConfig:
    return TableConfig(name="t", dim=DIM, rule=optim.Adagrad(lr=0.1), seed=3)


def _names() -> set[str]:
    return {n for n in os.listdir(SEGMENT_DIR) if n.startswith(SEGMENT_PREFIX)}


@pytest.fixture(scope="module")
def cluster():
    before = _names()
    with local_cluster(servers=2, timeout=30) as c:
        with c.client() as setup:
            setup.create_table(_config())
            grads = np.random.default_rng(0).standard_normal((len(KEYS), DIM)).astype(np.float32)
            setup.push("t", KEYS, grads).wait()
        yield c
    assert _names() <= before, "a segment name outlived its server"


def _ones(request):
    return None, [np.ones((len(request.bufs["keys"]), 4), np.float32)]


MANY = np.arange(1, 301, dtype=np.uint64)  # enough keys to be offered a slot


def _to_server_0(cluster, **options) -> PSClient:
    """A client of server 0 alone (it asks only for ON_0): one owner's rows, which a pull
    hands over as they came, in the slot."""
    return PSClient([cluster.endpoints[0]], timeout=30, job_id=cluster.job_id, **options)


def _free(client: PSClient) -> dict[str, int]:
    return client._channel.replies.attached()


def test_a_pull_through_slots_equals_one_over_the_socket(cluster):
    with cluster.client(reply_slots=0) as wire, cluster.client() as shared:
        expected = wire.pull("t", KEYS).wait()
        rows = shared.pull("t", KEYS).wait()
        assert np.array_equal(rows, expected)
        assert set(_free(shared)) == set(cluster.endpoints)  # it attached to both servers
        assert _free(wire) == {}
        dedup = shared.pull("t", np.concatenate([KEYS[::-1], KEYS[:7]]), dedup=True).wait()
        assert np.array_equal(dedup, np.concatenate([expected[::-1], expected[:7]]))
        # rows of two servers are copied into one array: both slots are free at once
        assert all(free == 8 for free in _free(shared).values())
    with _to_server_0(cluster) as single:
        one = single.pull("t", ON_0).wait()  # one server's rows: the slot itself
        assert np.array_equal(one, expected[server_of(KEYS, 2) == 0]) and one.flags.writeable
        assert _free(single)[cluster.endpoints[0]] == 7
    # the names were unlinked once mapped: nothing of these servers is left in /dev/shm
    assert not {n for n in _names() if n.split("-")[2] in {str(p) for p in _pids(cluster)}}


def _pids(cluster) -> list[int]:
    return [cluster.pid(rank) for rank in range(len(cluster.endpoints))]


def test_a_slot_is_not_reused_while_its_rows_live(cluster):
    one = ON_0
    with _to_server_0(cluster, reply_slots=2) as client, cluster.client(reply_slots=0) as wire:
        expected = wire.pull("t", one).wait()
        held = [client.pull("t", one).wait() for _ in range(4)]  # 2 in slots, 2 over the socket
        assert min(_free(client).values()) == 0
        for rows in held:
            assert np.array_equal(rows, expected)
        held[0][:] = -1.0  # the caller's rows are its own: writing them changes no server
        assert np.array_equal(wire.pull("t", one).wait(), expected)
        del held, rows
        gc.collect()
        assert all(free == 2 for free in _free(client).values())
        assert np.array_equal(client.pull("t", one).wait(), expected)


def test_an_unknown_segment_is_answered_over_the_socket_and_the_client_attaches_again(cluster):
    endpoint = cluster.endpoints[0]
    with _to_server_0(cluster) as client:
        expected = client.pull("t", ON_0).wait()
        pool = client._channel.replies._by_endpoint[endpoint]
        pool.segment ^= 1  # as if the server had restarted: it knows no such segment
        rows = client.pull("t", ON_0).wait()  # detached: over the socket
        assert np.array_equal(rows, expected)
        assert endpoint not in _free(client)
        assert np.array_equal(client.pull("t", ON_0).wait(), expected)
        assert client._channel.replies._by_endpoint[endpoint] is not pool  # a new segment


def _raw(endpoint: str, frames: list) -> object:
    """One request on a DEALER of our own; the decoded reply."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(transport.connect_address(endpoint))
    try:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "the server did not answer"
        return decode_reply(sock.recv_multipart(copy=False))
    finally:
        sock.close()
        context.term()


@pytest.mark.parametrize(
    ("op", "args", "slot", "says"),
    [
        ("pull", {}, [1, 0], None),  # unknown segment: answered over the socket, detached
        ("prefetch", {}, [1, 0], "'prefetch' is not answered into a reply slot"),
        ("pull", {}, ["x", 0], "'slot' must be [segment, index]"),
        ("attach_replies", {"slots": 0, "slot_bytes": 1 << 20}, None, "allowed 1..64 slots"),
        ("attach_replies", {"slots": 2, "slot_bytes": 1 << 40}, None, "allowed 1..64 slots"),
    ],
)
def test_what_a_peer_may_get_wrong_is_refused_by_name(cluster, op, args, slot, says):
    keys = ON_0[:5]
    frames = encode_request(op, 9, None if op == "attach_replies" else "t",
                            [] if op == "attach_replies" else [keys], args)  # fmt: skip
    if slot is not None:
        import msgpack

        header = msgpack.unpackb(frames[0])
        header["slot"] = slot
        frames[0] = msgpack.packb(header)
    reply = _raw(cluster.endpoints[0], frames)
    if says is None:
        assert reply.ok and reply.detached and reply.bufs[0].shape == (5, DIM)
    else:
        assert not reply.ok and says in reply.error["message"]
    with cluster.client() as client:  # the server serves on
        assert client.pull("t", keys).wait().shape == (5, DIM)


def test_an_index_past_the_segment_is_refused(cluster):
    endpoint = cluster.endpoints[0]
    with _to_server_0(cluster) as client:
        client.pull("t", ON_0).wait()
        segment = client._channel.replies._by_endpoint[endpoint].segment
    frames = encode_request("pull", 3, "t", [ON_0[:3]], slot=(segment, 99))
    reply = _raw(endpoint, frames)
    assert not reply.ok and "slot 99 of a reply segment of 8 slots" in reply.error["message"]


class _ClaimsTheSlot:
    """A server bug: every reply says its buffers are in the slot."""

    @staticmethod
    def place(bufs) -> bool:
        return True


def test_a_reply_in_a_slot_the_request_did_not_offer_fails_the_call():
    with FakeServer(_ones, slot=_ClaimsTheSlot()) as server, PSClient([server.endpoint], timeout=10) as client:  # fmt: skip
        handle = client.pull("t", MANY[:3])
        with pytest.raises(ProtocolError, match="in a reply slot the request did not offer"):
            handle.wait()


def test_an_attach_answer_naming_another_file_leaves_replies_on_the_socket():
    def answer(request):
        if request.op == "attach_replies":
            return {"segment": 1, "path": "/etc/passwd", "token": b"x" * 16, "slots": 8,
                    "slot_bytes": 1 << 20}, []  # fmt: skip
        return _ones(request)

    with FakeServer(answer, attach=True) as server, PSClient([server.endpoint], timeout=10) as client:  # fmt: skip
        rows = client.pull("t", MANY).wait()
        assert np.array_equal(rows, np.ones((len(MANY), 4), np.float32))
        assert server.ops == ["attach_replies", "pull"]
        assert _free(client) == {}
        client.pull("t", MANY).wait()  # no second attach for a while
        assert server.ops == ["attach_replies", "pull", "pull"]


def test_a_server_that_does_not_answer_the_attach_holds_a_request_up_briefly():
    """A same-host server that never answers ``attach_replies`` (stopped, hung): the request
    that asked goes over the socket after ATTACH_WAIT_S, not after the client's timeout,
    and the next ones do not ask again for a while."""
    with FakeServer(_ones, attach=True, silent={"attach_replies"}) as server, \
            PSClient([server.endpoint], timeout=60) as client:  # fmt: skip
        start = time.monotonic()
        rows = client.pull("t", MANY).wait()
        took = time.monotonic() - start
        assert np.array_equal(rows, np.ones((len(MANY), 4), np.float32))
        assert took < 30, f"the pull waited {took:.1f} s for the attach (timeout 60 s)"
        client.pull("t", MANY).wait()
        assert server.ops == ["attach_replies", "pull", "pull"]
        assert _free(client) == {}


def test_a_few_keys_are_not_worth_a_slot():
    with FakeServer(_ones, attach=True) as server, PSClient([server.endpoint], timeout=10) as client:  # fmt: skip
        client.pull("t", MANY[:10]).wait()
        assert server.ops == ["pull"]


def test_a_reply_claiming_more_than_the_slot_fails_the_call(cluster):
    """A same-host server that says its answer is bigger than the slot it was offered."""
    endpoint = cluster.endpoints[0]
    with _to_server_0(cluster, reply_slots=1) as client:
        client.pull("t", ON_0).wait()
        offers = client._channel.replies
        pool = offers._by_endpoint[endpoint]
        from sparseps.rpc.protocol import Reply

        lying = Reply(id=1, ok=True, slot_bufs=((np.dtype("<f4"), (1 << 30, 1)),))
        with pytest.raises(ProtocolError, match="claims a slot of"):
            offers.receive((pool, pool.take()), lying, endpoint)
        assert pool.free == 1  # the slot was given back


def test_segments_keep_to_their_budget_and_are_cleaned_up(tmp_path, monkeypatch):
    segments = ReplySegments(0, directory=str(tmp_path))
    monkeypatch.setattr(reply_segments, "MAX_TOTAL_BYTES", 3 << 20)
    answer = segments.attach(2, 1 << 20)
    path = answer["path"]
    assert os.stat(path).st_mode & 0o777 == 0o600
    with open(path, "rb") as f:
        assert f.read(16) == answer["token"]
    with pytest.raises(ResourceError, match="budget"):
        segments.attach(2, 1 << 20)
    with pytest.raises(InputError):
        segments.attach(65, 1 << 20)
    slot = segments.slot(answer["segment"], 1)
    assert slot is not None and slot.array((10, 4), np.float32) is not None
    assert slot.array((1 << 20, 1), np.float32) is None  # does not fit: None, not past the slot
    assert segments.slot(answer["segment"] ^ 1, 0) is None
    with pytest.raises(ProtocolError):
        segments.slot(answer["segment"], 2)
    monkeypatch.setattr(reply_segments, "MAX_TOTAL_BYTES", 4 << 20)
    monkeypatch.setattr(reply_segments, "UNLINK_AFTER_S", 0.0)
    monkeypatch.setattr(reply_segments, "IDLE_S", 0.0)
    other = segments.attach(1, 1 << 20)
    del slot
    gc.collect()
    segments.sweep()
    assert not os.path.exists(other["path"]) and not os.path.exists(path)
    assert segments.count == 0 and segments.slot(answer["segment"], 0) is None
    segments.close()


def test_names_of_dead_servers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    orphan = tmp_path / f"{SEGMENT_PREFIX}{dead.stdout.strip()}-{'0' * 16}"
    live = tmp_path / f"{SEGMENT_PREFIX}{os.getpid()}-{'1' * 16}"
    other = tmp_path / "unrelated"
    for path in (orphan, live, other):
        path.write_bytes(b"")
    assert remove_orphans(str(tmp_path)) == 1
    assert not orphan.exists() and live.exists() and other.exists()


def test_only_same_host_servers_are_asked():
    assert same_host("127.0.0.1") and same_host("localhost") and same_host("::1")
    assert not same_host("192.0.2.7")  # TEST-NET-1: never this host


def test_the_environment_turns_slots_off(monkeypatch):
    monkeypatch.setenv("SPARSEPS_REPLY_SLOTS", "0")
    with FakeServer(_ones, attach=True) as server:
        with PSClient([server.endpoint], timeout=10) as client:
            client.pull("t", MANY).wait()
        assert server.ops == ["pull"]  # never asked to attach
    monkeypatch.setenv("SPARSEPS_REPLY_SLOTS", "many")
    with pytest.raises(ConfigError, match="SPARSEPS_REPLY_SLOTS"):
        PSClient(["127.0.0.1:1"], timeout=1)
    # a malformed variable fails every read of the settings, naming it (above); the
    # argument's own check, with the environment sound again:
    monkeypatch.delenv("SPARSEPS_REPLY_SLOTS")
    with pytest.raises(ConfigError, match="reply_slots"):
        PSClient(["127.0.0.1:1"], timeout=1, reply_slots=65)
