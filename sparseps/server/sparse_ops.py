"""``SparseOps``: the ops on a server's shard of the sparse tables: create, pull,
prefetch, push, push_delta, decay and shrink.

Each checks what needs server state (does the table exist, do the keys belong to this
server: :class:`~sparseps.server.ownership.KeyOwnership`, does the reply fit in one
message) and calls the table engine (:class:`~sparseps.table.SparseTable`) under the
table's lock: pulls share it, pushes, decay and shrink hold it alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from ..errors import ConfigError, InputError
from ..rpc.protocol import HEADER_ROOM
from .entries import TableEntry, config_differences

if TYPE_CHECKING:
    from ..elastic.server_moves import ElasticMoves
    from ..rpc.protocol import Request
    from ..table import SparseTable
    from .disk_dir import DiskDir
    from .entries import Answer, Tables
    from .ownership import KeyOwnership
    from .prefetch import RowPrefetcher
    from .reply_segments import ServerSlot

__all__ = ["SparseOps", "check_reply_size"]


def check_reply_size(rank: int, request: Request, count: int, width: int, unit: str) -> None:
    """Refuse, before allocating it, a reply that could not travel in one message.

    Raises:
        InputError: ``count`` rows of ``width`` float32 exceed the message limit.
    """
    limits = request.limits
    nbytes = count * width * 4
    if nbytes > limits.max_payload_bytes:
        raise InputError(
            f"server {rank}: {request.op} {request.table!r}: the reply would be {count} "
            f"{unit} x {width} float32 = {nbytes} bytes, over the message limit "
            f"(Limits.max_message_bytes={limits.max_message_bytes} minus {HEADER_ROOM} for the "
            f"header); send at most {limits.max_payload_bytes // (width * 4)} {unit} per server "
            "per request, or raise the servers' --max-message-bytes together with "
            "PSClient(limits=Limits(max_message_bytes=...))"
        )


class SparseOps:
    """The sparse-table ops of one server (one shard copy).

    Args:
        tables: the shard's sparse tables.
        ownership: which keys are this server's.
        elastic: the server's placement (table-wide ops are refused during a move).
        prefetcher: the server's background row promotion (tiered tables).
        disk_dir: where tiered tables keep their rows; None refuses them.
    """

    def __init__(
        self,
        tables: Tables[SparseTable],
        ownership: KeyOwnership,
        *,
        elastic: ElasticMoves,
        prefetcher: RowPrefetcher,
        disk_dir: DiskDir | None,
    ) -> None:
        self.tables = tables
        self.rank = tables.rank
        self.ownership = ownership
        self.elastic = elastic
        self.prefetcher = prefetcher
        self.disk_dir = disk_dir

    def create_table(self, request: Request) -> Answer:
        from ..config import TableConfig
        from ..table import SparseTable

        config = TableConfig.from_dict(request.args["config"])
        if config.name != request.table:
            raise ConfigError(
                f"create_table: header table {request.table!r} != config name {config.name!r}"
            )
        with self.tables.creating:
            entry = self.tables.get(config.name)
            if entry is not None:
                existing = entry.table.config
                if existing == config:
                    return {"created": False}, []
                diff = config_differences(existing.to_dict(), config.to_dict())
                raise ConfigError(
                    f"server {self.rank}: table {config.name!r} already exists with a different config: "
                    + "; ".join(diff)
                    + f" (existing: {existing.to_dict()}; requested: {config.to_dict()})"
                )
            folder = None if self.disk_dir is None else self.disk_dir.path
            try:
                table = SparseTable(config, disk_dir=folder)
            except ConfigError as exc:
                raise ConfigError(f"server {self.rank}: {exc}") from None
            self.tables.add(config.name, TableEntry(table))
        return {"created": True}, []

    def pull(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        keys = request.bufs["keys"]
        # a table with accessor.cvm pulls each key's show and click before its embedding
        width = entry.table.config.pull_dim
        check_reply_size(self.rank, request, len(keys), width, "keys")
        # a same-host client's slot: the rows are gathered straight into its memory
        slot = cast("ServerSlot | None", request.reply_to)
        out = None if slot is None else slot.array((len(keys), width), np.float32)
        with entry.lock.read():  # checked inside: a migration's drop cannot come between
            self.ownership.check_routed(request, keys)
            rows = entry.table.pull(keys, out=out)
        return None, [rows]

    def prefetch(self, request: Request) -> Answer:
        """Queue the keys for the prefetch thread and answer at once (a hint: nothing is
        promoted for an in-memory table)."""
        entry = self.tables.entry(request)
        keys = request.bufs["keys"]
        self.ownership.check_routed(request, keys)
        if entry.table.disk_path is None or not len(keys):
            return {"queued": 0}, []
        queued = self.prefetcher.submit(entry, keys.copy())  # the buffer is the message's
        return {"queued": len(keys) if queued else 0}, []

    def push(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        bufs = request.bufs
        with entry.lock.write():  # checked inside: a migration's freeze orders pushes
            self.ownership.check_routed(request, bufs["keys"])
            entry.table.push(
                bufs["keys"], bufs["grads"], shows=bufs.get("shows"), clicks=bufs.get("clicks")
            )
        return None, []

    def push_delta(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        bufs = request.bufs
        with entry.lock.write():  # as push
            self.ownership.check_routed(request, bufs["keys"])
            entry.table.push_delta(
                bufs["keys"], bufs["deltas"], shows=bufs.get("shows"), clicks=bufs.get("clicks")
            )
        return None, []

    def decay(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        with entry.lock.write():
            self.elastic.refuse_during_move(request)  # elastic: a copied row would miss it
            entry.table.decay(request.args.get("rate"))
        return None, []

    def shrink(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        with entry.lock.write():
            self.elastic.refuse_during_move(request)  # elastic: a copied row would survive it
            deleted = entry.table.shrink()
        owned = self.ownership.owned_mask(deleted)  # not the moved rows a source holds until drop
        if owned is not None:
            deleted = deleted[owned]
        return None, [np.ascontiguousarray(deleted, dtype=np.uint64)]
