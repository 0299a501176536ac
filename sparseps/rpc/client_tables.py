"""Whole-table calls on sparse tables: what :class:`~sparseps.rpc.client.PSClient` sends
for each and how the servers' answers combine.

Where ``pull``/``push`` touch the rows of some keys, these act on a whole table at once:
every server does its shard, and the call blocks until every one answered. Each function
takes ``send``, the client's table-wide send (:class:`TableWide`): to every shard, or in
an elastic job to every live server of the newest placement, with servers in a move asked
again once it ended (:mod:`sparseps.elastic.table_wide`).

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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .router import result_of

if TYPE_CHECKING:
    from ..config import TableConfig
    from .protocol import Reply

__all__ = [
    "TableWide",
    "commit_inference",
    "create_table",
    "decay",
    "load",
    "save",
    "save_inference",
    "shrink",
]


class TableWide(Protocol):
    """The client's table-wide send: ``pick(reply)`` of every server's answer."""

    def __call__(self, op: str, table: str | None, args: dict | None = None, *,
                 timeout: float | None = None,
                 pick: Callable[[Reply], object] = result_of) -> list: ...  # fmt: skip


def create_table(send: TableWide, config: TableConfig) -> None:
    send("create_table", config.name, {"config": config.to_dict()})


def decay(send: TableWide, table: str, rate: float | None) -> None:
    send("decay", table, {} if rate is None else {"rate": float(rate)})


def shrink(send: TableWide, table: str) -> np.ndarray:
    """The keys every server deleted, sorted."""
    parts = send("shrink", table, pick=lambda reply: reply.bufs[0])
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.uint64)


def save(send: TableWide, table: str, directory: str | os.PathLike, timeout: float) -> list[dict]:
    """Every server's file records, one list."""
    folder = os.path.abspath(os.fspath(directory))
    parts = send("save", table, {"directory": folder}, timeout=timeout)
    return [record for part in parts for record in part]  # type: ignore[attr-defined]


def load(send: TableWide, table: str, files: Sequence, timeout: float) -> dict:
    """Totals over servers: ``{"rows", "pending", "files"}``."""
    specs: list = []
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
    parts = send("load", table, {"files": specs}, timeout=timeout)
    return {key: sum(part[key] for part in parts) for key in ("rows", "pending", "files")}


def save_inference(send: TableWide, table: str, directory: str | os.PathLike, mode: str,
                   timeout: float) -> list[dict]:  # fmt: skip
    folder = os.path.abspath(os.fspath(directory))
    return send("save_inference", table, {"directory": folder, "mode": mode}, timeout=timeout)


def commit_inference(send: TableWide, table: str) -> None:
    send("commit_inference", table)
