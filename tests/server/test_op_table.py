"""The server's op table (:func:`sparseps.server.handlers.op_table`): every op of the wire
(:data:`sparseps.rpc.ops.OPS`) has an entry, every entry is an op of the wire with that
op's schema, and a request reaches its op's handler through the table.
"""

from __future__ import annotations

import dataclasses

import pytest

from sparseps.rpc.ops import OPS
from sparseps.rpc.protocol import Request
from sparseps.server.file_guard import FILE_ARGS
from sparseps.server.handlers import Op, ServerState


def differences(table: dict[str, Op]) -> tuple[list[str], list[str]]:
    """``(ops of OPS without an entry, entries that are not ops of OPS)``."""
    return sorted(set(OPS) - set(table)), sorted(set(table) - set(OPS))


@pytest.fixture
def state():
    with ServerState(0, 1, "127.0.0.1:1") as state:
        yield state


def test_every_op_of_the_wire_has_an_entry_and_every_entry_is_one(state):
    missing, unknown = differences(state.ops)
    assert not missing, f"ops of sparseps.rpc.ops.OPS the server cannot answer: {missing}"
    assert not unknown, f"op table entries that are not ops of sparseps.rpc.ops.OPS: {unknown}"
    for name, op in state.ops.items():
        assert op.name == name and op.schema is OPS[name] and callable(op.handler)


def test_the_check_finds_an_op_left_out_and_one_the_wire_does_not_know(state):
    table = {name: Op(name, schema, state.ping) for name, schema in OPS.items()}
    del table["push"]
    table["teleport"] = Op("teleport", OPS["ping"], state.ping)
    assert differences(table) == (["push"], ["teleport"])


def test_a_request_reaches_its_ops_handler_through_the_table(state, tmp_path):
    reached: list[str] = []
    for name in OPS:
        state.ops[name] = dataclasses.replace(
            state.ops[name], handler=lambda request: (reached.append(request.op), [])
        )
    # the file ops' paths are checked (and written ones locked) before the handler runs
    paths = {"directory": str(tmp_path), "files": [str(tmp_path / "f")], "path": str(tmp_path)}
    for name in OPS:
        args = {FILE_ARGS[name][0]: paths[FILE_ARGS[name][0]]} if name in FILE_ARGS else {}
        answer = state.handle(Request(op=name, id=1, table="t", bufs={}, args=args))
        assert answer == (None, [])
    assert reached == list(OPS)
