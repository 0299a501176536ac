"""Whole-table calls on sparse tables through :class:`~sparseps.rpc.client.PSClient`.

Where ``pull``/``push`` touch the rows of some keys, these act on a whole table at
once: every server does its shard, and the call blocks until every one answered (an
elastic job: every live server of the placement, with servers in a move asked again
once it ended, :mod:`sparseps.rpc.placed`).

- ``create_table``: on every server (idempotent for an equal config).
- ``decay`` / ``shrink``: the lifecycle of rows (end of day: decay show/click, age
  unseen rows; delete rows per the table's policy).
- ``save`` / ``load``: shard files in a folder the servers see (checkpoints), under the
  client's ``file_timeout``, which is long: file ops are slow by nature.
- ``save_inference`` / ``commit_inference``: embeddings for serving, base or delta
  (:mod:`sparseps.checkpoint.inference`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .client_parts import ClientParts
from .handle import Handle

if TYPE_CHECKING:
    from ..config import TableConfig

__all__ = ["ClientTables"]


class ClientTables(ClientParts):
    """The whole-table calls, mixed into :class:`~sparseps.rpc.client.PSClient`."""

    def create_table(self, config: TableConfig) -> None:
        """Create a sparse table on every server (idempotent for an equal config).

        Raises:
            RemoteError: a table of that name exists with a different config (the message
                names the differing fields and both configs).
        """
        self._each_shard("create_table", config.name, {"config": config.to_dict()})

    def decay(self, table: str, rate: float | None = None) -> None:
        """End of day on every server: decay show/click, age unseen rows."""
        self._each_shard("decay", table, {} if rate is None else {"rate": float(rate)})

    def shrink(self, table: str) -> np.ndarray:
        """Delete rows per the lifecycle policy; returns the deleted keys (sorted uint64)."""
        self._probe_placement()
        if self._routing is not None:  # elastic: servers in a move refuse, sent again
            parts = self._table_wide("shrink", table, None, None, lambda reply: reply.bufs[0])
        else:
            calls = [self._shard_request(shard, "shrink", table)
                     for shard in range(self.num_servers)]  # fmt: skip
            parts = Handle(self._channel, calls,
                           lambda replies: [r.bufs[0] for r in replies]).wait()  # fmt: skip
        return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.uint64)

    def save(
        self, table: str, directory: str | os.PathLike, *, timeout: float | None = None
    ) -> list[dict]:
        """Every server writes its shard of ``table`` into ``directory`` (seen by the servers).

        Returns:
            one record per file: ``name``, ``path``, ``bytes``, ``sha256``, ``xxh3_128``,
            ``rows``, ``kind`` (``rows``/``pending``) and ``rank``.
        """
        folder = os.path.abspath(os.fspath(directory))
        return [
            record
            for part in self._each_shard(
                "save",
                table,
                {"directory": folder},
                timeout=timeout or self.file_timeout,
            )  # fmt: skip
            for record in part
        ]

    def load(self, table: str, files: Sequence, *, timeout: float | None = None) -> dict:
        """Load shard files written by any number of servers; each keeps the keys it owns.

        Args:
            table: an existing table with the same dim and rule as the saved one.
            files: paths, or the records returned by :meth:`save` (checksums verified).

        Returns:
            totals over servers: ``{"rows", "pending", "files"}``.
        """
        specs = []
        for spec in files:
            if isinstance(spec, dict):
                specs.append(
                    {
                        "path": os.path.abspath(spec["path"]),
                        # the checksums the record has (xxh3-128 is verified when present)
                        **{key: spec[key] for key in ("sha256", "xxh3_128") if key in spec},
                    }
                )
            else:
                specs.append(os.path.abspath(os.fspath(spec)))
        parts = self._each_shard(
            "load", table, {"files": specs}, timeout=timeout or self.file_timeout
        )
        return {key: sum(part[key] for part in parts) for key in ("rows", "pending", "files")}

    def save_inference(self, table: str, directory: str | os.PathLike, mode: str) -> list[dict]:
        """Every server writes its embeddings for serving (``mode`` base or delta, see
        :mod:`sparseps.checkpoint.inference`); returns one file record per server."""
        folder = os.path.abspath(os.fspath(directory))
        return self._each_shard(
            "save_inference", table, {"directory": folder, "mode": mode},
            timeout=self.file_timeout,
        )  # fmt: skip

    def commit_inference(self, table: str) -> None:
        """After an inference save is in place: every server restarts ``table``'s
        changed-rows marker, so the next delta holds only rows changed from now on."""
        self._each_shard("commit_inference", table)
