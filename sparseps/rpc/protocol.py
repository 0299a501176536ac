"""The sparseps wire protocol: msgpack header frame + one raw frame per numpy buffer.

A request is a zmq multipart message::

    frame 0   msgpack map {"v": PROTOCOL_VERSION, "op": str, "id": int, "table": str | None,
                           "bufs": [[dtype, shape], ...], "args": {str: small value},
                           "job": str (optional), "client": int, "seq": int (optional),
                           "shard": int (optional), "epoch": int (optional),
                           "forward": [index, [rank, ...]] (optional),
                           "slot": [segment, index] (optional)}
    frame 1.. one raw little-endian buffer per entry of "bufs", in order

``job`` is the job id of the sender: a server that belongs to a job refuses requests of
any other job (a leftover client of an earlier job on a reused port). ``client`` (a
random 63-bit id per client) and ``seq`` (that client's counter) make an update
idempotent: a server applies each ``(client, seq)`` of an update op once, so a request
sent again after a timeout cannot be applied twice. ``shard`` names the shard a request is
for when the server holds it as a replica (``--replicas``); absent, the server's own.
``epoch`` is the sender's view of a replicated shard's copies (see ``replica_ops``).
``forward`` marks a write that a copy of a replicated shard passes on to the next copy of
its chain: the write's place in the shard's order (``index``) and the copies of the
shard at ``epoch``, head first (:mod:`sparseps.server.shard_chain`).
``slot`` offers a same-host client's shared memory for the answer (:mod:`.reply_slots`).

A reply has the same shape: ``{"v", "id", "ok": bool, "error": {"type", "message",
"traceback"} (only when not ok), "result": small value, "bufs": [...]}`` plus buffers;
``"slot": true`` when its buffers are in the offered slot instead (no buffer frames), and
``"detached": true`` when the server does not know the offered slot's segment.

Buffers are sent zero-copy (``copy=False`` on numpy memory) and decoded with
``np.frombuffer`` (no copy; the arrays are read-only views of the received frames).

:func:`decode_request` is the one place where everything a peer sends is checked before
any table is touched: version, op, header types, frame count, dtype allowlist, shapes
against frame lengths, size limits and the per-op schema in :data:`OPS` (which buffers,
dtypes and ranks each op takes, which leading dimensions must agree, which arguments are
allowed). Any violation raises :class:`~sparseps.errors.ProtocolError` naming what was
wrong; the server turns it into an error reply and keeps serving.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard

import msgpack
import numpy as np

from ..errors import ProtocolError
from .limits import HEADER_ROOM, Limits
from .ops import OPS, OpSchema
from .wire_buffers import buffer_header, decode_buffers, described_buffers, frame_bytes, wire_name

__all__ = [
    "HEADER_ROOM",
    "OPS",
    "Forward",
    "PROTOCOL_VERSION",
    "Limits",
    "OpSchema",
    "ReplyArea",
    "Reply",
    "Request",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_request",
    "peek_request_id",
    "read_header",
]

PROTOCOL_VERSION = 1

# Table names on the wire: what TableConfig accepts plus the reserved dense names
# (``__dense__``). Checked with fullmatch: no control characters, no trailing newline.
TABLE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,256}")
# Job ids are printed in errors and logs: a short printable token.
JOB_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_HEADER_KEYS = frozenset(
    {"v", "op", "id", "table", "bufs", "args", "job", "client", "seq", "shard", "epoch", "slot",
     "forward"}
)  # fmt: skip
# Copies of one shard a forwarded write may name (replicas + 1; far above any real job).
MAX_COPIES = 64


_LIMITS = Limits()  # the defaults (frozen: one instance serves every call)


class ReplyArea(Protocol):
    """Where a reply's buffers may go instead of frames: a same-host client's reply slot
    (:class:`sparseps.server.reply_segments.ServerSlot`)."""

    def place(self, bufs: Sequence[np.ndarray]) -> bool:
        """Put ``bufs`` there; False when they do not fit (they then travel as frames)."""
        ...


@dataclass(frozen=True)
class Forward:
    """A write passed on from one copy of a replicated shard to the next: its ``index``
    in the shard's order (1, 2, ...) and the shard's copies, head first."""

    index: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class Request:
    """A validated request: ``bufs`` maps the schema's buffer names to read-only arrays.

    ``limits`` are the limits it was decoded under; its reply travels the same way, so a
    handler bounds what it would send back by them (before allocating it).
    """

    op: str
    id: int
    table: str | None
    bufs: dict[str, np.ndarray]
    args: dict
    limits: Limits = field(default=_LIMITS, compare=False)
    job: str | None = None
    client: int | None = None
    seq: int | None = None
    shard: int | None = None  # None: the receiving server's own shard
    epoch: int | None = None  # the sender's view of the shard's copies (replicas)
    # a write passed on along a replicated shard's chain: its index in the shard's order
    # and the shard's copies at ``epoch``, head first (sparseps.server.shard_chain)
    forward: Forward | None = None
    # (segment, index): the reply slot the sender offers (sparseps.rpc.reply_slots); the
    # server resolves it to ``reply_to``, where a handler may build its reply's buffers
    slot: tuple[int, int] | None = None
    reply_to: object = field(default=None, compare=False)


@dataclass(frozen=True)
class Reply:
    """A decoded reply: ``ok`` with ``result``/``bufs``, or ``error`` (type/message/traceback)."""

    id: int | None  # None: the server could not read the request's id
    ok: bool
    result: object = None
    bufs: tuple[np.ndarray, ...] = ()
    error: dict | None = None
    # the buffers are in the request's reply slot: (dtype, shape) of each, not in frames
    slot_bufs: tuple[tuple[np.dtype, tuple[int, ...]], ...] | None = None
    detached: bool = False  # the server does not know the offered slot's segment


def encode_request(
    op: str,
    request_id: int,
    table: str | None = None,
    bufs: Sequence[np.ndarray] = (),
    args: Mapping | None = None,
    *,
    job: str | None = None,
    client: int | None = None,
    seq: int | None = None,
    shard: int | None = None,
    epoch: int | None = None,
    slot: tuple[int, int] | None = None,
    forward: Forward | None = None,
) -> list:
    """Frames of one request; numpy buffers are passed through for zero-copy sends.

    Args:
        job: the sender's job id (omitted when None).
        client, seq: the sender's id and its counter for this update (both or neither).
        shard: the shard the request is for, when it is not the receiving server's own
            (a replica: :mod:`sparseps.core.replicas`); omitted when None.
        epoch: the sender's epoch of the shard's copies (a write of a replicated job; a
            copy that moved on refuses an older one); omitted when None.
        slot: ``(segment, index)`` of a reply slot offered for the answer; omitted when None.
        forward: a write passed on along a replicated shard's chain; omitted when None.

    Raises:
        ProtocolError: a buffer has a dtype outside the allowlist or is not contiguous.
    """
    header: dict[str, object] = {
        "v": PROTOCOL_VERSION,
        "op": op,
        "id": request_id,
        "table": table,
        "bufs": buffer_header(bufs),
        "args": dict(args or {}),
    }
    if job is not None:
        header["job"] = job
    if client is not None:
        header["client"] = client
        header["seq"] = seq
    if shard is not None:
        header["shard"] = shard
    if epoch is not None:
        header["epoch"] = epoch
    if slot is not None:
        header["slot"] = list(slot)
    if forward is not None:
        header["forward"] = [forward.index, list(forward.members)]
    return [msgpack.packb(header), *bufs]


def encode_reply(
    request_id: int | None,
    *,
    result: object = None,
    bufs: Sequence[np.ndarray] = (),
    error: Mapping | None = None,
    slot: ReplyArea | None = None,
    detached: bool = False,
) -> list:
    """Frames of one reply (``error`` set means ``ok`` is False and carries no buffers).

    ``slot``: the request's reply slot (``Request.reply_to``): buffers that fit there go
    in it, and the reply is its header alone. ``detached``: the request offered a slot of
    a segment this server does not know.
    """
    header: dict[str, object]
    if error is not None:
        header = {
            "v": PROTOCOL_VERSION,
            "id": request_id,
            "ok": False,
            "error": dict(error),
            "bufs": [],
        }
        return [msgpack.packb(header)]
    header = {
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "ok": True,
        "result": result,
        "bufs": buffer_header(bufs),
    }
    if detached:
        header["detached"] = True
    if slot is not None and bufs and slot.place(bufs):
        header["slot"] = True
        return [msgpack.packb(header)]
    return [msgpack.packb(header), *bufs]


def _unpack_header(frame, limits: Limits) -> dict:
    raw = frame_bytes(frame)
    if raw.nbytes > limits.max_header_bytes:
        raise ProtocolError(
            f"header frame is {raw.nbytes} bytes, over the limit of {limits.max_header_bytes}"
        )
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(
            f"header frame is not valid msgpack ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a msgpack map, got {type(header).__name__}")
    version = header.get("v")
    if not _is_int(version) or version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version!r} is not supported (this side speaks {PROTOCOL_VERSION}); "
            "run the same sparseps version on servers and workers"
        )
    return header


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def peek_request_id(frames: Sequence) -> int | None:
    """Best-effort request id of a (possibly malformed) request, to address an error reply."""
    if not frames:
        return None
    try:
        raw = frame_bytes(frames[0])
        if raw.nbytes > (1 << 20):
            return None
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception:
        return None
    if isinstance(header, dict) and _is_int(header.get("id")) and 0 <= header["id"] < (1 << 63):
        return header["id"]
    return None


def _check_args(op: str, schema: OpSchema, args) -> dict:
    if not isinstance(args, dict):
        raise ProtocolError(f"op {op!r}: 'args' must be a map, got {type(args).__name__}")
    for name, value in args.items():
        spec = schema.args.get(name)
        if spec is None:
            allowed = ", ".join(schema.args) or "none"
            raise ProtocolError(f"op {op!r}: unknown argument {name!r:.40} (allowed: {allowed})")
        types, _ = spec
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = "/".join("None" if t is type(None) else t.__name__ for t in types)
            raise ProtocolError(
                f"op {op!r}: argument {name!r} must be {names}, got {type(value).__name__}"
            )
    for name, (_, required) in schema.args.items():
        if required and name not in args:
            raise ProtocolError(f"op {op!r}: missing argument {name!r}")
    return args


def read_header(frames: Sequence, limits: Limits = _LIMITS) -> dict:
    """The checked header map of a request or reply (size, msgpack, version), to route it
    before :func:`decode_request` (which takes it back, so it is parsed once).

    Raises:
        ProtocolError: no frames, or a header that is not a msgpack map of this version.
    """
    if not frames:
        raise ProtocolError("empty message")
    return _unpack_header(frames[0], limits)


def decode_request(
    frames: Sequence,
    limits: Limits = _LIMITS,
    ops: Mapping[str, OpSchema] = OPS,
    *,
    header: dict | None = None,
) -> Request:
    """Validate and decode one request (frames as received, without routing envelope).

    ``ops``: the schema table of the receiving service (default: the servers' :data:`OPS`;
    a heter worker serves its own, :mod:`sparseps.worker.heter_ops`). ``header``: what
    :func:`read_header` returned for these frames (it is then not parsed again).

    Raises:
        ProtocolError: anything that does not follow the protocol, naming what and where.
    """
    if not frames:
        raise ProtocolError("empty message")
    total = 0
    for frame in frames:
        total += frame_bytes(frame).nbytes
    if total > limits.max_message_bytes:
        raise ProtocolError(
            f"message is {total} bytes, over the limit of {limits.max_message_bytes}"
        )
    if header is None:
        header = _unpack_header(frames[0], limits)
    op = header.get("op")
    if not (isinstance(op, str) and op in ops):
        raise ProtocolError(f"unknown op {op!r:.60} (known: {', '.join(sorted(ops))})")
    schema = ops[op]
    request_id = header.get("id")
    if not (_is_int(request_id) and 0 <= request_id < (1 << 63)):
        raise ProtocolError(
            f"op {op!r}: 'id' must be a non-negative 64-bit int, got {request_id!r:.40}"
        )
    table = header.get("table")
    if schema.table:
        if not (isinstance(table, str) and TABLE_NAME.fullmatch(table)):
            raise ProtocolError(
                f"op {op!r}: 'table' must be 1-256 characters from [A-Za-z0-9_.-], "
                f"got {table!r:.60}"
            )
    elif table is not None:
        raise ProtocolError(f"op {op!r} takes no table, got {table!r:.40}")
    if not _HEADER_KEYS.issuperset(header):
        unknown = set(header) - _HEADER_KEYS
        raise ProtocolError(
            f"op {op!r}: unknown header keys {sorted(map(str, unknown))[:8]!r:.200}"
        )
    job, client, seq = _identity(op, header)
    shard, epoch = header.get("shard"), header.get("epoch")
    for name, value in (("shard", shard), ("epoch", epoch)):
        if value is not None and not (_is_int(value) and 0 <= value < (1 << 31)):
            raise ProtocolError(
                f"op {op!r}: {name!r} must be an int in 0..2**31-1, got {value!r:.40}"
            )
    where = f"op {op!r}"
    slot = _offered_slot(op, schema, header.get("slot"))
    forward = _forward(op, header.get("forward"))
    arrays = decode_buffers(header.get("bufs", []), frames[1:], limits, where)
    specs = schema.bufs + schema.optional
    if not len(schema.bufs) <= len(arrays) <= len(specs):
        raise ProtocolError(
            f"{where}: takes {len(schema.bufs)} to {len(specs)} buffers "
            f"({', '.join(s.name for s in specs) or 'none'}), got {len(arrays)}"
        )
    bufs = {}
    for spec, array in zip(specs, arrays, strict=False):
        found = wire_name(array.dtype)
        if found != spec.dtype or array.ndim != spec.ndim:
            raise ProtocolError(
                f"{where}: buffer {spec.name!r} must be {spec.dtype} with {spec.ndim} dims, "
                f"got {found} with shape {array.shape}"
            )
        bufs[spec.name] = array
    if len(bufs) > 1 and schema.same_rows:
        rows = {name: bufs[name].shape[0] for name in schema.same_rows if name in bufs}
        if len(set(rows.values())) > 1:
            raise ProtocolError(f"{where}: buffers must have the same number of rows, got {rows}")
    args = _check_args(op, schema, header.get("args", {}))
    return Request(
        op=op, id=request_id, table=table, bufs=bufs, args=args, limits=limits,
        job=job, client=client, seq=seq, shard=shard, epoch=epoch, slot=slot, forward=forward,
    )  # fmt: skip


def _offered_slot(op: str, schema: OpSchema, slot) -> tuple[int, int] | None:
    if slot is None:
        return None
    if not schema.slot_reply:
        raise ProtocolError(
            f"op {op!r} is not answered into a reply slot, but the request offers one"
        )
    if not (
        isinstance(slot, list)
        and len(slot) == 2
        and all(_is_int(v) and 0 <= v < (1 << 63) for v in slot)
    ):
        raise ProtocolError(
            f"op {op!r}: 'slot' must be [segment, index] (non-negative ints), got {slot!r:.60}"
        )
    return slot[0], slot[1]


def _forward(op: str, forward) -> Forward | None:
    if forward is None:
        return None
    if not (
        isinstance(forward, list)
        and len(forward) == 2
        and _is_int(forward[0])
        and 1 <= forward[0] < (1 << 63)
        and isinstance(forward[1], list)
        and 1 <= len(forward[1]) <= MAX_COPIES
        and all(_is_int(v) and 0 <= v < (1 << 31) for v in forward[1])
    ):
        raise ProtocolError(
            f"op {op!r}: 'forward' must be [index >= 1, [rank, ...] (1-{MAX_COPIES} ranks)], "
            f"got {forward!r:.80}"
        )
    return Forward(forward[0], tuple(forward[1]))


def _identity(op: str, header: dict) -> tuple[str | None, int | None, int | None]:
    """The optional ``job``, ``client`` and ``seq`` header fields, validated."""
    job = header.get("job")
    if job is not None and not (isinstance(job, str) and JOB_ID.fullmatch(job)):
        raise ProtocolError(
            f"op {op!r}: 'job' must be 1-128 characters from [A-Za-z0-9_.:-], got {job!r:.60}"
        )
    client, seq = header.get("client"), header.get("seq")
    if (client is None) != (seq is None):
        raise ProtocolError(f"op {op!r}: 'client' and 'seq' come together or not at all")
    for name, value in (("client", client), ("seq", seq)):
        if value is not None and not (_is_int(value) and 0 <= value < (1 << 63)):
            raise ProtocolError(
                f"op {op!r}: {name!r} must be a non-negative 64-bit int, got {value!r:.40}"
            )
    return job, client, seq


def decode_reply(frames: Sequence, limits: Limits = _LIMITS) -> Reply:
    """Validate and decode one reply.

    Raises:
        ProtocolError: the reply does not follow the protocol.
    """
    if not frames:
        raise ProtocolError("empty reply")
    header = _unpack_header(frames[0], limits)
    request_id = header.get("id")
    if request_id is not None and not _is_int(request_id):
        raise ProtocolError(f"reply 'id' must be an int or nil, got {type(request_id).__name__}")
    ok = header.get("ok")
    if not isinstance(ok, bool):
        raise ProtocolError("reply 'ok' must be a bool")
    if not ok:
        error = header.get("error")
        if not isinstance(error, dict):
            raise ProtocolError("error reply without an 'error' map")
        return Reply(id=request_id, ok=False, error=error)
    detached = header.get("detached", False) is True
    if header.get("slot") is True:  # the buffers are in the slot the request offered
        if len(frames) != 1:
            raise ProtocolError(f"a reply in a slot carries {len(frames) - 1} buffer frames too")
        described = described_buffers(header.get("bufs", []), limits, "reply")
        return Reply(
            id=request_id, ok=True, result=header.get("result"), slot_bufs=tuple(described)
        )
    arrays = decode_buffers(header.get("bufs", []), frames[1:], limits, "reply")
    return Reply(
        id=request_id, ok=True, result=header.get("result"), bufs=tuple(arrays), detached=detached
    )
