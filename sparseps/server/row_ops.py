"""The whole-row ops (GPUPS): ``pull_full`` and ``write_rows``, mixed into the server state.

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

if TYPE_CHECKING:
    import numpy as np

    from ..rpc.protocol import Request

__all__ = ["RowOps"]


class RowOps:
    """``_op_pull_full`` / ``_op_write_rows`` of :class:`~sparseps.server.handlers.ServerState`."""

    if TYPE_CHECKING:  # what ServerState, the class this is mixed into, provides
        rank: int

        def _sparse_entry(self, request: Request): ...
        def _check_routed(self, request: Request, keys: np.ndarray) -> None: ...
        def _check_reply_size(self, request: Request, count: int, width: int,
                              unit: str) -> None: ...  # fmt: skip

    def _op_pull_full(self, request: Request):
        entry = self._sparse_entry(request)
        keys = request.bufs["keys"]
        self._check_routed(request, keys)
        self._check_reply_size(request, len(keys), entry.table.full_width, "keys")
        with entry.lock.read():
            rows = entry.table.pull_full(keys)
        return None, [rows]

    def _op_write_rows(self, request: Request):
        entry = self._sparse_entry(request)
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
            self._check_routed(request, keys)
            entry.table.write_rows(keys, rows, shows=bufs.get("shows"), clicks=bufs.get("clicks"))
        return None, []
