"""The servers as processes, through :class:`~sparseps.rpc.client.PSClient`.

Calls about the servers rather than a table's data, each one request per server:

- ``ping``: is each server up, and is it the rank (and server count) this client thinks?
  A client given another job's or an out-of-order endpoint list fails here, at once,
  instead of routing keys to the wrong servers.
- ``stats``: each server's figures and totals over the job, each shard counted once
  (from its acting primary with replicas) so that copies do not double the rows.
- ``replica_status``: what each live copy of each shard reports (epoch, members).
- ``stop_servers``: ask servers to exit.

Which servers a call goes to is the client's router's answer (every server the client
does not count as lost; in an elastic job, the live servers of its placement).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .handle import Handle

if TYPE_CHECKING:
    from .channel import Channel
    from .router import Router
    from .shard_views import ShardViews

__all__ = ["each_server", "ping", "replica_status", "stats"]

# per-table figures PSClient.stats() sums over servers
_TABLE_TOTALS = ("rows", "pending", "bytes_used", "memory_rows", "disk_rows")


def each_server(channel: Channel, ranks: Sequence[int], op: str,
                timeout: float | None = None) -> list:  # fmt: skip
    """Send ``op`` to every server of ``ranks`` and wait for all results."""
    calls = [channel.submit(rank, op, None, (), None) for rank in ranks]
    return Handle(channel, calls, lambda replies: [r.result for r in replies]).wait(timeout)


def ping(router: Router, channel: Channel, num_servers: int, timeout: float | None,
         ranks: Sequence[int] | None) -> list[dict]:  # fmt: skip
    placed = router.placement is not None
    if ranks is None:
        ranks = router.server_ranks() if placed else list(range(num_servers))
    ranks = list(ranks)
    answers = each_server(channel, ranks, "ping", timeout)
    for rank, answer in zip(ranks, answers, strict=True):
        if placed:  # a placement names every server; new ones list more
            if answer.get("rank") != rank:
                raise ConfigError(f"server at {channel.endpoints[rank]} is rank "
                                  f"{answer.get('rank')}, its placement says {rank}")  # fmt: skip
            continue
        if answer.get("rank") != rank or answer.get("num_servers") != num_servers:
            raise ConfigError(
                f"server at {channel.endpoints[rank]} is rank {answer.get('rank')} of "
                f"{answer.get('num_servers')}, but this client lists it as rank {rank} of "
                f"{num_servers}; use the servers' endpoint list"
            )
    return answers


def stats(router: Router, channel: Channel, num_servers: int) -> dict:
    servers = each_server(channel, router.server_ranks(), "stats")
    total: dict = {"tables": {}, "requests": 0, "bad_messages": 0, "failed": 0, "duplicates": 0}
    for server in servers:
        for key in ("requests", "bad_messages", "failed", "duplicates"):
            total[key] += server.get(key, 0)
    by_rank = {server["rank"]: server for server in servers}
    for shard, copies in router.shard_holders():
        # a shard counts once, from its head (the first live copy of its view)
        holder = next((r for r in copies if r in by_rank), None)
        if holder is None:
            continue
        server = by_rank[holder]
        tables = server["tables"] if holder == shard else server["backups"][str(shard)]
        for name, table in tables.items():
            agg = total["tables"].setdefault(name, dict.fromkeys(_TABLE_TOTALS, 0))
            for key in agg:
                agg[key] += int(table.get(key, 0))
    lost = [rank for rank in range(num_servers) if channel.lost(rank) is not None]
    return {"servers": servers, "total": total, "lost": lost}


def replica_status(channel: Channel, views: ShardViews, replicas: int,
                   num_servers: int) -> list[dict]:  # fmt: skip
    out = []
    for shard in range(num_servers):
        ranks = [r for r in views.chain(shard) if channel.lost(r) is None] if replicas else [shard]
        calls = [
            channel.submit(rank, "shard_info", None, shard=None if rank == shard else shard)
            for rank in ranks
        ]
        answers = Handle(channel, calls, lambda replies: [r.result for r in replies]).wait()
        copies = [{"rank": rank, **answer} for rank, answer in zip(ranks, answers, strict=True)]
        out.append({"shard": shard, "copies": copies})
    return out
