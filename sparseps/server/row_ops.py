"""``WholeRows``: the whole-row ops of GPUPS, ``pull_full`` and ``write_rows``.

``pull_full`` answers the embedding and optimizer state of each key (float32
``[n, dim + state_dim]``); ``write_rows`` upserts whole rows: embedding and state are
overwritten, show/click added as ``push_delta`` adds them
(:mod:`sparseps.table.full_rows`). An overwrite is safe only when one writer owns each
key: GPUPS gives every key of a pass exactly one owner worker (``server_of(key, W)``),
so no two workers write a row. ``write_rows`` is an update op (applied once per
``(client, seq)``) and a shard write (every live copy applies it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InputError
from .sparse_ops import check_reply_size

if TYPE_CHECKING:
    from ..rpc.protocol import Request
    from ..table import SparseTable
    from .entries import Answer, Tables
    from .ownership import KeyOwnership

__all__ = ["WholeRows"]


class WholeRows:
    """Whole rows of the sparse tables out (``pull_full``) and in (``write_rows``).

    Args:
        tables: the shard's sparse tables.
        ownership: which keys are this server's.
    """

    def __init__(self, tables: Tables[SparseTable], ownership: KeyOwnership) -> None:
        self.tables = tables
        self.rank = tables.rank
        self.ownership = ownership

    def pull_full(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        keys = request.bufs["keys"]
        check_reply_size(self.rank, request, len(keys), entry.table.full_width, "keys")
        with entry.lock.read():  # checked inside, as pull
            self.ownership.check_routed(request, keys)
            rows = entry.table.pull_full(keys)
        return None, [rows]

    def pull_counts(self, request: Request) -> Answer:
        """Per key ``[is a row (1/0), pending show, pending click]`` (GPUPS admission)."""
        entry = self.tables.entry(request)
        keys = request.bufs["keys"]
        with entry.lock.read():  # checked inside, as pull
            self.ownership.check_routed(request, keys)
            counts = entry.table.pull_counts(keys)
        return None, [counts]

    def write_rows(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        bufs = request.bufs
        keys, rows = bufs["keys"], bufs["rows"]
        layout = entry.table.layout
        if rows.shape[1] != layout.dim + layout.state_dim:
            raise InputError(
                f"server {self.rank}: write_rows {request.table!r}: rows have "
                f"{rows.shape[1]} columns, the table's full row has {layout.dim + layout.state_dim} "
                f"(embedding dim {layout.dim} + {layout.state_dim} optimizer state columns of "
                f"{entry.table.config.rule.name!r}); nothing was written"
            )
        with entry.lock.write():  # checked inside: a migration's freeze orders writes
            self.ownership.check_routed(request, keys)
            entry.table.write_rows(keys, rows, shows=bufs.get("shows"), clicks=bufs.get("clicks"))
        return None, []
