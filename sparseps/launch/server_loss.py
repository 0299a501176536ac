"""What a launcher does when one of its servers exits while the job runs, with replicas.

Without replicas every server exit fails the job (:mod:`sparseps.launch.supervisor`). With
``--replicas R`` a lost server is tolerated while every shard of the job keeps a live copy
(the clients route around it, :mod:`sparseps.core.replicas`), and, while ``max_restarts``
allows, replaced: a new server on its rank and port copies its shards from the survivors
(``SPARSEPS_RECOVER=1``, :mod:`sparseps.server.recovery`). The loss that leaves a shard
without a copy fails the job, naming every lost server.

Kept apart from the supervisor's loop because it is a policy of its own (which losses a
job survives, how many replacements it gets) with state of its own (the lost ranks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from ..env import RECOVER, Role
from .children import Child
from .records import LOST_SHARD_NOTE, ChildSpec

__all__ = ["ServerLoss"]

log = logging.getLogger(__name__)


class ServerLoss:
    """The servers a replicated job lost and the replacements it started.

    Args:
        replicas: copies kept of every shard besides its primary (0: no tolerance).
        server_num: the job's servers.
        max_replacements: replacement servers this launcher may start (``--max-restarts``).
        replace_server: starts a replacement from the lost server's spec (its attempt
            number is the replacement's count) and makes it one of the running children.
    """

    def __init__(self, replicas: int, server_num: int, max_replacements: int,
                 replace_server: Callable[[Child, ChildSpec, int], None]) -> None:  # fmt: skip
        self.replicas, self.server_num = replicas, server_num
        self.max_replacements = max_replacements
        self._replace_server = replace_server
        # ranks of servers lost and tolerated: left out of the final stop
        self.lost: set[int] = set()
        self.replacements = 0

    def tolerated(self, server: Child) -> bool:
        """Whether the job goes on without this exited server; sets ``server.note`` when a
        shard is left without a copy (the job fails, and the note says which)."""
        replicas, num = self.replicas, self.server_num
        rank = server.spec.rank
        if not replicas or server.spec.role is not Role.SERVER:
            return False
        if rank in self.lost:
            return True
        from ..core.replicas import chain

        lost = {*self.lost, rank}
        orphans = [s for s in range(num) if all(r in lost for r in chain(s, num, replicas))]
        if orphans:
            server.note = LOST_SHARD_NOTE.format(
                shards=", ".join(map(str, orphans)),
                lost=", ".join(f"server {r}" for r in sorted(lost)),
                replicas=replicas,
            )
            return False
        self.lost.add(rank)
        server.pump.join(timeout=2.0)
        log.error(
            "server %d (pid %d) exited with code %s: LOST; its shards are served by their "
            "copies (replicas=%d; lost servers: %s); the job goes on with fewer copies",
            rank, server.proc.pid, server.exit_code, replicas,
            ", ".join(map(str, sorted(self.lost))),
        )  # fmt: skip
        if self.replacements < self.max_replacements:
            self.replacements += 1
            self.lost.discard(rank)
            log.warning(
                "starting a replacement for server %d (replacement %d of %d, --max-restarts): "
                "it copies its shards from the survivors while training goes on",
                rank, self.replacements, self.max_replacements,
            )  # fmt: skip
            spec = replace(server.spec, env={**server.spec.env, RECOVER: "1"})
            self._replace_server(server, spec, self.replacements)
        return True
