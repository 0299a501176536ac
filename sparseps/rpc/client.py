"""``PSClient``: the one way workers and tools talk to the servers (DESIGN §2.3).

Data-plane calls are batch-first and asynchronous: ``pull``/``push`` take a 1-D uint64
key array (duplicates allowed) and return a :class:`Handle` at once; ``handle.wait()``
gives the result. The client groups the keys by owning server in one compiled pass
(:mod:`sparseps.core.routing`, the formula of :func:`~sparseps.core.routing.server_of`):
a pull's keys as given (``dedup=True``: each distinct key once), a push's with duplicates
merged (summed gradients, shows and clicks, in input order like ``SparseTable.push``:
:mod:`sparseps.rpc.batching`); it sends one request per server in parallel and puts the
rows back in the caller's order.

Control calls (``create_table``, ``stats``, ``save``, ...) block until every server
answered.

This module holds what every call shares: construction, the routing of a request to a
shard's copies, the keyed data plane (``pull``, ``prefetch``, ``push``, ``push_delta``)
and ``close``. The other calls are grouped by what they act on, one mixin per module, so
each reads alone: whole sparse tables (:mod:`~sparseps.rpc.client_tables`: create,
decay, shrink, save, load, inference saves), dense tables
(:mod:`~sparseps.rpc.client_dense`), whole rows with optimizer state
(:mod:`~sparseps.rpc.client_rows`) and the servers as processes
(:mod:`~sparseps.rpc.client_cluster`: ping, stats, replica status, stop).

Timeouts: every wait is bounded. The default is 60 s, or ``SPARSEPS_RPC_TIMEOUT`` when
set, or the ``timeout`` argument. A server that does not answer in time raises
:class:`~sparseps.errors.DeadlineError` naming the op, the server's rank and address, the
seconds waited and the setting to change.

Thread safety: a client may be shared by threads (e.g. a training loop plus a background
push thread); every method is safe to call concurrently, and a handle may be waited
from any thread (the result is cached, ``wait`` may be called again). Requests in flight
at the same time are not ordered on the server: wait on a push before pulling if the
pull must see it.

Example::

    with PSClient(["127.0.0.1:6000", "127.0.0.1:6001"]) as client:
        client.create_table(TableConfig(name="emb", dim=16))
        rows = client.pull("emb", keys).wait()      # float32 [len(keys), 16]
        client.push("emb", keys, grads).wait()
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .. import env
from ..core.replicas import check_replicas
from ..core.validate import check_key_array
from ..errors import ConfigError
from .batching import merge_by_group
from .channel import Channel
from .client_checks import check_counts_or_none, check_finite_rows, check_merged
from .client_cluster import ClientCluster
from .client_dense import ClientDense
from .client_rows import ClientRows
from .client_tables import ClientTables
from .handle import Handle, completed
from .ops import UPDATE_OPS
from .placed import DEFAULT_PLACEMENT_RETRY_S, PlacementRouting, RoutedHandle, rows_of
from .protocol import JOB_ID, Limits
from .replicated import ShardRequest
from .reply_slots import DEFAULT_SLOTS, MAX_SLOTS
from .security import Security, security_from_env
from .shard_views import ShardViews
from .table_wide import TableWideRouting

__all__ = ["DEFAULT_MAX_IN_FLIGHT", "DEFAULT_TIMEOUT", "Handle", "PSClient"]

DEFAULT_TIMEOUT = 60.0
DEFAULT_FILE_TIMEOUT = 1800.0
DEFAULT_MAX_IN_FLIGHT = 64


def _check_seconds(name: str, value) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not value > 0
    ):
        raise ConfigError(f"PSClient: {name} must be a finite number of seconds > 0, got {value!r}")


def _none(_replies) -> None:
    return None


class PSClient(
    ClientTables, ClientDense, ClientRows, ClientCluster, PlacementRouting, TableWideRouting
):
    """A connection to every server of one job.

    Args:
        endpoints: ``host:port`` of every server in rank order (the servers' own list).
        timeout: seconds any wait may take (default 60, or ``SPARSEPS_RPC_TIMEOUT``).
        max_in_flight: requests outstanding at once over all servers (default 64); a
            caller that would exceed it waits for replies (up to ``timeout``).
        limits: message size limits (default :class:`~sparseps.rpc.protocol.Limits`).
        security: the job's CURVE keys (:class:`~sparseps.rpc.security.Security`); default:
            from ``SPARSEPS_SECURE``/``SPARSEPS_KEY_DIR``, plain transport when unset. A
            server that refuses this client's key fails its calls at once with an
            :class:`~sparseps.errors.UnavailableError` saying so.
        job_id: the job these servers belong to (default ``SPARSEPS_JOB_ID``, set by the
            launcher for every process of a job); sent with every request, and a server
            of another job refuses it (servers started without a job id accept any).
        file_timeout: seconds a save or load may take (default 1800, or
            ``SPARSEPS_FILE_TIMEOUT``): file ops are slow by nature and must not share the
            data plane's timeout, which should stay short to detect a dead server fast.
        update_retries: times a push whose server did not answer within ``timeout`` is
            sent again (default 0). Each push carries this client's sequence number and
            a server applies it once, so a retry never doubles an update.
        replicas: backup copies of every shard, as the servers were started (default
            ``SPARSEPS_REPLICAS``, else 0). With replicas, updates go to every live copy
            of a shard, reads to the first, and a server whose connection drops is routed
            around (see :mod:`sparseps.rpc.replicated`, docs/replication.md).
        follow_placement: route by the servers' placement once they hold one (an elastic
            job, :mod:`sparseps.rpc.placed`; default True). False pins the client to its
            endpoint list (the migration driver's one-server clients).
        placement_retry_s: seconds a request refused for a placement reason (a virtual
            shard moving between servers) is resent for before the call fails (default 60).
        reply_slots: slots of shared memory asked of each server on this host, where it
            writes pull answers instead of sending them over loopback TCP (default 8 of
            2 MiB, or ``SPARSEPS_REPLY_SLOTS``; 0: never; :mod:`sparseps.rpc.reply_slots`). Rows answered into a slot
            are arrays over that memory; the slot is reused once they are garbage, and
            while every slot is held, answers travel over the socket.

    Raises:
        ConfigError: empty or malformed endpoints, a timeout that is not a finite number
            > 0, max_in_flight < 1, update_retries < 0, reply_slots outside 0..64,
            replicas not below the server count or a malformed job id.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        limits: Limits | None = None,
        security: Security | None = None,
        job_id: str | None = None,
        file_timeout: float | None = None,
        update_retries: int = 0,
        replicas: int | None = None,
        follow_placement: bool = True,
        placement_retry_s: float = DEFAULT_PLACEMENT_RETRY_S,
        reply_slots: int | None = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        endpoints = [str(e).strip() for e in endpoints]
        if not endpoints:
            raise ConfigError("PSClient: endpoints must list at least one host:port")
        for i, endpoint in enumerate(endpoints):
            env.parse_endpoint(endpoint, what=f"PSClient endpoints[{i}]")
        if timeout is None:
            timeout = env.float_setting(env.RPC_TIMEOUT, DEFAULT_TIMEOUT)
            setting = f"PSClient(timeout=...) or {env.RPC_TIMEOUT}"
        else:
            setting = "PSClient(timeout=...)"
        _check_seconds("timeout", timeout)
        if job_id is None:
            job_id = env.job_id_setting()
        if file_timeout is None:
            file_timeout = env.float_setting(env.FILE_TIMEOUT, DEFAULT_FILE_TIMEOUT)
        _check_seconds("file_timeout", file_timeout)
        _check_seconds("placement_retry_s", placement_retry_s)
        if job_id is not None and not (isinstance(job_id, str) and JOB_ID.fullmatch(job_id)):
            raise ConfigError(
                f"PSClient: job_id must be 1-128 characters from [A-Za-z0-9_.:-], got {job_id!r}"
            )
        if (
            not isinstance(update_retries, int)
            or isinstance(update_retries, bool)
            or update_retries < 0
        ):
            raise ConfigError(
                f"PSClient: update_retries must be an int >= 0, got {update_retries!r}"
            )
        if (
            not isinstance(max_in_flight, int)
            or isinstance(max_in_flight, bool)
            or max_in_flight < 1
        ):
            raise ConfigError(f"PSClient: max_in_flight must be an int >= 1, got {max_in_flight!r}")
        if reply_slots is None:
            reply_slots = env.reply_slots_setting(DEFAULT_SLOTS, MAX_SLOTS)
        if not (
            isinstance(reply_slots, int)
            and not isinstance(reply_slots, bool)
            and 0 <= reply_slots <= MAX_SLOTS
        ):
            raise ConfigError(
                f"PSClient: reply_slots must be an int in 0..{MAX_SLOTS}, got {reply_slots!r}"
            )
        self.endpoints = tuple(endpoints)
        self.replicas = check_replicas(
            env.replicas_setting() if replicas is None else replicas,
            len(self.endpoints),
            where="PSClient replicas",
        )
        self.timeout = float(timeout)
        self.file_timeout = float(file_timeout)
        self.job_id = job_id
        self._channel = Channel(
            self.endpoints,
            timeout=self.timeout,
            timeout_setting=setting,
            max_in_flight=max_in_flight,
            limits=limits or Limits(),
            security=security if security is not None else security_from_env(),
            job_id=job_id,
            update_retries=update_retries,
            detect_loss=self.replicas > 0,
            reply_slots=reply_slots,
        )
        # replicas: each shard's epoch and copies, head first, as this client last learned
        self.views = ShardViews(self._channel, len(self.endpoints), self.replicas)
        self._init_placement(follow=follow_placement, retry_s=placement_retry_s)

    @property
    def num_servers(self) -> int:
        return len(self.endpoints)

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the sockets and the I/O thread (idempotent). Pending handles fail."""
        self._channel.close()

    # -- helpers -----------------------------------------------------------------------

    def _all(
        self,
        op: str,
        table: str | None = None,
        args: dict | None = None,
        timeout: float | None = None,
        ranks=None,
    ) -> list:
        """Send one per-server request to every server (or to ``ranks``) and wait for all
        results (with replicas, lost servers are left out when ``ranks`` is None)."""
        if ranks is None:
            ranks = self._table_ranks()
        if ranks is None:
            ranks = [r for r in range(self.num_servers) if self._channel.lost(r) is None]
        calls = [self._channel.submit(rank, op, table, (), args) for rank in ranks]
        return Handle(self._channel, calls, lambda replies: [r.result for r in replies]).wait(
            timeout
        )

    def _shard_request(
        self, shard: int, op: str, table: str | None, bufs=(), args=None
    ) -> ShardRequest:
        """Send one shard's request: to its server, or with replicas to the head of the
        shard's copies (:mod:`sparseps.rpc.replicated`)."""
        if not self.replicas:
            return ShardRequest(shard, op, [self._channel.submit(shard, op, table, bufs, args)])
        # an update's every send carries one sequence number: each copy applies it once
        seq = self._channel.next_seq() if op in UPDATE_OPS else None
        return self.views.request(shard, op, table, bufs, args, seq)

    def _each_shard(
        self,
        op: str,
        table: str | None,
        args: dict | None = None,
        *,
        timeout: float | None = None,
        shards=None,
    ) -> list:
        """One request per shard (or per shard of ``shards``); the results in shard order.
        An elastic job: one per live server of the placement (asked for first)."""
        if shards is None:
            self._probe_placement()
            if self._routing is not None:  # elastic: servers in a move refuse, sent again
                return self._table_wide(op, table, args, timeout, lambda reply: reply.result)
        shards = range(self.num_servers) if shards is None else shards
        requests = [self._shard_request(s, op, table, (), args) for s in shards]
        return Handle(self._channel, requests, lambda replies: [r.result for r in replies]).wait(
            timeout
        )

    def request(self, rank: int, op: str, table: str | None = None,
                bufs: Sequence[np.ndarray] = (), args: dict | None = None, *,
                shard: int | None = None) -> Handle:  # fmt: skip
        """One raw request to server ``rank`` (tools: the elastic driver, a replica's
        rows); ``shard``: the shard when ``rank`` holds it as a backup copy.
        ``wait()`` -> ``(result, buffers)``."""
        call = self._channel.submit(rank, op, table, tuple(bufs), args, shard=shard)
        return Handle(self._channel, [call], lambda replies: (replies[0].result, replies[0].bufs))

    # -- keyed data plane -------------------------------------------------------------

    def pull(self, table: str, keys: np.ndarray, *, dedup: bool = False) -> RoutedHandle:
        """Rows of ``keys`` (duplicates allowed); ``wait()`` -> float32 ``[len(keys), dim]``.

        The keys go to their servers as given: a repeated key is pulled once per
        occurrence, at a server's cost (the same as an in-process table's), which is less
        than hashing every key into a set here when the keys are distinct, as a worker's
        are. ``dedup=True`` sends each distinct key once: fewer bytes for keys that repeat
        a lot (raw batch ids), one hash per key more on this side.
        """
        keys = check_key_array(f"pull {table!r}", keys, contiguous=False)
        group = self._group(keys, dedup=dedup)
        return self._keyed("pull", table, group, (), rows_of(len(group[0]), group[2]))

    def prefetch(self, table: str, keys: np.ndarray) -> Handle | RoutedHandle:
        """Tell the servers the keys of coming pulls; ``wait()`` -> distinct keys queued (each
        server answers once it queued them). Tiered tables (``memory_rows``) promote the
        rows that are only on disk in the background; in-memory tables ignore it."""
        keys = check_key_array(f"prefetch {table!r}", keys, contiguous=False)
        if not len(keys):
            return completed(0)
        group = self._group(keys)
        return self._keyed(
            "prefetch", table, group, (), lambda got: sum(r.result["queued"] for _, r in got)
        )

    def _push(
        self, op: str, table: str, keys, values, name: str, shows, clicks
    ) -> Handle | RoutedHandle:
        what = f"{op} {table!r}"
        keys = check_key_array(what, keys, contiguous=False)
        values = check_finite_rows(values, name, what, len(keys))
        shows = check_counts_or_none(shows, "shows", what, len(keys))
        clicks = check_counts_or_none(clicks, "clicks", what, len(keys))
        if not len(keys):
            return completed(None)
        group = self._group(keys)
        grouped, inverse = group[0], group[2]
        merged, shows, clicks = merge_by_group(inverse, len(grouped), values, shows, clicks)
        if len(grouped) < len(keys):  # only sums of duplicates can overflow
            check_merged(what, grouped, merged, shows, clicks)
        return self._keyed(op, table, group, (merged, shows, clicks), _none)

    def push(
        self,
        table: str,
        keys: np.ndarray,
        grads: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
    ) -> Handle | RoutedHandle:
        """Apply gradients with the table's rule; ``wait()`` -> None.

        Args:
            table: sparse table name.
            keys: 1-D uint64 (duplicates are merged here: summed grads, shows, clicks).
            grads: float32 ``[len(keys), dim]``; NaN/inf rejects the whole push.
            shows, clicks: float32 ``[len(keys)]`` or None (1 show, 0 clicks per key).
        """
        return self._push("push", table, keys, grads, "grads", shows, clicks)

    def push_delta(
        self,
        table: str,
        keys: np.ndarray,
        deltas: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
    ) -> Handle | RoutedHandle:
        """Geo mode: add ``deltas`` to the rows (no optimizer rule); else like :meth:`push`."""
        return self._push("push_delta", table, keys, deltas, "deltas", shows, clicks)
