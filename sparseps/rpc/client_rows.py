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

Server side: :mod:`sparseps.server.row_ops`, :mod:`sparseps.table.full_rows`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.keysets import has_repeats
from ..core.validate import check_key_array
from ..errors import InputError
from .client_checks import check_counts_or_none, check_finite_rows
from .client_parts import ClientParts
from .handle import Handle, completed
from .placed import RoutedHandle, rows_of

__all__ = ["ClientRows"]


class ClientRows(ClientParts):
    """``pull_full`` / ``write_rows``, mixed into :class:`~sparseps.rpc.client.PSClient`."""

    if TYPE_CHECKING:  # placed.PlacementRouting's keyed ops (see client_parts.py)

        def _group(self, keys: np.ndarray, *, dedup: bool = True) -> tuple: ...
        def _keyed(self, op: str, table: str, group: tuple, columns, finish
                   ) -> RoutedHandle: ...  # fmt: skip

    def pull_full(self, table: str, keys: np.ndarray) -> RoutedHandle:
        """Embedding and optimizer state of ``keys``; ``wait()`` -> float32
        ``[len(keys), dim + state_dim]`` in the caller's order."""
        keys = check_key_array(f"pull_full {table!r}", keys, contiguous=False)
        group = self._group(keys)
        return self._keyed("pull_full", table, group, (), rows_of(len(group[0]), group[2]))

    def write_rows(
        self,
        table: str,
        keys: np.ndarray,
        rows: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
    ) -> Handle | RoutedHandle:
        """Overwrite the embedding and state of ``keys`` (unique), add show/click;
        ``wait()`` -> None (module docstring).

        Raises:
            InputError: keys not 1-D uint64 or repeated, rows not float32 ``[n, width]``
                or not finite, bad counts; nothing was sent. A width other than the
                table's ``dim + state_dim`` is refused by the servers (``RemoteError``).
        """
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
        group = self._group(keys)
        inverse = group[2]
        order = np.empty(len(keys), np.int64)
        order[inverse] = np.arange(len(keys))  # grouped[i] == keys[order[i]]
        columns = [np.ascontiguousarray(rows[order])]
        columns += [np.ascontiguousarray(c[order]) for c in (shows, clicks) if c is not None]
        if shows is None and clicks is not None:  # clicks alone: shows take their default
            columns.insert(1, np.ones(len(keys), np.float32))
        return self._keyed("write_rows", table, group, columns, lambda _: None)
