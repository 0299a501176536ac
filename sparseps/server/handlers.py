"""What a server does with each validated request: the op table and the state it runs on.

:class:`ServerState` is one copy of a shard: this server's shard of every sparse table
and the dense tables placed on it. Requests arrive already validated by
:func:`sparseps.rpc.protocol.decode_request` against their op's schema
(:data:`sparseps.rpc.ops.OPS`: types, dtypes, shapes); :meth:`ServerState.handle` refuses
another job's request, keeps updates once-only (:mod:`sparseps.server.applied`) and, with
replicas, passes writes down the shard's chain (:mod:`sparseps.server.shard_chain`); then
the op table (:func:`op_table`, at the end of this module) names the code that answers
each op. The state is held in parts, one concept each:

- ``sparse`` / ``dense``: the tables by name, each with its lock (:mod:`.entries`);
- ``sparse_ops``: create, pull, prefetch, push, decay, shrink (:mod:`.sparse_ops`);
- ``rows``: GPUPS' whole rows (:mod:`.row_ops`); ``dense_ops``: the dense tables'
  ops (:mod:`.dense_ops`); ``files``: saves and loads (:mod:`.file_ops`);
- ``ownership``: which keys are this server's (:mod:`.ownership`); ``elastic``: an
  elastic job's placement and moves of virtual shards (:mod:`sparseps.elastic.server_moves`);
- ``chain``: this copy's place in its shard's chain of copies (:mod:`.shard_chain`);
  ``backups``: the other shards' copies this server holds, each a ServerState.

Concurrency: data-plane ops run in the server's request loop, long ops on a pool of
threads (:mod:`sparseps.server.loop`). Each table has a reader-writer lock: pulls, stats
and the export part of a save share it; pushes, decay, shrink and loads hold it alone, so
updates of one table are serialised while pulls and other tables proceed; the compiled
kernels release the GIL.
Requests that are in flight at the same time are not ordered with respect to each
other; a client that needs an order waits for the first handle before sending the next.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..core.closing import Closing
from ..core.replicas import check_replicas, hosted
from ..elastic.server_moves import ElasticMoves
from ..errors import ProtocolError
from ..rpc.ops import OPS, UPDATE_OPS, OpSchema
from ..rpc.protocol import PROTOCOL_VERSION, Request
from .applied import AppliedUpdates
from .dense_ops import DenseOps
from .disk_dir import DiskDir
from .entries import Answer, Tables
from .file_guard import FILE_ARGS, FileGuard
from .file_ops import ShardFiles
from .heap import return_large_frees
from .log_budget import LogBudget
from .ownership import KeyOwnership
from .prefetch import RowPrefetcher
from .relay import Relay, Route
from .reply_segments import ReplySegments
from .row_ops import WholeRows
from .shard_chain import ShardChain
from .sparse_ops import SparseOps

if TYPE_CHECKING:
    from ..rpc.channel import Channel
    from ..table import DenseTable, SparseTable

__all__ = ["Op", "RequestCounters", "ServerState", "op_table"]

# Ops about the server process, not one of its shards.
_SERVER_OPS = frozenset({"ping", "stop", "stats", "attach_replies"})

# An op's handler: the validated request -> (the reply's result, its buffers).
Handler = Callable[[Request], Answer]


@dataclasses.dataclass(frozen=True)
class Op:
    """One entry of the op table: the op, what its requests and answers hold (checked by
    the protocol before the handler runs, and by the client on the answer), and the code
    that answers it."""

    name: str
    schema: OpSchema
    handler: Handler


class RequestCounters:
    """The requests a server copy answered, refused as malformed, failed, or found to be
    repeats of an update applied before (the ``stats`` op reports them)."""

    def __init__(self) -> None:
        self._counts = {"requests": 0, "bad_messages": 0, "failed": 0, "duplicates": 0}
        self._lock = threading.Lock()

    def add(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class ServerState(Closing):
    """One copy of a shard: its tables, the parts that answer ops on them, and the op table.

    Args:
        rank: this server's rank.
        num_servers: servers in the job (the key routing depends on it).
        endpoint: ``host:port`` as the workers know it (for stats and errors).
        job_id: the job this server belongs to; requests of another job, or without a
            job id, are refused. None (servers started by hand or by tests) accepts any.
        file_roots: folders the file ops may use (see :mod:`sparseps.server.file_guard`);
            None accepts any absolute path.
        disk_dir: the folder for the rows of tables with ``memory_rows`` beyond that
            budget (:mod:`sparseps.server.disk_dir`); None: such tables are refused.
        replicas: backup copies per shard in the job (:mod:`sparseps.core.replicas`): this
            server also holds the shards ``rank - 1 .. rank - replicas``, each in a
            :class:`ServerState` of its own that requests reach with the header's ``shard``.
        recovering: a replacement server: every shard it holds refuses requests until
            :mod:`sparseps.server.recovery` has copied it from a survivor.
        holder: the rank of the server process holding this copy (default ``rank``).
    """

    def __init__(
        self,
        rank: int,
        num_servers: int,
        endpoint: str,
        *,
        job_id: str | None = None,
        file_roots: Sequence[str] | None = None,
        disk_dir: str | None = None,
        replicas: int = 0,
        recovering: bool = False,
        holder: int | None = None,
    ) -> None:
        self.rank = rank
        self.holder = rank if holder is None else holder  # the server process's rank
        self.replicas = check_replicas(replicas, num_servers)
        self.num_servers = num_servers
        self.endpoint = endpoint
        self.job_id = job_id
        self.file_guard = FileGuard(file_roots, rank)
        self.disk_dir = None if disk_dir is None else DiskDir(disk_dir, rank)
        if disk_dir is not None:  # tables with a memory budget: freed scratch goes back
            return_large_frees()
        self.applied = AppliedUpdates()
        self.log_budget = LogBudget(logging.getLogger("sparseps.server.loop"))
        self.stop_requested = threading.Event()
        self.counters = RequestCounters()
        self.prefetcher = RowPrefetcher(self.log_budget)
        # same-host clients' reply slots: the server process's (a backup's are unused)
        self.replies = ReplySegments(self.holder)
        # the tables and the parts that answer ops on them
        self.sparse: Tables[SparseTable] = Tables(
            rank, "sparse table", listed_as="tables", created_by="PSClient.create_table"
        )
        self.dense: Tables[DenseTable] = Tables(
            rank, "dense table", listed_as="dense tables", created_by="PSClient.create_dense"
        )
        self.elastic = ElasticMoves(rank, self.replicas, self.sparse)
        self.ownership = KeyOwnership(rank, num_servers, self.elastic)
        self.sparse_ops = SparseOps(
            self.sparse, self.ownership, elastic=self.elastic, prefetcher=self.prefetcher,
            disk_dir=self.disk_dir,
        )  # fmt: skip
        self.rows = WholeRows(self.sparse, self.ownership)
        self.dense_ops = DenseOps(self.dense)
        self.files = ShardFiles(
            self.sparse, self.dense, self.ownership, elastic=self.elastic, num_servers=num_servers
        )
        # this copy's place in its shard's chain of copies (replicas; sparseps.server.shard_chain)
        self.chain = ShardChain(
            rank, self.holder, num_servers, self.replicas, recovering=recovering
        )
        self.ops = op_table(self)
        # shard -> its copy on this server (the backups; own shard: self)
        self.backups: dict[int, ServerState] = {}
        # the server process's own state holds its backups (a backup holds none)
        backed_up = hosted(rank, num_servers, self.replicas)[1:] if holder is None else ()
        for shard in backed_up:
            # its own disk subfolder: server `shard` may use the same --disk-dir on this host
            folder = None if disk_dir is None else os.path.join(disk_dir, f"backups-on-{rank}")
            self.backups[shard] = ServerState(
                shard, num_servers, endpoint, job_id=job_id, file_roots=file_roots,
                disk_dir=folder, replicas=self.replicas, recovering=recovering, holder=rank,
            )  # fmt: skip

    def attach_chain(self, peers: Channel, relay: Relay | None) -> None:
        """Connect every copy this server holds to the other servers (a replicated job's
        server process, once its sockets exist)."""
        for copy in [self, *self.backups.values()]:
            copy.chain.attach(peers, relay)

    def stop_chains(self) -> None:
        """Stop passing writes down the shards' chains (at stop, before the peers close)."""
        for copy in [self, *self.backups.values()]:
            copy.chain.stop()

    def close(self) -> None:
        """Delete the tiered tables' disk files and release the disk dir (at stop, once no
        handler runs: the tables must not be used afterwards)."""
        for backup in self.backups.values():
            backup.close()
        self.prefetcher.stop()
        self.replies.close()
        for _, entry in self.sparse.items():
            entry.table.close()
        if self.disk_dir is not None:
            self.disk_dir.close()

    # -- requests ----------------------------------------------------------------------

    def count(self, what: str) -> None:
        self.counters.add(what)

    def check_job(self, request: Request) -> None:
        """Refuse a request of another job (a leftover process on a reused port).

        Raises:
            ProtocolError: the request's job id is not this server's.
        """
        if self.job_id is None or request.job == self.job_id:
            return
        sender = "carries no job id" if request.job is None else f"comes from job {request.job!r}"
        raise ProtocolError(
            f"{request.op} {request.table!r} {sender}, but server {self.rank} at {self.endpoint} "
            f"belongs to job {self.job_id!r}; a process of another job (or a tool started "
            "without PSClient(job_id=...)) reached this port: stop it, or pass this job's id"
        )

    def handle(
        self, request: Request, route: Route | None = None
    ) -> tuple[object, list[np.ndarray]] | None:
        """Run one request; returns ``(result, buffers)`` for the reply. Raises on failure.

        An update that carries ``(client, seq)`` is applied once: a repeat (a retry after
        a timeout) is answered ``{"duplicate": True}`` without touching the table.

        With replicas a write is answered once the shard's other copies have it
        (:mod:`sparseps.server.shard_chain`): with a ``route`` the answer may leave later
        through the server's relay, and this returns None; without one it waits.
        """
        if request.shard is not None and request.shard != self.rank:
            return self._backup_of(request).handle(request, route)
        self.count("requests")
        self.check_job(request)
        if not self.replicas:
            return self._run_once(request)[:2]
        return self.chain.handle(request, route, self._run_once)

    def _run_once(self, request: Request) -> tuple[object, list[np.ndarray], bool]:
        """``(result, buffers, applied now)``: False for an update applied before."""
        handler = self.ops[request.op].handler
        if request.op in FILE_ARGS:
            self.file_guard.check(request)
            with self.file_guard.writing(request):
                return (*handler(request), True)
        if request.seq is None or request.op not in UPDATE_OPS:
            return (*handler(request), True)
        client = request.client
        assert client is not None, "decode_request takes client and seq together"
        if not self.applied.begin(client, request.seq):
            self.count("duplicates")
            return {"duplicate": True}, self.dense_ops.read_back(request), False
        try:
            return (*handler(request), True)
        except BaseException:
            self.applied.failed(client, request.seq)
            raise

    def _backup_of(self, request: Request) -> ServerState:
        backup = self.backups.get(request.shard)  # type: ignore[arg-type]
        if backup is None or request.op in _SERVER_OPS:
            self.count("bad_messages")
            held = ", ".join(str(s) for s in (self.rank, *self.backups))
            raise ProtocolError(
                f"{request.op} for shard {request.shard}: server {self.rank} holds shards {held}"
                + (" (a per-server op takes no shard)" if backup is not None else "")
                + "; the client's --replicas must equal the servers'"
            )
        return backup

    # -- the server process ------------------------------------------------------------------------

    def ping(self, request: Request) -> Answer:
        return {
            "rank": self.rank,
            "num_servers": self.num_servers,
            "shards": [self.rank, *self.backups],
            "pid": os.getpid(),
            "v": PROTOCOL_VERSION,
        }, []

    def attach_replies(self, request: Request) -> Answer:
        return self.replies.attach(request.args["slots"], request.args["slot_bytes"]), []

    def stop(self, request: Request) -> Answer:
        self.stop_requested.set()
        return {"rank": self.rank}, []

    def stats(self, request: Request) -> Answer:
        counters = self.counters.snapshot()
        for backup in self.backups.values():  # one process: its counters are the sum
            for key, value in backup.counters.snapshot().items():
                counters[key] += value
        return {
            "rank": self.rank,
            "address": self.endpoint,
            "pid": os.getpid(),
            # the process's peak resident memory so far (Linux reports kilobytes)
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "tables": self.table_stats(),
            "dense": {
                name: {"size": entry.spec["size"], "rule": entry.spec["rule"]}
                for name, entry in self.dense.items()
            },
            "prefetch": dict(self.prefetcher.counts),
            # shard -> its tables' stats, for the shards this server backs up
            "backups": {str(shard): backup.table_stats() for shard, backup in self.backups.items()},
            **counters,
        }, []

    def table_stats(self) -> dict[str, dict]:
        """Each sparse table's :class:`~sparseps.table.TableStats` as a dict."""
        tables = {}
        for name, entry in self.sparse.items():
            with entry.lock.read():
                tables[name] = dataclasses.asdict(entry.table.stats())
        return tables

    # -- replication (sparseps.server.shard_chain) ---------------------------------------

    def shard_info(self, request: Request) -> Answer:
        return self.chain.info(), []

    def replicate(self, request: Request) -> Answer:
        """Pause this shard's writes and save it into ``directory`` for server ``rank``."""
        folder = request.args["directory"]

        def save() -> tuple[dict, dict]:
            tables: dict[str, dict] = {}
            for name, entry in self.sparse.items():
                save = Request(op="save", id=0, table=name, bufs={}, args={"directory": folder})
                files = self.files.save(save)[0]
                tables[name] = {"config": entry.table.config.to_dict(), "files": files}
            dense = {}
            for name, dense_entry in self.dense.items():
                where = os.path.join(folder, "dense", name)
                args = {"directory": where}
                save = Request(op="save_dense", id=0, table=name, bufs={}, args=args)
                dense[name] = {"spec": dense_entry.spec, "file": self.files.save_dense(save)[0]}
            return tables, dense

        return self.chain.replicate(request.args["rank"], save, self.applied.export()), []

    def replicate_done(self, request: Request) -> Answer:
        return self.chain.replicate_done(request.args["rank"], request.args["epoch"]), []


