"""Whole rows (embedding + optimizer state) through :class:`~sparseps.rpc.client.PSClient`.

GPUPS (:mod:`sparseps.worker.gpups`) trains a pass's rows on a device with the table's
rule, so it reads each row's optimizer state with its embedding before the pass and
writes both back after it:

- ``pull_full(table, keys)``: ``wait()`` -> float32 ``[n, dim + state_dim]``, the
  embedding then the state columns of each key (duplicates allowed); a key that is not a
  row reads as its initial embedding (admission "always") and the rule's initial state.
- ``write_rows(table, keys, rows, shows=None, clicks=None)``: upsert; each row's
  embedding and state *become* ``rows`` (an overwrite: the caller must be the keys' only
  writer), show/click are added as ``push_delta`` adds them. Keys must be unique. Sent to
  head of a shard's copies with one sequence number (applied once per copy).

Both are keyed calls (:mod:`sparseps.rpc.keyed`), grouped and sent by the client's
router. Server side: :mod:`sparseps.server.row_ops`, :mod:`sparseps.table.full_rows`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.keysets import has_repeats
from ..core.validate import check_key_array
from ..errors import InputError
from .client_checks import check_counts_or_none, check_finite_rows
from .handle import Handle, completed
from .keyed import KeyedBatch, rows_of

if TYPE_CHECKING:
    from .router import Router

__all__ = ["pull_counts", "pull_full", "write_rows"]


def pull_counts(router: Router, table: str, keys: np.ndarray) -> Handle:
    keys = check_key_array(f"pull_counts {table!r}", keys, contiguous=False)
    grouping = router.group(keys, dedup=True)
    batch = KeyedBatch("pull_counts", table, grouping.keys, ())
    return router.send(batch, grouping, rows_of(len(grouping.keys), grouping.inverse))


def pull_full(router: Router, table: str, keys: np.ndarray) -> Handle:
    keys = check_key_array(f"pull_full {table!r}", keys, contiguous=False)
    grouping = router.group(keys, dedup=True)
    batch = KeyedBatch("pull_full", table, grouping.keys, ())
    return router.send(batch, grouping, rows_of(len(grouping.keys), grouping.inverse))


def write_rows(router: Router, table: str, keys: np.ndarray, rows: np.ndarray,
               shows: np.ndarray | None, clicks: np.ndarray | None) -> Handle:  # fmt: skip
    what = f"write_rows {table!r}"
    keys = check_key_array(what, keys, contiguous=False)
    rows = check_finite_rows(rows, "rows", what, len(keys))
    shows = check_counts_or_none(shows, "shows", what, len(keys))
    clicks = check_counts_or_none(clicks, "clicks", what, len(keys))
    if not len(keys):
        return completed(None)
    if has_repeats(keys):
        raise InputError(
            f"{what}: keys must be unique (each row is written once); nothing was sent"
        )
    grouping = router.group(keys, dedup=True)
    inverse = grouping.inverse
    assert inverse is not None, "a deduplicated grouping maps the caller's keys"
    order = np.empty(len(keys), np.int64)
    order[inverse] = np.arange(len(keys))  # grouped[i] == keys[order[i]]
    columns = [np.ascontiguousarray(rows[order])]
    columns += [np.ascontiguousarray(c[order]) for c in (shows, clicks) if c is not None]
    if shows is None and clicks is not None:  # clicks alone: shows take their default
        columns.insert(1, np.ones(len(keys), np.float32))
    batch = KeyedBatch("write_rows", table, grouping.keys, columns)
    return router.send(batch, grouping, _nothing)


def _nothing(got: list) -> None:
    return None
