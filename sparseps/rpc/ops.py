"""The per-op schema of the wire protocol: which buffers and arguments each op takes, and
what its ok reply holds for the caller.

:func:`sparseps.rpc.protocol.decode_request` checks every request against
:data:`OPS` before a handler sees it; the client checks every ok reply against its op's
answer (:mod:`sparseps.rpc.answers`) before the caller reads it. Adding an op means one
entry here and one in the server's op table (:func:`sparseps.server.handlers.op_table`,
which names the handler; ``tests/server/test_op_table.py`` keeps the two together).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["OPS", "PLACED_OPS", "SHARD_WRITE_OPS", "UPDATE_OPS", "BufSpec", "OpSchema"]


@dataclass(frozen=True)
class BufSpec:
    """One buffer an op takes: its name, dtype and number of dimensions."""

    name: str
    dtype: str
    ndim: int


@dataclass(frozen=True)
class OpSchema:
    """What one op accepts.

    Attributes:
        table: whether the header's ``table`` must be a non-empty string.
        bufs: required buffers, in frame order.
        optional: optional buffers that may follow the required ones, in order (a
            message may carry a prefix of them).
        same_rows: names of buffers whose first dimension must be equal.
        args: allowed argument names -> (accepted python types, required).
        answer: keys an ok reply's result must hold -> their accepted python types (the
            fields callers read; empty: the result is not checked).
        answer_items: the same for each item of a result that is a list (empty: none).
        answer_bufs: the buffers an ok reply carries, in order (None: not checked).
        slot_reply: a same-host client may offer a reply slot for its answer
            (:mod:`sparseps.rpc.reply_slots`): ops whose answers are bulk rows.
    """

    table: bool = False
    bufs: tuple[BufSpec, ...] = ()
    optional: tuple[BufSpec, ...] = ()
    same_rows: tuple[str, ...] = ()
    args: Mapping[str, tuple[tuple[type, ...], bool]] = field(default_factory=dict)
    answer: Mapping[str, tuple[type, ...]] = field(default_factory=dict)
    answer_items: Mapping[str, tuple[type, ...]] = field(default_factory=dict)
    answer_bufs: tuple[BufSpec, ...] | None = None
    slot_reply: bool = False


_KEYS = BufSpec("keys", "uint64", 1)
_SHOWS = BufSpec("shows", "float32", 1)
_CLICKS = BufSpec("clicks", "float32", 1)
_VEC = BufSpec("values", "float32", 1)
_VSHARDS = BufSpec("vshards", "int64", 1)
_NONE = type(None)
_INT = (int,)
_ROWS = BufSpec("rows", "float32", 2)
# A file a server wrote (sparseps.files.shards.write_shard): what checkpoint writing reads.
_FILE_RECORD = {"name": (str,), "path": (str,), "bytes": _INT, "rows": _INT, "kind": (str,)}
# What move_export answers and move_import takes: a shard's rows (r_) and pending
# counters (p_), column by column in sparseps.elastic.server_moves' order.
_ROW_COLUMNS = {
    "key": ("uint64", 1),
    "embedding": ("float32", 2),
    "state": ("float32", 2),
    "show": ("float32", 1),
    "click": ("float32", 1),
    "unseen_days": ("int32", 1),
    "delta_score": ("float32", 1),
    "touched": ("uint8", 1),
}
_PENDING_COLUMNS = ("key", "show", "click", "unseen_days", "touched")
_MOVED = (
    *(BufSpec(f"r_{name}", *spec) for name, spec in _ROW_COLUMNS.items()),
    *(BufSpec(f"p_{name}", *_ROW_COLUMNS[name]) for name in _PENDING_COLUMNS),
)

# The table-wide ops of an elastic job carry the placement version the client sent them
# under: a server of another version refuses them (sparseps.elastic.server_moves), so a
# server that applies one did so under the placement the client knows.
_PLACED: dict = {"placement_version": ((int,), False)}

OPS: dict[str, OpSchema] = {
    "ping": OpSchema(answer={"rank": _INT}),
    # a same-host client's reply slots (sparseps.rpc.reply_slots): the segment to map
    "attach_replies": OpSchema(
        args={"slots": ((int,), True), "slot_bytes": ((int,), True)},
        answer={
            "segment": _INT,
            "path": (str,),
            "token": (bytes,),
            "slots": _INT,
            "slot_bytes": _INT,
        },
    ),
    "stop": OpSchema(),
    "stats": OpSchema(answer={"rank": _INT}),
    "create_table": OpSchema(table=True, args={"config": ((dict,), True)}),
    "pull": OpSchema(table=True, bufs=(_KEYS,), answer_bufs=(_ROWS,), slot_reply=True),
    # keys of coming pulls: a tiered table promotes their disk rows in the background
    "prefetch": OpSchema(table=True, bufs=(_KEYS,), answer={"queued": _INT}),
    "push": OpSchema(
        table=True,
        bufs=(_KEYS, BufSpec("grads", "float32", 2)),
        optional=(_SHOWS, _CLICKS),
        same_rows=("keys", "grads", "shows", "clicks"),
    ),
    "push_delta": OpSchema(
        table=True,
        bufs=(_KEYS, BufSpec("deltas", "float32", 2)),
        optional=(_SHOWS, _CLICKS),
        same_rows=("keys", "deltas", "shows", "clicks"),
    ),
    # GPUPS: whole rows (embedding + optimizer state) out and in (sparseps.table.full_rows)
    "pull_full": OpSchema(table=True, bufs=(_KEYS,), answer_bufs=(_ROWS,), slot_reply=True),
    # GPUPS with admission: is each key a row, and a pending key's counters
    "pull_counts": OpSchema(table=True, bufs=(_KEYS,), answer_bufs=(_ROWS,)),
    "write_rows": OpSchema(
        table=True,
        bufs=(_KEYS, BufSpec("rows", "float32", 2)),
        optional=(_SHOWS, _CLICKS),
        same_rows=("keys", "rows", "shows", "clicks"),
    ),
    "decay": OpSchema(table=True, args={"rate": ((float, int, _NONE), False), **_PLACED}),
    "shrink": OpSchema(table=True, args=_PLACED),
    "save": OpSchema(
        table=True, args={"directory": ((str,), True), **_PLACED}, answer_items=_FILE_RECORD
    ),
    "load": OpSchema(
        table=True,
        args={"files": ((list,), True), **_PLACED},
        answer={"rows": _INT, "pending": _INT, "files": _INT},
    ),
    "create_dense": OpSchema(
        table=True,
        optional=(_VEC,),
        args={"size": ((int,), True), "rule": ((dict,), True)},
    ),
    "pull_dense": OpSchema(table=True, answer_bufs=(_VEC,), slot_reply=True),
    # pull: the reply carries the values after this step (one round trip for both)
    "push_dense": OpSchema(table=True, bufs=(_VEC,), args={"pull": ((bool,), False)}),
    "push_dense_delta": OpSchema(table=True, bufs=(_VEC,)),
    "set_dense": OpSchema(table=True, bufs=(_VEC,)),
    "save_dense": OpSchema(table=True, args={"directory": ((str,), True)}),
    "load_dense": OpSchema(
        table=True, args={"path": ((str,), True), "sha256": ((str, _NONE), False)}
    ),
    "save_inference": OpSchema(
        table=True,
        args={"directory": ((str,), True), "mode": ((str,), True), **_PLACED},
        answer=_FILE_RECORD,
    ),
    "commit_inference": OpSchema(table=True, args=_PLACED),
    # replicated shards (sparseps.server.shard_chain): a copy's view of its shard (epoch,
    # copies head first, writes applied); the head paused and saved for a replacement
    # server; the replacement is in sync and joins the chain's end
    "shard_info": OpSchema(
        answer={
            "shard": _INT,
            "epoch": _INT,
            "members": (list,),
            "recovering": (bool,),
            "index": _INT,
        }
    ),
    "replicate": OpSchema(
        args={"directory": ((str,), True), "rank": ((int,), True)},
        answer={
            "tables": (dict,),
            "dense": (dict,),
            "applied": (list,),
            "epoch": _INT,
            "index": _INT,
        },
    ),
    "replicate_done": OpSchema(
        args={"rank": ((int,), True), "epoch": ((int,), True)},
        answer={"epoch": _INT, "members": (list,)},
    ),
    # elastic jobs (sparseps.elastic.server_moves): placement over virtual shards, live moves
    "get_placement": OpSchema(answer={"version": _INT, "tables": (dict,)}),
    "set_placement": OpSchema(
        bufs=(BufSpec("owners", "int64", 1),),
        args={"version": ((int,), True), "endpoints": ((list,), True)},
    ),
    "move_begin": OpSchema(bufs=(_VSHARDS,), args={"receive": ((int, bool), False)}),
    "move_freeze": OpSchema(bufs=(_VSHARDS,)),
    "move_export": OpSchema(
        table=True,
        bufs=(_VSHARDS,),
        args={"dirty": ((int, bool), True)},
        answer={"rows": _INT, "pending": _INT},
        answer_bufs=_MOVED,
    ),
    "move_import": OpSchema(
        table=True,
        bufs=_MOVED,
        same_rows=tuple(spec.name for spec in _MOVED if spec.name.startswith("r_")),
    ),
    "move_drop": OpSchema(table=True, bufs=(_VSHARDS,)),
}

# The table-wide ops that a server in a move refuses, sent with the client's placement version.
PLACED_OPS = frozenset(op for op, schema in OPS.items() if "placement_version" in schema.args)
# Ops that change a table by adding to it (write_rows: its counters): sent with (client, seq) and applied once per
# seq, so that a request sent again after a timeout cannot be applied twice.
UPDATE_OPS = frozenset({"push", "push_delta", "write_rows", "push_dense", "push_dense_delta"})
# Ops that change a shard: with replicas they go to the shard's head, carry the sender's
# epoch, and pass along the shard's chain of copies in the head's order
# (sparseps.server.shard_chain).
SHARD_WRITE_OPS = UPDATE_OPS | frozenset(
    {"set_dense", "create_table", "create_dense", "decay", "shrink", "load", "load_dense",
     "commit_inference"}
)  # fmt: skip
