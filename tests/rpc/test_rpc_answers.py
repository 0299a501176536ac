"""A client holds every ok reply to what its op answers (sparseps.rpc.answers).

A reply is remote input: a server of another version, or a bug, that answers ``prefetch``
without ``queued`` or a pull with the wrong rows must fail the call with a ProtocolError
naming the op, the server and what is wrong, not a KeyError or a wrongly shaped array in
the caller. The server here is a real zmq socket on loopback (:class:`FakeServer`) that
answers in the servers' protocol with what each case says.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.errors import ProtocolError
from sparseps.rpc.answers import check_answer
from sparseps.rpc.client import PSClient
from sparseps.rpc.ops import OPS, BufSpec, OpSchema
from sparseps.rpc.protocol import Reply
from sparseps.testing.faults import FakeServer

KEYS = np.array([3, 5, 7], np.uint64)


def _rows(n: int, dtype=np.float32, dim: int = 4) -> np.ndarray:
    return np.arange(n * dim, dtype=dtype).reshape(n, dim)


def _ask(op: str, answer: tuple) -> object:
    """What a PSClient's ``op`` on KEYS returns when its server answers ``answer``."""
    with FakeServer(lambda request: answer) as server, PSClient([server.endpoint], timeout=10) as client:  # fmt: skip
        call = client.pull if op == "pull" else client.prefetch
        try:
            return call("t", KEYS).wait()
        finally:
            assert server.ops == [op]


def test_well_formed_answers_reach_the_caller():
    assert np.array_equal(_ask("pull", (None, [_rows(3)])), _rows(3))
    assert _ask("prefetch", ({"queued": 3}, ())) == 3


@pytest.mark.parametrize(
    ("op", "answer", "says"),
    [
        ("prefetch", ({}, ()), "the result has no 'queued'"),
        ("prefetch", (None, ()), "the result is a NoneType, not a mapping"),
        ("prefetch", ({"queued": "3"}, ()), "the result's 'queued' is a str (expected int)"),
        ("prefetch", ({"queued": True}, ()), "the result's 'queued' is a bool (expected int)"),
        ("pull", (None, ()), "0 buffers, not 1 (rows)"),
        ("pull", (None, [_rows(3, np.int32)]), "buffer 'rows' is int32 with shape (3, 4)"),
        ("pull", (None, [np.zeros(12, np.float32)]), "not float32 with 2 dims"),
        ("pull", (None, [_rows(2)]), "a server answered 2 rows for 3 keys"),
    ],
)
def test_a_malformed_answer_fails_the_call_by_name(op, answer, says):
    with pytest.raises(ProtocolError) as caught:
        _ask(op, answer)
    message = str(caught.value)
    assert says in message, message
    if "rows for" not in says:  # the channel's check names the op and the server
        assert f"{op}: malformed reply from server 0 at 127.0.0.1:" in message, message


RECORD = {
    "name": "t.shard-00000-of-00001.arrow",
    "path": "/x",
    "bytes": 10,
    "rows": 2,
    "kind": "rows",
}


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"name": "t"}, "the result is a dict, not a list"),
        ([RECORD, {"name": "t"}], "the result's item 1 has no 'path'"),
        ([{**RECORD, "rows": 2.5}], "the result's item 0's 'rows' is a float (expected int)"),
    ],
)
def test_a_save_answered_without_its_file_records_fails_by_name(tmp_path, answer, says):
    """A save's records are what the checkpoint's manifest is written from."""

    def answer_of(request):
        if request.op == "get_placement":  # a table-wide op first asks for the placement
            return {"version": 0, "tables": {}}, ()
        return answer, ()

    with (
        FakeServer(answer_of) as server,
        PSClient([server.endpoint], timeout=10) as client,
        pytest.raises(ProtocolError) as caught,
    ):
        client.save("t", tmp_path / "s")
    assert f"save: malformed reply from server 0 at {server.endpoint}: {says}" in str(caught.value)


def test_a_save_answered_with_its_file_records_returns_them(tmp_path):
    def answer_of(request):
        return ({"version": 0, "tables": {}} if request.op == "get_placement" else [RECORD]), ()

    with FakeServer(answer_of) as server, PSClient([server.endpoint], timeout=10) as client:
        assert client.save("t", tmp_path / "s") == [RECORD]


def test_check_answer_leaves_error_replies_and_undeclared_ops_alone():
    error = Reply(id=1, ok=False, error={"type": "InputError", "message": "m", "traceback": ""})
    check_answer(error, OPS["prefetch"])  # the error itself is what the caller gets
    check_answer(Reply(id=1, ok=True, result="anything"), OPS["push"])
    check_answer(Reply(id=1, ok=True, result=[1]), None)  # an op the table does not know
    # a float field takes an int (msgpack keeps 2.0 as a float, a server may send 2)
    seconds = OpSchema(answer={"busy_s": (float, int)}, answer_bufs=(BufSpec("g", "uint8", 1),))
    check_answer(Reply(id=1, ok=True, result={"busy_s": 2}, bufs=(np.zeros(2, np.uint8),)), seconds)
    with pytest.raises(ProtocolError, match="2 buffers, not 1"):
        check_answer(
            Reply(id=1, ok=True, result={"busy_s": 2.0}, bufs=(np.zeros(1, np.uint8),) * 2),
            seconds,
        )
