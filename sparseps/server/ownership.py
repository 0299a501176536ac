"""``KeyOwnership``: which keys are this server's.

A plain job routes each key by :func:`sparseps.core.routing.server_of` (the formula
every client uses); an elastic job by the placement its servers hold
(:class:`~sparseps.elastic.server_moves.ElasticMoves`). Every keyed op checks its keys
here before it touches a table: a key another server owns is refused, never applied
here (a client with another server list would otherwise corrupt shards). Saves, inference
saves and a shrink's answer keep only the owned rows; a load takes only the owned rows
of each shard file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.routing import misrouted, server_of
from ..errors import InputError

if TYPE_CHECKING:
    from ..elastic.server_moves import ElasticMoves
    from ..rpc.protocol import Request

__all__ = ["KeyOwnership"]


class KeyOwnership:
    """The keys of server ``rank`` of ``num_servers``, by formula or by ``elastic``'s placement.

    Args:
        rank: the server's rank.
        num_servers: servers in the job.
        elastic: the server's placement, when it holds one.
    """

    def __init__(self, rank: int, num_servers: int, elastic: ElasticMoves) -> None:
        self.rank = rank
        self.num_servers = num_servers
        self.elastic = elastic

    def check_routed(self, request: Request, keys: np.ndarray) -> None:
        """Refuse the request when a key belongs to another server.

        Raises:
            InputError: a key routes to another server (plain job).
            PlacementError: a key is in a virtual shard this server does not own or hands
                over (elastic job: the client refreshes its placement and resends).
        """
        if self.elastic.placement is not None:  # an elastic job: its placement decides
            self.elastic.check_placed(request, keys)
            return
        wrong, first = misrouted(keys, self.num_servers, self.rank)
        if wrong:
            raise InputError(
                f"server {self.rank} of {self.num_servers}: {wrong} of {len(keys)} keys of "
                f"{request.op} {request.table!r} belong to other servers (first key {int(keys[first])}); "
                "the client's endpoint list must equal the servers' (same hosts, same order)"
            )

    def owned_mask(self, keys: np.ndarray) -> np.ndarray | None:
        """Which of ``keys`` this server owns under its placement; None without one (a
        plain server holds only its own keys)."""
        return self.elastic.owned_mask(keys)

    def owned_columns(self, columns: dict) -> dict:
        """An elastic server's own rows of ``columns``: a source still holds the rows it
        handed over until ``move_drop``, and they are the new owner's to save."""
        owned = self.owned_mask(columns["key"])
        if owned is None or owned.all():
            return columns
        return {name: np.ascontiguousarray(values[owned]) for name, values in columns.items()}

    def owned_rows(self, meta: dict, keys: np.ndarray) -> np.ndarray | None:
        """Which rows of a shard file this server owns: None for all of them.

        Routing is checked per file: the file of this rank in a save made on this many
        servers holds exactly this server's keys (its writer owned them by the same
        rule), the other files of that save none of them. A save made on another number
        of servers is filtered key by key (one vectorised pass).
        """
        placement = self.elastic.placement
        if placement is not None:  # an elastic job: the placement decides, file by file
            return np.flatnonzero(placement.owner_of(keys) == self.rank) if len(keys) else None
        if self.num_servers == 1:
            return None
        if (
            meta.get("num_servers") == self.num_servers
            and isinstance(meta.get("rank"), int)
            and "placement_version" not in meta  # an elastic save: filtered key by key
        ):
            return None if meta["rank"] == self.rank else np.empty(0, np.int64)
        if not len(keys):
            return None
        return np.flatnonzero(server_of(keys, self.num_servers) == self.rank)
