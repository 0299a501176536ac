"""What one copy of a replicated shard does to let a replacement server join it.

A lost server's replacement starts with its shards *recovering* (it refuses every client
request with :class:`~sparseps.core.replicas.RecoveringError`) and copies each of them
from a surviving copy (:mod:`sparseps.server.recovery`):

1. ``replicate`` (to the survivor): the survivor *pauses* the shard's writes (new ones
   are refused with :class:`~sparseps.core.replicas.ShardBusyError`, which clients send
   again a moment later; writes already running finish first), saves every table of the
   shard into the given folder with the ordinary save code, and answers each table's
   config and file records, the updates it has applied (``(client, seq)``, so a retry
   of an old write is not applied twice on the new copy) and the shard's next epoch.
2. The replacement loads the files, takes the applied updates and the epoch, and its
   copy is in sync: no write was applied anywhere since the save.
3. ``replicate_done`` (to the survivor): the survivor moves to the new epoch with the
   replacement among the shard's copies, and resumes writes.

Every write of a replicated job carries the sender's epoch of the shard; a copy on a
later epoch refuses it with :class:`~sparseps.core.replicas.StaleEpochError`, and the
client asks ``shard_info`` (the epoch and the copies), reconnects to the new copy and
sends the write to every copy again (same ``seq``: applied once each). So from the new
epoch on, no write reaches one copy without the other.

A survivor whose replacement never says ``replicate_done`` (it died while copying)
resumes by itself after :data:`PAUSE_LIMIT_S`, on its old epoch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext

from ..core.replicas import RecoveringError, ShardBusyError, StaleEpochError, chain
from ..errors import InputError
from ..rpc.ops import SHARD_WRITE_OPS
from ..rpc.protocol import Request
from .applied import AppliedUpdates

__all__ = ["PAUSE_LIMIT_S", "ReplicaOps"]

log = logging.getLogger(__name__)

# Longest a survivor stays paused for a replacement that does not finish its copy.
PAUSE_LIMIT_S = 120.0
# Writes already running when a pause starts get this long to finish.
_DRAIN_S = 30.0


# Ops every copy answers, recovering or not (the replication protocol's own, and liveness).
_ALWAYS_ADMITTED = frozenset({"shard_info", "replicate", "replicate_done", "ping", "stop", "stats"})
_LET_THROUGH = nullcontext()


class ReplicaOps:
    """The copy-of-a-shard side of replication, mixed into
    :class:`~sparseps.server.handlers.ServerState` (needs ``rank``, ``num_servers``,
    ``replicas``, ``_sparse``, ``_dense``, ``_applied`` and the op handlers)."""

    rank: int
    holder: int
    num_servers: int
    replicas: int
    _sparse: dict
    _dense: dict
    _applied: AppliedUpdates
    _ops: dict[str, Callable[[Request], tuple[object, list]]]

    def _init_replica(self, replicas: int, *, recovering: bool) -> None:
        self.epoch = 0
        self.members = chain(self.rank, self.num_servers, replicas) if replicas else (self.rank,)
        self.recovering = recovering
        self._gate = threading.Condition()
        self._writing = 0
        self._paused_until: float | None = None

    # -- admission ---------------------------------------------------------------------

    def admitted(self, request: Request) -> AbstractContextManager[None]:
        """Run ``request`` if this copy may: refuse it while recovering, a write from an
        older epoch, or a write while paused for a replacement. An op let through as it
        is gets a shared no-op context (every pull passes here: no generator per call)."""
        if request.op in _ALWAYS_ADMITTED:
            return _LET_THROUGH
        if self.recovering:
            raise RecoveringError(
                f"server {self.rank}: shard {self.rank} is still being copied to this "
                "replacement server; use another copy"
            )
        if request.op not in SHARD_WRITE_OPS:
            return _LET_THROUGH
        return self._writing_to_shard(request)

    @contextmanager
    def _writing_to_shard(self, request: Request):
        """A write of this shard, counted while it runs (a replacement's copy waits for
        the count to drop); refused from an older epoch or while paused."""
        with self._gate:
            if request.epoch is not None and request.epoch < self.epoch:
                raise StaleEpochError(
                    f"shard {self.rank} is at epoch {self.epoch} (copies on servers "
                    f"{list(self.members)}), the request at {request.epoch}; refresh with shard_info"
                )
            if self._paused():
                raise ShardBusyError(
                    f"shard {self.rank} is paused while a replacement server copies it; send again"
                )
            self._writing += 1
        try:
            yield
        finally:
            with self._gate:
                self._writing -= 1
                self._gate.notify_all()

    def _paused(self) -> bool:
        if self._paused_until is None:
            return False
        if time.monotonic() < self._paused_until:
            return True
        log.warning(
            "server copy of shard %d: the replacement did not finish its copy within %.0f s; "
            "writes resume on epoch %d", self.rank, PAUSE_LIMIT_S, self.epoch,
        )  # fmt: skip
        self._paused_until = None
        return False

    # -- ops ---------------------------------------------------------------------------

    def _op_shard_info(self, request: Request):
        return {
            "shard": self.rank,
            "epoch": self.epoch,
            "members": list(self.members),
            "recovering": self.recovering,
        }, []

    def _op_replicate(self, request: Request):
        """Pause writes, save the shard into ``directory`` for server ``rank``."""
        folder, joiner = request.args["directory"], request.args["rank"]
        if joiner not in chain(self.rank, self.num_servers, self.replicas):
            raise InputError(
                f"replicate: server {joiner} holds no copy of shard {self.rank} "
                f"(its copies: {list(chain(self.rank, self.num_servers, self.replicas))})"
            )
        with self._gate:
            self._paused_until = time.monotonic() + PAUSE_LIMIT_S
            drained = self._gate.wait_for(lambda: not self._writing, timeout=_DRAIN_S)
        if not drained:
            with self._gate:
                self._paused_until = None
            raise ShardBusyError(f"shard {self.rank}: writes did not finish within {_DRAIN_S} s")
        started = time.perf_counter()
        tables: dict[str, dict] = {}
        for name, entry in list(self._sparse.items()):
            save = Request(op="save", id=0, table=name, bufs={}, args={"directory": folder})
            files = self._ops["save"](save)[0]
            tables[name] = {"config": entry.table.config.to_dict(), "files": files}
        dense = {}
        for name, entry in list(self._dense.items()):
            where = os.path.join(folder, "dense", name)
            save = Request(op="save_dense", id=0, table=name, bufs={}, args={"directory": where})
            dense[name] = {"spec": entry.spec, "file": self._ops["save_dense"](save)[0]}
        log.info(
            "server copy of shard %d: paused and saved %d table(s) and %d dense table(s) in "
            "%.2f s for server %d", self.rank, len(tables), len(dense),
            time.perf_counter() - started, joiner,
        )  # fmt: skip
        applied = self._applied.export()
        return {
            "tables": tables,
            "dense": dense,
            "applied": applied,
            "epoch": self.epoch + 1,
        }, []

    def _op_replicate_done(self, request: Request):
        """Server ``rank`` holds the copy saved by ``replicate``: move to ``epoch`` with it
        among the copies, and resume writes."""
        joiner, epoch = request.args["rank"], request.args["epoch"]
        with self._gate:
            self.epoch = max(self.epoch, epoch)
            order = chain(self.rank, self.num_servers, self.replicas)
            self.members = tuple(r for r in order if r in {*self.members, joiner})
            self._paused_until = None
        log.info(
            "server copy of shard %d: server %d joined; epoch %d, copies on servers %s",
            self.rank, joiner, self.epoch, list(self.members),
        )  # fmt: skip
        return {"epoch": self.epoch}, []

    def join(self, info: dict, server: int) -> None:
        """Take the epoch and copies of a ``replicate`` answer and start serving (this copy
        holds the shard now). ``server``: the survivor that was copied."""
        with self._gate:
            self.epoch = info["epoch"]
            order = chain(self.rank, self.num_servers, self.replicas)
            self.members = tuple(r for r in order if r in {server, self.holder})
            self.recovering = False