def op_table(state: ServerState) -> dict[str, Op]:
    """Every op of the wire (:data:`sparseps.rpc.ops.OPS`) and the code that answers it on
    ``state`` (``tests/server/test_op_table.py`` checks the table and OPS name the same ops).

    Raises:
        KeyError: a handler for an op that OPS does not declare.
    """
    sparse, rows, dense, files, elastic = (
        state.sparse_ops, state.rows, state.dense_ops, state.files, state.elastic
    )  # fmt: skip
    handlers: dict[str, Handler] = {
        # the server process (this module)
        "ping": state.ping,
        "attach_replies": state.attach_replies,
        "stop": state.stop,
        "stats": state.stats,
        # sparse tables (sparseps.server.sparse_ops)
        "create_table": sparse.create_table,
        "pull": sparse.pull,
        "prefetch": sparse.prefetch,
        "push": sparse.push,
        "push_delta": sparse.push_delta,
        "decay": sparse.decay,
        "shrink": sparse.shrink,
        # GPUPS' whole rows (sparseps.server.row_ops)
        "pull_full": rows.pull_full,
        "pull_counts": rows.pull_counts,
        "write_rows": rows.write_rows,
        # dense tables (sparseps.server.dense_ops)
        "create_dense": dense.create_dense,
        "pull_dense": dense.pull_dense,
        "push_dense": dense.push_dense,
        "push_dense_delta": dense.push_dense_delta,
        "set_dense": dense.set_dense,
        # files: checkpoints and inference saves (sparseps.server.file_ops)
        "save": files.save,
        "load": files.load,
        "save_dense": files.save_dense,
        "load_dense": files.load_dense,
        "save_inference": files.save_inference,
        "commit_inference": files.commit_inference,
        # replicas: a replacement copies a shard (this module; sparseps.server.shard_chain)
        "shard_info": state.shard_info,
        "replicate": state.replicate,
        "replicate_done": state.replicate_done,
        # elastic jobs: placement and moves of virtual shards (sparseps.elastic.server_moves)
        "get_placement": elastic.get_placement,
        "set_placement": elastic.set_placement,
        "move_begin": elastic.move_begin,
        "move_freeze": elastic.move_freeze,
        "move_export": elastic.move_export,
        "move_import": elastic.move_import,
        "move_drop": elastic.move_drop,
    }
    return {name: Op(name, OPS[name], handler) for name, handler in handlers.items()}
