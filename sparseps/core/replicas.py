"""Where the copies of each shard live when a job keeps replicas (``--replicas R``).

Keys route to shards exactly as without replicas (:func:`sparseps.core.routing.server_of`:
shard ``s`` is what server ``s`` owns), so checkpoints, inference saves and any server
count stay compatible. With ``R`` replicas, shard ``s`` has ``R + 1`` copies, on the
servers of its *chain*::

    chain(s) = [s, s + 1, ..., s + R]   (mod S)

The copies of a shard form a chain in the order of their *view* (the chain's order at the
start; a replacement joins at its end): the first live copy is the shard's *head*, which
takes every write, orders it and passes it down the chain (:mod:`sparseps.server.shard_chain`).
Server ``r`` therefore
holds its own shard and backups of the ``R`` shards before it: ``hosted(r) = [r, r - 1,
..., r - R]``. One copy per server per shard keeps ``R < S``: a lost server costs each
shard at most one copy.
"""

from __future__ import annotations

from ..errors import ConfigError, SparsePSError

__all__ = [
    "ChainGapError",
    "NotHeadError",
    "RecoveringError",
    "ReplicaRefusal",
    "ShardBusyError",
    "StaleEpochError",
    "chain",
    "check_replicas",
    "hosted",
]


def check_replicas(replicas: int, num_servers: int, *, where: str = "replicas") -> int:
    """``replicas`` validated against the server count.

    Raises:
        ConfigError: not an int in ``0..num_servers - 1``.
    """
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise ConfigError(
            f"{where}: must be an int >= 0 (backup copies per shard), got {replicas!r}"
        )
    if replicas >= num_servers:
        raise ConfigError(
            f"{where}={replicas} needs at least {replicas + 1} servers (each copy of a shard on "
            f"its own server), the job has {num_servers}; lower the replicas or add servers"
        )
    return replicas


def chain(shard: int, num_servers: int, replicas: int) -> tuple[int, ...]:
    """The servers holding ``shard``, primary first."""
    return tuple((shard + i) % num_servers for i in range(replicas + 1))


def hosted(rank: int, num_servers: int, replicas: int) -> tuple[int, ...]:
    """The shards server ``rank`` holds: its own first, then the ones it backs up."""
    return tuple((rank - i) % num_servers for i in range(replicas + 1))


class ReplicaRefusal(SparsePSError):
    """A copy of a shard refused a request for a replication reason; the client acts on
    the type's name (it arrives as a :class:`~sparseps.errors.RemoteError`)."""


class ShardBusyError(ReplicaRefusal):
    """The copy is paused while a replacement server copies it: send the write again."""


class StaleEpochError(ReplicaRefusal):
    """The shard's copies changed (a replacement joined): refresh with ``shard_info``."""


class RecoveringError(ReplicaRefusal):
    """This copy is still being copied from a survivor: use another copy."""


class NotHeadError(ReplicaRefusal):
    """This copy does not take writes for the shard (its head is another, live copy):
    refresh the view with ``shard_info`` and send to the head."""


class ChainGapError(ReplicaRefusal):
    """A write passed down a shard's chain skipped some earlier one: the sender passes on
    again every write this copy has not acknowledged."""
