"""The servers as processes, through :class:`~sparseps.rpc.client.PSClient`.

Calls about the servers rather than a table's data, each one request per server:

- ``ping``: is each server up, and is it the rank (and server count) this client thinks?
  A client given another job's or an out-of-order endpoint list fails here, at once,
  instead of routing keys to the wrong servers.
- ``stats``: each server's figures and totals over the job, each shard counted once
  (from its acting primary with replicas) so that copies do not double the rows.
- ``replica_status``: what each live copy of each shard reports (epoch, members).
- ``stop_servers``: ask servers to exit.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError
from .client_parts import ClientParts
from .handle import Handle

__all__ = ["ClientCluster"]

# per-table figures PSClient.stats() sums over servers
_TABLE_TOTALS = ("rows", "pending", "bytes_used", "memory_rows", "disk_rows")


class ClientCluster(ClientParts):
    """The per-server calls, mixed into :class:`~sparseps.rpc.client.PSClient`."""

    def ping(
        self, timeout: float | None = None, *, ranks: Sequence[int] | None = None
    ) -> list[dict]:
        """Each server's ``{"rank", "num_servers", "pid", "v"}``; checks they match this client.

        Args:
            timeout: seconds (default the client's timeout).
            ranks: only these servers (default all).

        Raises:
            ConfigError: a server has another rank or server count than this client expects.
        """
        elastic = self._table_ranks()
        if ranks is None:
            ranks = list(range(self.num_servers)) if elastic is None else elastic
        ranks = list(ranks)
        answers = self._all("ping", timeout=timeout, ranks=ranks)
        for rank, answer in zip(ranks, answers, strict=True):
            if elastic is not None:  # a placement names every server; new ones list more
                if answer.get("rank") != rank:
                    raise ConfigError(f"server at {self._channel.endpoints[rank]} is rank "
                                      f"{answer.get('rank')}, its placement says {rank}")  # fmt: skip
                continue
            if answer.get("rank") != rank or answer.get("num_servers") != self.num_servers:
                raise ConfigError(
                    f"server at {self.endpoints[rank]} is rank {answer.get('rank')} of {answer.get('num_servers')}, "
                    f"but this client lists it as rank {rank} of {self.num_servers}; use the servers' endpoint list"
                )
        return answers

    def stats(self) -> dict:
        """Per-server statistics and totals.

        Returns:
            ``{"servers": [per-server dict: rank, address, pid, tables {name: TableStats
            fields}, dense, requests, bad_messages, failed, duplicates, peak_rss_bytes],
            "total": {"tables": {name: {"rows", "pending", "bytes_used", "memory_rows",
            "disk_rows"}}, "requests", "bad_messages", "failed", "duplicates"}, "lost":
            [ranks of lost servers]}`` (``duplicates``: updates sent again and applied only
            once). With replicas each server also reports ``backups`` ({shard: tables});
            the totals count each shard once, from its acting primary.
        """
        servers = self._all("stats")
        total: dict = {"tables": {}, "requests": 0, "bad_messages": 0, "failed": 0, "duplicates": 0}
        for server in servers:
            for key in ("requests", "bad_messages", "failed", "duplicates"):
                total[key] += server.get(key, 0)
        by_rank = {server["rank"]: server for server in servers}
        elastic = self._table_ranks()
        for shard in range(self.num_servers) if elastic is None else elastic:
            # a shard counts once, from its head (the first live copy of its view)
            copies = (shard,) if elastic is not None else self.views.members(shard)
            holder = next((r for r in copies if r in by_rank), None)
            if holder is None:
                continue
            server = by_rank[holder]
            tables = server["tables"] if holder == shard else server["backups"][str(shard)]
            for name, table in tables.items():
                agg = total["tables"].setdefault(name, dict.fromkeys(_TABLE_TOTALS, 0))
                for key in agg:
                    agg[key] += int(table.get(key, 0))
        lost = [rank for rank in range(self.num_servers) if self._channel.lost(rank) is not None]
        return {"servers": servers, "total": total, "lost": lost}

    def replica_status(self) -> list[dict]:
        """Per shard, what each copy this client reaches reports: ``{"shard", "copies":
        [{"rank", "epoch", "members", "recovering", "index"}, ...]}`` (in chain order; one
        copy without replicas). ``members`` is that copy's view, head first; ``index`` the
        writes it applied."""
        out = []
        for shard in range(self.num_servers):
            ranks = (
                [r for r in self.views.chain(shard) if self._channel.lost(r) is None]
                if self.replicas
                else [shard]
            )
            calls = [
                self._channel.submit(
                    rank, "shard_info", None, shard=None if rank == shard else shard
                )
                for rank in ranks
            ]
            answers = Handle(
                self._channel, calls, lambda replies: [r.result for r in replies]
            ).wait()
            copies = [{"rank": rank, **answer} for rank, answer in zip(ranks, answers, strict=True)]
            out.append({"shard": shard, "copies": copies})
        return out

    def stop_servers(
        self, timeout: float | None = None, *, ranks: Sequence[int] | None = None
    ) -> None:
        """Ask every server (or ``ranks``) to stop; each replies, then exits."""
        self._all("stop", timeout=timeout, ranks=ranks)
