"""Fault injection: malformed protocol messages, a raw socket to send them with, and a
server that answers what a test tells it to.

:func:`malformed_messages` yields messages that each break exactly one rule of the
wire protocol (see :mod:`sparseps.rpc.protocol`), mixed with pure noise. A correct
server answers every one with a ``ProtocolError`` reply and keeps serving.
:class:`FakeServer` is the other direction: a real socket on loopback that reads requests
as a server does and answers each with what the test's function returns (a malformed
answer, say), so a test sees what a client makes of it. :class:`FailingAllocator` is a
table's allocator hook that raises ``MemoryError`` on demand (out of memory while a table
grows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence

import msgpack
import numpy as np
import zmq

from ..core.closing import Closing
from ..rpc.protocol import PROTOCOL_VERSION, ReplyArea, Request, decode_request, encode_reply
from ..table.growth import Allocator

__all__ = ["KINDS", "FailingAllocator", "FakeServer", "RawPeer", "malformed_messages"]


def _header(
    op: str = "pull", table: object = "t", bufs: object = None, args: object = None, **extra: object
) -> dict:
    header = {
        "v": PROTOCOL_VERSION,
        "op": op,
        "id": 7,
        "table": table,
        "bufs": bufs or [],
        "args": args or {},
    }
    header.update(extra)
    return header


def _pack(header: object) -> bytes:
    return msgpack.packb(header)


def _keys(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 2**63, n, dtype=np.uint64).tobytes()


def _random_bytes(rng: np.random.Generator) -> list[bytes]:
    return [rng.bytes(int(rng.integers(0, 200))) for _ in range(int(rng.integers(1, 4)))]


def _truncated_buffer(rng: np.random.Generator) -> list[bytes]:
    n = int(rng.integers(1, 64))
    return [_pack(_header(bufs=[["uint64", [n]]])), _keys(rng, n)[: -int(rng.integers(1, 8))]]


def _wrong_shape(rng: np.random.Generator) -> list[bytes]:
    n = int(rng.integers(2, 64))
    # A 2-D key buffer: right byte count, wrong rank for the op.
    return [_pack(_header(bufs=[["uint64", [n, 1]]])), _keys(rng, n)]


def _wrong_dtype(rng: np.random.Generator) -> list[bytes]:
    n = int(rng.integers(1, 64))
    dtype = str(rng.choice(["float64", "int8", "object", "<u8", "complex64", "int64", "float32"]))
    itemsize = {
        "float64": 8,
        "int8": 1,
        "object": 8,
        "<u8": 8,
        "complex64": 8,
        "int64": 8,
        "float32": 4,
    }[dtype]
    return [_pack(_header(bufs=[[dtype, [n]]])), rng.bytes(n * itemsize)]


def _unknown_op(rng: np.random.Generator) -> list[bytes]:
    return [
        _pack(_header(op=str(rng.choice(["pul", "drop_table", "", "exec", "__init__", "PULL"]))))
    ]


def _huge_size(rng: np.random.Generator) -> list[bytes]:
    dims = [int(rng.integers(1 << 20, 1 << 40)), int(rng.integers(1 << 20, 1 << 40))]
    return [_pack(_header(op="push", bufs=[["uint64", dims[:1]], ["float32", dims]])), b"", b""]


def _wrong_version(rng: np.random.Generator) -> list[bytes]:
    version = [0, 2, 99, -1, "1", None, 1.0][int(rng.integers(0, 7))]
    return [_pack({**_header(), "v": version}), _keys(rng, 0)]


def _wrong_frame_count(rng: np.random.Generator) -> list[bytes]:
    n = int(rng.integers(1, 16))
    frames = [_pack(_header(bufs=[["uint64", [n]]]))]
    extra = int(rng.integers(0, 4))
    return frames + [_keys(rng, n)] * (0 if extra == 1 else extra)


def _non_map_header(rng: np.random.Generator) -> list[bytes]:
    value = [[1, 2, 3], "pull", 42, None, True, b"\x00\x01", 3.5][int(rng.integers(0, 7))]
    return [_pack(value)]


def _bad_field_types(rng: np.random.Generator) -> list[bytes]:
    choice = int(rng.integers(0, 6))
    if choice == 0:
        return [_pack(_header(op="ping", table=None, id="seven"))]
    if choice == 1:
        return [_pack(_header(op="ping", table=None, id=-5))]
    if choice == 2:
        return [_pack(_header(table=123, bufs=[["uint64", [0]]])), b""]
    if choice == 3:
        return [_pack(_header(op="decay", args={"rate": "fast"}))]
    if choice == 4:
        return [_pack(_header(op="create_table", args={"config": [1, 2]}))]
    return [_pack(_header(op="ping", table=None, bufs="uint64"))]


def _unknown_arg(rng: np.random.Generator) -> list[bytes]:
    return [_pack(_header(op="shrink", args={"force": True}))]


def _mismatched_rows(rng: np.random.Generator) -> list[bytes]:
    n = int(rng.integers(2, 32))
    dim = 4
    header = _header(op="push", bufs=[["uint64", [n]], ["float32", [n - 1, dim]]])
    return [_pack(header), _keys(rng, n), rng.bytes((n - 1) * dim * 4)]


def _int_map_key(rng: np.random.Generator) -> list[bytes]:
    # msgpack maps with non-string keys; the decoder refuses them (strict_map_key).
    return [msgpack.packb({1: 2, "v": PROTOCOL_VERSION})]


def _too_many_buffers(rng: np.random.Generator) -> list[bytes]:
    count = 40
    return [_pack(_header(op="ping", table=None, bufs=[["uint8", [1]]] * count)), *([b"x"] * count)]


KINDS: dict[str, Callable[[np.random.Generator], list[bytes]]] = {
    "random_bytes": _random_bytes,
    "truncated_buffer": _truncated_buffer,
    "wrong_shape": _wrong_shape,
    "wrong_dtype": _wrong_dtype,
    "unknown_op": _unknown_op,
    "huge_declared_size": _huge_size,
    "wrong_version": _wrong_version,
    "wrong_frame_count": _wrong_frame_count,
    "non_map_header": _non_map_header,
    "bad_field_types": _bad_field_types,
    "unknown_arg": _unknown_arg,
    "mismatched_rows": _mismatched_rows,
    "int_map_key": _int_map_key,
    "too_many_buffers": _too_many_buffers,
}


def malformed_messages(count: int, *, seed: int = 0) -> Iterator[tuple[str, list[bytes]]]:
    """``count`` malformed messages ``(kind, frames)``, kinds in turn, contents random."""
    rng = np.random.default_rng(seed)
    kinds = list(KINDS)
    for i in range(count):
        kind = kinds[i % len(kinds)]
        yield kind, KINDS[kind](rng)


class RawPeer:
    """A bare DEALER socket to one server, for sending arbitrary frames (a context manager)."""

    def __init__(self, endpoint: str) -> None:
        self._context = zmq.Context()
        self.socket = self._context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(f"tcp://{endpoint}")

    def send(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def replies(self, expected: int, timeout: float) -> list[dict]:
        """Headers of up to ``expected`` replies received before ``timeout`` seconds pass."""
        out: list[dict] = []
        deadline = time.monotonic() + timeout
        while len(out) < expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.socket.poll(int(remaining * 1000)):
                break
            frames = self.socket.recv_multipart()
            out.append(msgpack.unpackb(frames[0], raw=False))
        return out

    def close(self) -> None:
        self.socket.close()
        self._context.term()

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeServer(Closing):
    """A ROUTER on a free loopback port answering every request as ``answer`` says.

    Args:
        answer: ``request -> (result, buffers)`` of its ok reply.
        attach: hand ``attach_replies`` (a same-host client's first request,
            :mod:`sparseps.rpc.reply_slots`) to ``answer`` as well; by default it is refused
            with an error reply, as a server without reply slots does, and not recorded.
        slot: passed to ``encode_reply`` as the reply slot of every ok reply (an object
            whose ``place(bufs)`` says whether the buffers went there).
        silent: ops it records and never answers (a hung server's, for those ops).

    Attributes:
        endpoint: ``127.0.0.1:PORT`` (give it to a client as a server's endpoint).
        ops: the ops received, in order.
    """

    def __init__(
        self,
        answer: Callable[[Request], tuple[object, Sequence[np.ndarray]]],
        *,
        attach: bool = False,
        slot: ReplyArea | None = None,
        silent: Collection[str] = (),
    ) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"127.0.0.1:{self._socket.bind_to_random_port('tcp://127.0.0.1')}"
        self._answer = answer
        self._attach = attach
        self._slot = slot
        self._silent = frozenset(silent)
        self.ops: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():  # bounded: each poll waits 50 ms
            if not self._socket.poll(50):
                continue
            identity, *frames = self._socket.recv_multipart()
            request = decode_request(frames)
            if request.op == "attach_replies" and not self._attach:
                refusal = {"type": "ProtocolError", "message": "unknown op", "traceback": ""}
                self._socket.send_multipart([identity, *encode_reply(request.id, error=refusal)])
                continue
            self.ops.append(request.op)
            if request.op in self._silent:
                continue
            result, bufs = self._answer(request)
            reply = encode_reply(request.id, result=result, bufs=list(bufs), slot=self._slot)
            self._socket.send_multipart([identity, *reply])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._socket.close()
        self._context.term()


class FailingAllocator(Allocator):
    """The table's allocator hook: fails every allocation of ``minimum`` bytes or more once
    ``armed`` (counted in ``failures``)."""

    def __init__(self) -> None:
        self.armed = False
        self.minimum = 0
        self.failures = 0

    def _check(self, nbytes: int) -> None:
        if self.armed and nbytes >= self.minimum:
            self.failures += 1
            raise MemoryError(f"injected: {nbytes} bytes")

    def realloc(self, address: int, nbytes: int) -> int:
        self._check(nbytes)
        return super().realloc(address, nbytes)

    def empty(self, shape, dtype) -> np.ndarray:
        self._check(int(np.prod(shape)) * np.dtype(dtype).itemsize)
        return super().empty(shape, dtype)
