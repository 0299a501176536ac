"""A replacement server checks what a survivor answers while it copies its shards back.

A survivor's ``replicate`` reply is remote input: one that is not a mapping, or lacks
what a copy needs, is a ProtocolError naming the server and the op, that survivor counts
as failed, and with none left the recovery fails naming each server tried (the
replacement then exits non-zero; tests/launch/test_server_loss.py and the launched drill
cover what the launcher does then). The survivor here is a real zmq socket on loopback
that answers in the servers' protocol with the malformed replies.
"""

from __future__ import annotations

import threading

import pytest
import zmq

from sparseps.errors import UnavailableError
from sparseps.rpc import transport
from sparseps.rpc.protocol import Limits, decode_request, encode_reply
from sparseps.server.handlers import ServerState
from sparseps.server.recovery import recover


class _Survivor:
    """Answers every request with ``answer(op)`` until closed (bounded: 50 ms polls)."""

    def __init__(self, answer) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.answer, self.ops = answer, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.socket.poll(50):
                continue
            identity, *frames = self.socket.recv_multipart()
            request = decode_request(frames)
            self.ops.append(request.op)
            self.socket.send_multipart(
                [identity, *encode_reply(request.id, result=self.answer(request.op))]
            )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.socket.close(0)
        self.context.term()


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ("a string", "server 0 answered replicate with a str, not a mapping"),
        ({"tables": {}, "dense": {}}, "server 0 answered replicate without applied, epoch"),
    ],
)
def test_a_malformed_replicate_answer_fails_that_survivor_by_name(tmp_path, answer, says):
    survivor = _Survivor(lambda op: answer)
    # server 1 of 2 with one copy each: it holds shards 1 and 0, both copied from server 0
    state = ServerState(1, 2, f"127.0.0.1:{transport.free_port()}", replicas=1, recovering=True)
    try:
        with pytest.raises(UnavailableError) as caught:
            recover(state, [f"127.0.0.1:{survivor.port}", state.endpoint], limits=Limits(),
                    directory=str(tmp_path))  # fmt: skip
    finally:
        survivor.close()
        state.close()
    message = str(caught.value)
    assert "no surviving copy of shard" in message, message
    assert says in message, message
    assert survivor.ops[0] == "replicate"  # asked, answered, refused: no replicate_done sent
    assert "replicate_done" not in survivor.ops
