"""Key placement over virtual shards, for jobs whose server count changes (issue 23).

A key goes to a *virtual shard* with the routing mix of :mod:`sparseps.core.routing`
ranged onto ``V`` (fixed for the life of a job), and a *placement* maps each virtual
shard to a server rank::

    h = splitmix64_finaliser(key ^ ROUTING_SALT)
    vshard = ((h >> 32) * V) >> 32
    rank = owners[vshard]

Why this shape:

- **The default placement is today's routing, exactly.** With ``V`` a multiple of ``S``
  and the contiguous placement ``owners[v] = v * S // V``, ``owners[vshard] ==
  ((h >> 32) * S) >> 32`` for every key (``floor(floor(x*k*S)/k) == floor(x*S)``), so a
  job that turns elastic keeps every row where it is, and checkpoints saved by it or
  before it load into any server count by the unchanged rule (:func:`server_of`).
- **Adding or removing a server moves only its share.** :func:`rebalance` is a
  minimal-move assignment: a server keeps every virtual shard up to its new quota, the
  surplus (and every shard of a removed server) goes to the servers under quota, so
  growing S -> S+1 moves about ``V / (S+1)`` shards, all to the new server. (A
  rendezvous hash would also move only the new server's share, but would not reproduce
  the routing of jobs that started without placement.)
- Placements carry a **version**; a server refuses keys of virtual shards it does not
  own (or is handing over) with :class:`PlacementError`, and a client that gets one
  fetches the newest placement and resends (:mod:`sparseps.elastic.client`).

Worked example (``V = 8``): default over 2 servers ``[0 0 0 0 1 1 1 1]`` (version 1);
grow to ranks {0, 1, 2}: ``[0 0 0 2 1 1 1 2]`` (version 2: shards 3 and 7 move to 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .routing import group_by_table, route_by_table, routing_hash

__all__ = [
    "DEFAULT_VSHARDS",
    "Placement",
    "PlacementError",
    "default_vshards",
    "rebalance",
    "vshards_of",
]

# Virtual shards per job: at least this many, rounded up to a multiple of the start count.
DEFAULT_VSHARDS = 1024


class PlacementError(InputError):
    """A server does not own (or is handing over) a virtual shard of the request: the
    client's placement is stale. Resend after fetching the newest placement."""


