"""What a server does with each validated request: one method per op.

:class:`ServerState` holds this server's shard of every sparse table and the dense tables
placed on it. Requests arrive already validated by :func:`sparseps.rpc.protocol.decode_request`
(types, dtypes, shapes); this module checks what needs server state (does the table
exist, is the dim right, do the keys belong to this server) and calls the table engine.

The ops that read or write files live in :mod:`sparseps.server.file_ops`, the whole-row
ops of GPUPS in :mod:`sparseps.server.row_ops`, the dense tables' in
:mod:`sparseps.server.dense_ops` (all mixed in); a table and its lock in
:mod:`sparseps.server.entries`.

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
from typing import TYPE_CHECKING, cast

import numpy as np

from ..core.closing import Closing
from ..core.replicas import check_replicas, hosted
from ..core.routing import misrouted
from ..errors import ConfigError, InputError, ProtocolError
from ..rpc.ops import UPDATE_OPS
from ..rpc.protocol import HEADER_ROOM, PROTOCOL_VERSION, Request
from .applied import AppliedUpdates
from .dense_ops import DenseOps
from .disk_dir import DiskDir
from .elastic_ops import ElasticOps
from .entries import TableEntry, config_differences
from .file_guard import FILE_ARGS, FileGuard
from .file_ops import FileOps
from .heap import return_large_frees
from .log_budget import LogBudget
from .prefetch import RowPrefetcher
from .relay import Relay, Route
from .reply_segments import ReplySegments, ServerSlot
from .row_ops import RowOps
from .shard_chain import ShardChain

if TYPE_CHECKING:
    from ..rpc.channel import Channel
    from ..table import DenseTable, SparseTable

__all__ = ["ServerState"]

# Ops about the server process, not one of its shards.
_SERVER_OPS = frozenset({"ping", "stop", "stats", "attach_replies"})


class ServerState(FileOps, RowOps, ElasticOps, DenseOps, Closing):
    """The tables of one server and the op handlers.

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
        self._applied = AppliedUpdates()
        self.log_budget = LogBudget(logging.getLogger("sparseps.server.loop"))
        self.stop_requested = threading.Event()
        self._sparse: dict[str, TableEntry[SparseTable]] = {}
        self._dense: dict[str, TableEntry[DenseTable]] = {}
        self._registry = threading.Lock()
        self._counters = {"requests": 0, "bad_messages": 0, "failed": 0, "duplicates": 0}
        self._counter_lock = threading.Lock()
        self.prefetcher = RowPrefetcher(self.log_budget)
        # same-host clients' reply slots: the server process's (a backup's are unused)
        self.replies = ReplySegments(self.holder)
        self._init_elastic()
        self._ops: dict[str, Callable[[Request], tuple[object, list]]] = {
            name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_op_")
        }
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
        # this copy's place in its shard's chain of copies (replicas; sparseps.server.shard_chain)
        self.chain = ShardChain(
            rank, self.holder, num_servers, self.replicas, recovering=recovering
        )

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
        for entry in list(self._sparse.values()):
            entry.table.close()
        if self.disk_dir is not None:
            self.disk_dir.close()

    # -- bookkeeping -------------------------------------------------------------------

    def count(self, what: str) -> None:
        with self._counter_lock:
            self._counters[what] += 1

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
        if request.op in FILE_ARGS:
            self.file_guard.check(request)
            with self.file_guard.writing(request):
                return (*self._ops[request.op](request), True)
        if request.seq is None or request.op not in UPDATE_OPS:
            return (*self._ops[request.op](request), True)
        client = request.client
        assert client is not None, "decode_request takes client and seq together"
        if not self._applied.begin(client, request.seq):
            self.count("duplicates")
            return {"duplicate": True}, self._read_back(request), False
        try:
            return (*self._ops[request.op](request), True)
        except BaseException:
            self._applied.failed(client, request.seq)
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

    def _sparse_entry(self, request: Request) -> TableEntry[SparseTable]:
        entry = self._sparse.get(str(request.table))  # the op's schema requires a table
        if entry is None:
            raise InputError(
                f"server {self.rank}: sparse table {request.table!r} does not exist "
                f"(tables: {sorted(self._sparse) or 'none'}); create it with PSClient.create_table first"
            )
        return entry

    def _check_routed(self, request: Request, keys: np.ndarray) -> None:
        """Keys must route here; a client with a different server list would corrupt shards."""
        if self._placement is not None:  # an elastic job: its placement decides
            self._check_placed(request, keys)
            return
        wrong, first = misrouted(keys, self.num_servers, self.rank)
        if wrong:
            raise InputError(
                f"server {self.rank} of {self.num_servers}: {wrong} of {len(keys)} keys of "
                f"{request.op} {request.table!r} belong to other servers (first key {int(keys[first])}); "
                "the client's endpoint list must equal the servers' (same hosts, same order)"
            )

    def _check_reply_size(self, request: Request, count: int, width: int, unit: str) -> None:
        """Refuse, before allocating it, a reply that could not travel in one message."""
        limits = request.limits
        nbytes = count * width * 4
        if nbytes > limits.max_payload_bytes:
            raise InputError(
                f"server {self.rank}: {request.op} {request.table!r}: the reply would be {count} "
                f"{unit} x {width} float32 = {nbytes} bytes, over the message limit "
                f"(Limits.max_message_bytes={limits.max_message_bytes} minus {HEADER_ROOM} for the "
                f"header); send at most {limits.max_payload_bytes // (width * 4)} {unit} per server "
                "per request, or raise the servers' --max-message-bytes together with "
                "PSClient(limits=Limits(max_message_bytes=...))"
            )

    # -- control -----------------------------------------------------------------------

    def _op_ping(self, request: Request):
        return {
            "rank": self.rank,
            "num_servers": self.num_servers,
            "shards": [self.rank, *self.backups],
            "pid": os.getpid(),
            "v": PROTOCOL_VERSION,
        }, []

    def _op_attach_replies(self, request: Request):
        return self.replies.attach(request.args["slots"], request.args["slot_bytes"]), []

    def _op_stop(self, request: Request):
        self.stop_requested.set()
        return {"rank": self.rank}, []

    def _op_stats(self, request: Request):
        tables = {}
        for name, entry in list(self._sparse.items()):
            with entry.lock.read():
                tables[name] = dataclasses.asdict(entry.table.stats())
        dense = {
            name: {"size": entry.spec["size"], "rule": entry.spec["rule"]}
            for name, entry in list(self._dense.items())
        }
        with self._counter_lock:
            counters = dict(self._counters)
        for backup in self.backups.values():  # one process: its counters are the sum
            with backup._counter_lock:
                for key, value in backup._counters.items():
                    counters[key] += value
        return {
            "rank": self.rank,
            "address": self.endpoint,
            "pid": os.getpid(),
            # the process's peak resident memory so far (Linux reports kilobytes)
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "tables": tables,
            "dense": dense,
            "prefetch": dict(self.prefetcher.counts),
            # shard -> its tables' stats, for the shards this server backs up
            "backups": {
                str(shard): backup._op_stats(request)[0]["tables"]
                for shard, backup in self.backups.items()
            },
            **counters,
        }, []

    # -- replication (sparseps.server.shard_chain) ---------------------------------------

    def _op_shard_info(self, request: Request):
        return self.chain.info(), []

    def _op_replicate(self, request: Request):
        """Pause this shard's writes and save it into ``directory`` for server ``rank``."""
        folder = request.args["directory"]

        def save() -> tuple[dict, dict]:
            tables: dict[str, dict] = {}
            for name, entry in list(self._sparse.items()):
                save = Request(op="save", id=0, table=name, bufs={}, args={"directory": folder})
                files = self._ops["save"](save)[0]
                tables[name] = {"config": entry.table.config.to_dict(), "files": files}
            dense = {}
            for name, dense_entry in list(self._dense.items()):
                where = os.path.join(folder, "dense", name)
                args = {"directory": where}
                save = Request(op="save_dense", id=0, table=name, bufs={}, args=args)
                dense[name] = {"spec": dense_entry.spec, "file": self._ops["save_dense"](save)[0]}
            return tables, dense

        return self.chain.replicate(request.args["rank"], save, self._applied.export()), []

    def _op_replicate_done(self, request: Request):
        return self.chain.replicate_done(request.args["rank"], request.args["epoch"]), []

    # -- sparse tables -----------------------------------------------------------------

    def _op_create_table(self, request: Request):
        from ..config import TableConfig
        from ..table import SparseTable

        config = TableConfig.from_dict(request.args["config"])
        if config.name != request.table:
            raise ConfigError(
                f"create_table: header table {request.table!r} != config name {config.name!r}"
            )
        with self._registry:
            entry = self._sparse.get(config.name)
            if entry is not None:
                existing = entry.table.config
                if existing == config:
                    return {"created": False}, []
                diff = config_differences(existing.to_dict(), config.to_dict())
                raise ConfigError(
                    f"server {self.rank}: table {config.name!r} already exists with a different config: "
                    + "; ".join(diff)
                    + f" (existing: {existing.to_dict()}; requested: {config.to_dict()})"
                )
            folder = None if self.disk_dir is None else self.disk_dir.path
            try:
                table = SparseTable(config, disk_dir=folder)
            except ConfigError as exc:
                raise ConfigError(f"server {self.rank}: {exc}") from None
            self._sparse[config.name] = TableEntry(table)
        return {"created": True}, []

    def _op_pull(self, request: Request):
        entry = self._sparse_entry(request)
        keys = request.bufs["keys"]
        self._check_routed(request, keys)
        self._check_reply_size(request, len(keys), entry.table.config.dim, "keys")
        # a same-host client's slot: the rows are gathered straight into its memory
        slot = cast("ServerSlot | None", request.reply_to)
        out = None if slot is None else slot.array((len(keys), entry.table.config.dim), np.float32)
        with entry.lock.read():
            rows = entry.table.pull(keys, out=out)
        return None, [rows]

    def _op_prefetch(self, request: Request):
        """Queue the keys for the prefetch thread and answer at once (a hint: nothing is
        promoted for an in-memory table)."""
        entry = self._sparse_entry(request)
        keys = request.bufs["keys"]
        self._check_routed(request, keys)
        if entry.table.disk_path is None or not len(keys):
            return {"queued": 0}, []
        queued = self.prefetcher.submit(entry, keys.copy())  # the buffer is the message's
        return {"queued": len(keys) if queued else 0}, []

    def _push(self, request: Request, method: str, values: str):
        entry = self._sparse_entry(request)
        bufs = request.bufs
        with entry.lock.write():  # checked inside: a migration's freeze orders pushes
            self._check_routed(request, bufs["keys"])
            getattr(entry.table, method)(
                bufs["keys"], bufs[values], shows=bufs.get("shows"), clicks=bufs.get("clicks")
            )
        return None, []

    def _op_push(self, request: Request):
        return self._push(request, "push", "grads")

    def _op_push_delta(self, request: Request):
        return self._push(request, "push_delta", "deltas")

    def _op_decay(self, request: Request):
        entry = self._sparse_entry(request)
        with entry.lock.write():
            self._refuse_during_move(request)  # elastic: a copied row would miss it
            entry.table.decay(request.args.get("rate"))
        return None, []

    def _op_shrink(self, request: Request):
        entry = self._sparse_entry(request)
        with entry.lock.write():
            self._refuse_during_move(request)  # elastic: a copied row would survive it
            deleted = entry.table.shrink()
        owned = self._owned_mask(deleted)  # not the moved rows a source holds until drop
        if owned is not None:
            deleted = deleted[owned]
        return None, [np.ascontiguousarray(deleted, dtype=np.uint64)]
