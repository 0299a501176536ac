"""A replacement server checks what a survivor answers while it copies its shards back.

A survivor's ``replicate`` reply is remote input: one that is not a mapping, or lacks
what a copy needs, is a ProtocolError naming the server and the op, that survivor counts
as failed (it is not asked again), and with none left the recovery fails naming each
server tried (the
replacement then exits non-zero; tests/launch/test_server_loss.py and the launched drill
cover what the launcher does then). The survivor here is a real zmq socket on loopback
that answers in the servers' protocol with the malformed replies.
"""

from __future__ import annotations

import pytest

from sparseps.errors import UnavailableError
from sparseps.rpc import transport
from sparseps.rpc.channel import Channel
from sparseps.rpc.protocol import Limits
from sparseps.server.handlers import ServerState
from sparseps.server.recovery import recover
from sparseps.testing.faults import FakeServer


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ("a string", "the result is a str, not a mapping"),
        ({"tables": {}, "dense": {}}, "the result has no 'applied'"),
        (
            {"tables": {}, "dense": {}, "applied": [], "epoch": "2", "index": 0},
            "the result's 'epoch' is a str (expected int)",
        ),
        (
            {"tables": {}, "dense": {}, "applied": [], "epoch": 2},
            "the result has no 'index'",
        ),
    ],
)
def test_a_malformed_replicate_answer_fails_that_survivor_by_name(tmp_path, answer, says):
    def survivor_answers(request):
        if request.op == "shard_info":  # a well-formed view: the survivor is the head
            view = {"shard": 0, "epoch": 1, "members": [0], "recovering": False, "index": 5}
            return view, ()
        return answer, ()

    survivor = FakeServer(survivor_answers)
    # server 1 of 2 with one copy each: it holds shards 1 and 0, both copied from server 0
    state = ServerState(1, 2, f"127.0.0.1:{transport.free_port()}", replicas=1, recovering=True)
    peers = Channel(
        [survivor.endpoint, state.endpoint], timeout=10, timeout_setting="test",
        max_in_flight=16, limits=Limits(), detect_loss=True,
    )  # fmt: skip
    try:
        with pytest.raises(UnavailableError) as caught:
            recover(state, peers, directory=str(tmp_path), timeout=20)
    finally:
        peers.close()
        survivor.close()
        state.close()
    message = str(caught.value)
    assert f"replicate: malformed reply from server 0 at {survivor.endpoint}: {says}" in message
    assert "no surviving copy of shard" in message, message
    # asked once, answered, refused: not asked again, no replicate_done sent
    assert survivor.ops.count("replicate") == 1
    assert "replicate_done" not in survivor.ops