def default_vshards(num_servers: int, at_least: int = DEFAULT_VSHARDS) -> int:
    """The smallest multiple of ``num_servers`` that is >= ``at_least``."""
    if num_servers < 1 or at_least < 1:
        raise InputError(f"default_vshards: need num_servers >= 1 and at_least >= 1, "
                         f"got {num_servers}, {at_least}")  # fmt: skip
    return -(-at_least // num_servers) * num_servers


def vshards_of(keys: np.ndarray, vshards: int) -> np.ndarray:
    """Virtual shard of each key (uint64 ``[n]`` -> int64 ``[n]``), vectorised."""
    high = routing_hash(keys) >> np.uint64(32)
    return ((high * np.uint64(vshards)) >> np.uint64(32)).astype(np.int64)


@dataclass(frozen=True)
class Placement:
    """Which server rank owns each virtual shard.

    Attributes:
        version: increases by one at every change (1 for a job's first placement).
        endpoints: ``host:port`` of every rank the owners may name (a removed server's
            rank keeps its slot, so ranks never change meaning).
        owners: int64 ``[V]``, the owner rank of each virtual shard.
    """

    version: int
    endpoints: tuple[str, ...]
    owners: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        owners = np.ascontiguousarray(self.owners, dtype=np.int64)
        if not isinstance(self.version, int) or self.version < 1:
            raise InputError(f"Placement: version must be an int >= 1, got {self.version!r}")
        if owners.ndim != 1 or owners.size < 1:
            raise InputError(f"Placement: owners must be a non-empty 1-D array, got {owners.shape}")
        if not self.endpoints or not all(isinstance(e, str) and e for e in self.endpoints):
            raise InputError(
                f"Placement: endpoints must be non-empty strings, got {self.endpoints!r}"
            )
        bad = (owners < 0) | (owners >= len(self.endpoints))
        if bad.any():
            raise InputError(
                f"Placement: owner {int(owners[bad][0])} of virtual shard {int(np.flatnonzero(bad)[0])} "
                f"is not a rank of the {len(self.endpoints)} endpoints"
            )
        object.__setattr__(self, "endpoints", tuple(self.endpoints))
        owners.setflags(write=False)
        object.__setattr__(self, "owners", owners)

    @classmethod
    def default(cls, endpoints: Sequence[str], vshards: int | None = None,
                *, ranks: Sequence[int] | None = None) -> Placement:  # fmt: skip
        """Contiguous blocks over ``ranks`` (default: every endpoint), version 1.

        Over all ``S`` endpoints with ``vshards`` a multiple of ``S`` this routes every key
        exactly as :func:`sparseps.core.routing.server_of` does.
        """
        ranks = list(range(len(endpoints))) if ranks is None else list(ranks)
        if vshards is None:
            vshards = default_vshards(len(ranks))
        live = np.asarray(ranks, np.int64)
        owners = live[np.arange(vshards, dtype=np.int64) * len(live) // vshards]
        return cls(1, tuple(endpoints), owners)

    @property
    def vshards(self) -> int:
        return int(self.owners.size)

    def live_ranks(self) -> list[int]:
        """Ranks that own at least one virtual shard."""
        return [int(r) for r in np.unique(self.owners)]

    def owner_of(self, keys: np.ndarray) -> np.ndarray:
        """Owner rank of each key (int64), vectorised."""
        return self.owners[vshards_of(keys, self.vshards)]

    def group(
        self, keys: np.ndarray, *, dedup: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Group ``keys`` by owner rank, deduplicated (compiled; as ``group_by_server``) or
        as they are (``dedup=False``: as ``route_by_server``)."""
        group = group_by_table if dedup else route_by_table
        return group(keys, len(self.endpoints), self.owners)

    def moves(self, new: Placement) -> dict[tuple[int, int], np.ndarray]:
        """``(from_rank, to_rank) -> virtual shards`` that change owner from self to new."""
        if new.vshards != self.vshards:
            raise InputError(f"Placement.moves: {self.vshards} vs {new.vshards} virtual shards "
                             "(fixed for the life of a job)")  # fmt: skip
        changed = np.flatnonzero(self.owners != new.owners)
        out: dict[tuple[int, int], np.ndarray] = {}
        if not changed.size:
            return out
        pairs = self.owners[changed] * len(new.endpoints) + new.owners[changed]
        for pair in np.unique(pairs):
            src, dst = divmod(int(pair), len(new.endpoints))
            out[(src, dst)] = changed[pairs == pair]
        return out

    def to_wire(self) -> tuple[dict, np.ndarray]:
        return {"version": self.version, "endpoints": list(self.endpoints)}, self.owners

    @classmethod
    def from_wire(cls, args: dict, owners: np.ndarray) -> Placement:
        return cls(int(args["version"]), tuple(args["endpoints"]), np.array(owners, np.int64))


def rebalance(placement: Placement, ranks: Sequence[int],
              endpoints: Sequence[str] | None = None) -> Placement:  # fmt: skip
    """The next placement over ``ranks``, moving as few virtual shards as possible.

    Args:
        placement: the current placement.
        ranks: the ranks that own shards afterwards (new ones own none yet).
        endpoints: the endpoint list afterwards (must extend the current one: a rank
            keeps its address); default: the current list.

    Returns:
        A placement with ``version + 1``: every rank owns ``V // n`` or ``V // n + 1``
        shards; a rank keeps its own shards up to its quota.
    """
    endpoints = tuple(placement.endpoints if endpoints is None else endpoints)
    if endpoints[: len(placement.endpoints)] != placement.endpoints:
        raise InputError("rebalance: the new endpoint list must extend the current one "
                         f"({placement.endpoints} -> {endpoints})")  # fmt: skip
    ranks = sorted(set(int(r) for r in ranks))
    if not ranks or ranks[0] < 0 or ranks[-1] >= len(endpoints):
        raise InputError(
            f"rebalance: ranks {ranks} must be non-empty ranks of {len(endpoints)} endpoints"
        )
    owners = placement.owners.copy()
    V, n = owners.size, len(ranks)
    counts = {r: int(np.count_nonzero(owners == r)) for r in ranks}
    # the ranks holding most keep the +1 quotas: fewer moves
    by_size = sorted(ranks, key=lambda r: (-counts[r], r))
    quota = {r: V // n + (1 if i < V % n else 0) for i, r in enumerate(by_size)}
    pool = [np.flatnonzero(~np.isin(owners, ranks))]
    for r in ranks:
        mine = np.flatnonzero(owners == r)
        if mine.size > quota[r]:
            pool.append(mine[quota[r] :])
    free = np.sort(np.concatenate(pool))
    at = 0
    for r in ranks:
        need = quota[r] - counts[r]
        if need > 0:
            owners[free[at : at + need]] = r
            at += need
    return Placement(placement.version + 1, endpoints, owners)
