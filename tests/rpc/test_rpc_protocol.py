"""Wire protocol: round trips, zero-copy decode, and one rejection per rule."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

from sparseps.errors import ConfigError, ProtocolError
from sparseps.rpc.protocol import (
    HEADER_ROOM,
    OPS,
    PROTOCOL_VERSION,
    Limits,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
    peek_request_id,
    read_header,
)
from sparseps.testing.faults import KINDS, malformed_messages


def _as_wire(frames):
    """What the peer receives: bytes for headers, zmq Frames for buffers (as recv(copy=False))."""
    out = []
    for frame in frames:
        data = frame.tobytes() if isinstance(frame, np.ndarray) else frame
        out.append(zmq.Frame(data))
    return out


def test_push_round_trip_values_and_names():
    keys = np.array([5, 1, 2**64 - 1], dtype=np.uint64)
    grads = np.arange(12, dtype=np.float32).reshape(3, 4)
    shows = np.ones(3, np.float32)
    frames = encode_request("push", 41, "emb", [keys, grads, shows])
    request = decode_request(_as_wire(frames))
    assert (request.op, request.id, request.table, request.args) == ("push", 41, "emb", {})
    assert sorted(request.bufs) == ["grads", "keys", "shows"]
    np.testing.assert_array_equal(request.bufs["keys"], keys)
    np.testing.assert_array_equal(request.bufs["grads"], grads)
    assert request.bufs["grads"].dtype == np.float32 and request.bufs["keys"].dtype == np.uint64


def test_decode_is_zero_copy_view_of_the_frame():
    keys = np.arange(4096, dtype=np.uint64)
    frame = zmq.Frame(keys.tobytes())
    request = decode_request([zmq.Frame(encode_request("pull", 1, "t", [keys])[0]), frame])
    view = request.bufs["keys"]
    assert not view.flags.owndata and not view.flags.writeable
    assert np.shares_memory(view, np.frombuffer(frame.buffer, dtype=np.uint8))


def test_encode_passes_numpy_buffers_through_without_copy():
    grads = np.zeros((8, 4), np.float32)
    frames = encode_request("push", 1, "t", [np.zeros(8, np.uint64), grads])
    assert frames[2] is grads


def test_reply_round_trip_and_error_reply():
    rows = np.random.default_rng(0).random((3, 2), dtype=np.float32)
    reply = decode_reply(_as_wire(encode_reply(9, result={"a": 1}, bufs=[rows])))
    assert reply.ok and reply.id == 9 and reply.result == {"a": 1}
    np.testing.assert_array_equal(reply.bufs[0], rows)
    error = decode_reply(
        _as_wire(encode_reply(None, error={"type": "X", "message": "m", "traceback": ""}))
    )
    assert (error.ok, error.id, error.error["message"]) == (False, None, "m")


def test_args_schema():
    assert decode_request(_as_wire(encode_request("decay", 1, "t", args={"rate": 0.5}))).args == {
        "rate": 0.5
    }
    with pytest.raises(ProtocolError, match="missing argument 'directory'"):
        decode_request(_as_wire(encode_request("save", 1, "t")))
    with pytest.raises(ProtocolError, match="unknown argument"):
        decode_request(_as_wire(encode_request("pull", 1, "t", [np.zeros(1, np.uint64)], {"x": 1})))
    with pytest.raises(ProtocolError, match="takes no table"):
        decode_request(_as_wire(encode_request("ping", 1, "t")))
    with pytest.raises(ProtocolError, match="'table' must be"):
        decode_request(_as_wire(encode_request("pull", 1, None, [np.zeros(1, np.uint64)])))


def test_size_limits():
    small = Limits(max_message_bytes=1000, max_header_bytes=200)
    keys = np.zeros(200, np.uint64)
    with pytest.raises(ProtocolError, match="over the limit of 1000"):
        decode_request(_as_wire(encode_request("pull", 1, "t", [keys])), small)
    big_header = encode_request("create_table", 1, "t", args={"config": {"name": "x" * 300}})
    with pytest.raises(ProtocolError, match="header frame is .* over the limit of 200"):
        decode_request(_as_wire(big_header), small)
    with pytest.raises(ConfigError, match="max_buffers"):
        Limits(max_buffers=0)


def test_bulk_size_limits_follow_the_message_limit():
    limits = Limits(max_message_bytes=8 << 20)
    assert limits.max_payload_bytes == (8 << 20) - HEADER_ROOM
    assert limits.max_dense_size == ((8 << 20) - HEADER_ROOM) // 4
    assert Limits().max_dense_size == ((1 << 30) - HEADER_ROOM) // 4
    assert Limits(max_message_bytes=100).max_dense_size == 0
    # The largest dense vector fits in one push_dense message with a 256-char table name.
    values = np.zeros(limits.max_dense_size, np.float32)
    frames = encode_request("push_dense", 2**62, "t" * 256, [values])
    request = decode_request(_as_wire(frames), limits)
    assert request.bufs["values"].shape == (limits.max_dense_size,)
    # The request carries the limits it was decoded under (handlers bound replies by them).
    assert request.limits is limits


def test_encode_rejects_unsupported_buffers():
    with pytest.raises(ProtocolError, match="float64 cannot be sent"):
        encode_request("pull", 1, "t", [np.zeros(3)])
    with pytest.raises(ProtocolError, match="C-contiguous"):
        encode_request("pull", 1, "t", [np.zeros(6, np.uint64)[::2]])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_malformed_kind_is_rejected(kind):
    rng = np.random.default_rng(1)
    for _ in range(25):
        frames = [zmq.Frame(f) for f in KINDS[kind](rng)]
        with pytest.raises(ProtocolError):
            decode_request(frames)
        # The server reads the header once to route a request and hands it to the decode:
        # every rule still applies on that path.
        with pytest.raises(ProtocolError):
            decode_request(frames, header=read_header(frames))


def test_a_header_read_to_route_decodes_to_the_same_request():
    keys = np.array([3, 9], dtype=np.uint64)
    frames = _as_wire(encode_request("pull", 5, "emb", [keys], job="job-1", client=7, seq=2))
    header = read_header(frames)
    assert header["op"] == "pull"
    once, twice = decode_request(frames, header=header), decode_request(frames)
    fields = ("op", "id", "table", "args", "job", "client", "seq", "shard", "epoch")
    assert [getattr(once, f) for f in fields] == [getattr(twice, f) for f in fields]
    np.testing.assert_array_equal(once.bufs["keys"], keys)
    stale = _as_wire([msgpack.packb({**header, "v": PROTOCOL_VERSION + 1}), keys.tobytes()])
    with pytest.raises(ProtocolError, match="protocol version"):
        read_header(stale)


def test_malformed_stream_all_rejected_with_reasons():
    reasons = set()
    for _kind, frames in malformed_messages(600, seed=3):
        with pytest.raises(ProtocolError) as info:
            decode_request([zmq.Frame(f) for f in frames])
        reasons.add(str(info.value).split(":")[0][:30])
    assert len(reasons) > 5


def test_peek_request_id():
    assert peek_request_id([msgpack.packb({"v": PROTOCOL_VERSION, "id": 12})]) == 12
    assert peek_request_id([b"\xc1garbage"]) is None
    assert peek_request_id([msgpack.packb({"id": -1})]) is None
    assert peek_request_id([]) is None


def test_every_op_has_a_schema_and_round_trips():
    for op, schema in OPS.items():
        bufs = []
        for spec in schema.bufs:
            shape = (3,) if spec.ndim == 1 else (3, 2)
            bufs.append(np.zeros(shape, dtype=spec.dtype))
        args = {}
        for name, (types, required) in schema.args.items():
            if required:
                args[name] = {int: 1, str: "x", dict: {}, list: []}[types[0]]
        request = decode_request(
            _as_wire(encode_request(op, 5, "t" if schema.table else None, bufs, args))
        )
        assert request.op == op and len(request.bufs) == len(schema.bufs)
