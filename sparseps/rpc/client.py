"""``PSClient``: the one way workers and tools talk to the servers (DESIGN §2.3).

Data-plane calls are batch-first and asynchronous: ``pull``/``push`` take a 1-D uint64
key array (duplicates allowed) and return a :class:`Handle` at once; ``handle.wait()``
gives the result. The client groups the keys by owning server in one compiled pass
(:mod:`sparseps.core.routing`, the formula of :func:`~sparseps.core.routing.server_of`):
a pull's keys as given (``dedup=True``: each distinct key once), a push's with duplicates
merged (summed gradients, shows and clicks, in input order like ``SparseTable.push``:
:mod:`sparseps.rpc.batching`); it sends one request per server in parallel and puts the
rows back in the caller's order. Control calls (``create_table``, ``stats``, ``save``,
...) block until every server answered.

A client is made of parts it holds (ps-lite's ``KVWorker`` over its ``Van``):

- a :class:`~sparseps.rpc.channel.Channel`: the sockets, one I/O thread, requests matched
  to replies, retries of updates;
- a router (:mod:`sparseps.rpc.router`): which server gets each request. The plain router
  routes by ``server_of`` over the endpoint list (with replicas, to the head of each
  shard's copies: :class:`~sparseps.rpc.shard_views.ShardViews`, the client's ``views``);
  a client that follows placements also holds a placement router (sparseps.elastic's,
  injected) and switches to it once it finds its servers hold a placement;
- its settings, one :class:`~sparseps.rpc.client_config.ClientConfig`.

The calls are grouped by what they act on, each group's requests and answers in a module
of its own: keys (:mod:`~sparseps.rpc.keyed`: ``pull``, ``prefetch``, ``push``,
``push_delta`` here; ``pull_full``, ``write_rows`` in :mod:`~sparseps.rpc.client_rows`),
whole sparse tables (:mod:`~sparseps.rpc.client_tables`: create, decay, shrink, save,
load, inference saves), dense tables (:mod:`~sparseps.rpc.client_dense`) and the servers
as processes (:mod:`~sparseps.rpc.client_cluster`: ping, stats, replica status, stop).

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

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import env
from ..core.closing import Closing
from ..core.replicas import check_replicas
from ..core.validate import check_key_array
from ..errors import ConfigError
from . import client_cluster, client_dense, client_rows, client_tables
from .batching import merge_by_group
from .channel import Channel
from .client_checks import check_counts_or_none, check_finite_rows, check_merged
from .client_config import DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT, ClientConfig
from .following import default_placement_routing
from .handle import Handle, completed
from .keyed import KeyedBatch, rows_of
from .router import PlainRouter, result_of
from .shard_views import ShardViews

if TYPE_CHECKING:
    from ..config import TableConfig
    from ..core.placement import Placement
    from ..optim.base import Rule
    from .protocol import Limits, Reply
    from .router import PlacementRouting, PlacementRoutingFactory, Router
    from .security import Security

__all__ = ["DEFAULT_MAX_IN_FLIGHT", "DEFAULT_TIMEOUT", "ClientConfig", "Handle", "PSClient"]


def _none(_replies) -> None:
    return None


class PSClient(Closing):
    """A connection to every server of one job.

    Args:
        endpoints: ``host:port`` of every server in rank order (the servers' own list).
        config: the client's settings (:class:`~sparseps.rpc.client_config.ClientConfig`,
            where each is described); or give them as keyword arguments, not both:
            ``timeout``, ``max_in_flight``, ``limits``, ``security``, ``job_id``,
            ``file_timeout``, ``update_retries``, ``replicas``, ``follow_placement``,
            ``placement_retry_s``, ``reply_slots`` (None: the environment's value, else
            the default).
        placement_routing: makes the placement router the client switches to when its
            servers hold a placement (:class:`~sparseps.rpc.router.PlacementRoutingFactory`;
            default sparseps.elastic's). Unused with ``follow_placement=False`` or replicas.

    Raises:
        ConfigError: empty or malformed endpoints, a bad setting (named), replicas not
            below the server count, or ``config`` together with keyword settings.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        config: ClientConfig | None = None,
        timeout: float | None = None,
        max_in_flight: int | None = None,
        limits: Limits | None = None,
        security: Security | None = None,
        job_id: str | None = None,
        file_timeout: float | None = None,
        update_retries: int | None = None,
        replicas: int | None = None,
        follow_placement: bool | None = None,
        placement_retry_s: float | None = None,
        reply_slots: int | None = None,
        placement_routing: PlacementRoutingFactory | None = None,
    ) -> None:
        given: dict[str, Any] = {
            name: value
            for name, value in (
                ("timeout", timeout), ("max_in_flight", max_in_flight), ("limits", limits),
                ("security", security), ("job_id", job_id), ("file_timeout", file_timeout),
                ("update_retries", update_retries), ("replicas", replicas),
                ("follow_placement", follow_placement),
                ("placement_retry_s", placement_retry_s), ("reply_slots", reply_slots),
            )
            if value is not None
        }  # fmt: skip
        if config is not None and given:
            raise ConfigError(
                f"PSClient: pass the settings in config= or as keywords, not both (got "
                f"config and {', '.join(sorted(given))})"
            )
        self.config = config = config if config is not None else ClientConfig(**given)
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        endpoints = [str(e).strip() for e in endpoints]
        if not endpoints:
            raise ConfigError("PSClient: endpoints must list at least one host:port")
        for i, endpoint in enumerate(endpoints):
            env.parse_endpoint(endpoint, what=f"PSClient endpoints[{i}]")
        self.endpoints = tuple(endpoints)
        timeout, file_timeout = config.timeout, config.file_timeout
        replicas, reply_slots = config.replicas, config.reply_slots
        # each None was the environment's value, or the default, once the config was made
        assert timeout is not None and file_timeout is not None
        assert replicas is not None and reply_slots is not None
        self.replicas = check_replicas(replicas, len(endpoints), where="PSClient replicas")
        self.timeout, self.file_timeout = timeout, file_timeout
        self.job_id = config.job_id
        self._channel = Channel(
            self.endpoints, timeout=timeout, timeout_setting=config.timeout_setting,
            max_in_flight=config.max_in_flight, limits=config.limits,
            security=config.security, job_id=config.job_id,
            update_retries=config.update_retries, detect_loss=self.replicas > 0,
            reply_slots=reply_slots,
        )  # fmt: skip
        # replicas: each shard's epoch and copies, head first, as this client last learned
        self.views = ShardViews(self._channel, len(self.endpoints), self.replicas)
        # Placements and replicas do not mix (servers refuse to install one).
        self._placed: PlacementRouting | None = None
        if config.follow_placement and not self.replicas:
            make = placement_routing or default_placement_routing()
            self._placed = make(
                self._channel, num_servers=len(self.endpoints), retry_s=config.placement_retry_s
            )
        self._plain = PlainRouter(
            self._channel, self.views, replicas=self.replicas,
            take_over=None if self._placed is None else self._take_over,
        )  # fmt: skip
        self._router: Router = self._plain

    @property
    def num_servers(self) -> int:
        return len(self.endpoints)

    def close(self) -> None:
        """Close the sockets and the I/O thread (idempotent). Pending handles fail."""
        self._channel.close()

    # -- elastic jobs ----------------------------------------------------------------------

    @property
    def placement(self) -> Placement | None:
        """The newest placement this client routes by (None: routing by ``server_of``)."""
        return self._router.placement

    @property
    def placement_retry_s(self) -> float:
        """Seconds a request refused for a placement reason is resent for."""
        return self.config.placement_retry_s

    @property
    def refreshes(self) -> int:
        """Placements asked of the servers so far."""
        return 0 if self._placed is None else self._placed.refreshes

    @property
    def move_waits(self) -> int:
        """Table-wide ops sent again after a refusal during a move."""
        return 0 if self._placed is None else self._placed.move_waits

    def refresh_placement(self) -> Placement | None:
        """Ask the servers for their placement and route by the newest from now on
        (connecting to new servers it names). Returns the placement in use (None: the
        servers hold none, or this client does not follow placements)."""
        placed = self._placed
        if placed is None:
            return None
        found = placed.refresh()
        if found is not None:
            self._router = placed
        return found

    def _take_over(self, batch: KeyedBatch, refused: np.ndarray, limit: float) -> list:
        """A plain-routed call's part refused for a placement reason: from now on, route
        by the placement (which the placement router fetches before resending it)."""
        placed = self._placed
        assert placed is not None, "only a client that follows placements takes over"
        try:
            return placed.take_over(batch, refused, limit)
        finally:
            if placed.placement is not None:
                self._router = placed

    # -- requests --------------------------------------------------------------------------

    def request(self, rank: int, op: str, table: str | None = None,
                bufs: Sequence[np.ndarray] = (), args: dict | None = None, *,
                shard: int | None = None) -> Handle:  # fmt: skip
        """One raw request to server ``rank`` (tools: the elastic driver, a replica's
        rows); ``shard``: the shard when ``rank`` holds it as a backup copy.
        ``wait()`` -> ``(result, buffers)``."""
        call = self._channel.submit(rank, op, table, tuple(bufs), args, shard=shard)
        return Handle(self._channel, [call], lambda replies: (replies[0].result, replies[0].bufs))

    def _table_wide(self, op: str, table: str | None, args: dict | None = None, *,
                    timeout: float | None = None,
                    pick: Callable[[Reply], object] = result_of) -> list:  # fmt: skip
        """A table-wide op: to every shard, or, once the servers hold a placement (asked
        first when following), to every live server of it."""
        if self._placed is not None:
            self.refresh_placement()
        return self._router.table_wide(op, table, args, timeout=timeout, pick=pick)

    # -- keys ------------------------------------------------------------------------------

    def pull(self, table: str, keys: np.ndarray, *, dedup: bool = False) -> Handle:
        """Rows of ``keys`` (duplicates allowed); ``wait()`` -> float32 ``[len(keys), dim]``.

        The keys go to their servers as given: a repeated key is pulled once per
        occurrence, at a server's cost (the same as an in-process table's), which is less
        than hashing every key into a set here when the keys are distinct, as a worker's
        are. ``dedup=True`` sends each distinct key once: fewer bytes for keys that repeat
        a lot (raw batch ids), one hash per key more on this side.
        """
        keys = check_key_array(f"pull {table!r}", keys, contiguous=False)
        router = self._router
        grouping = router.group(keys, dedup=dedup)
        batch = KeyedBatch("pull", table, grouping.keys, ())
        return router.send(batch, grouping, rows_of(len(grouping.keys), grouping.inverse))

    def prefetch(self, table: str, keys: np.ndarray) -> Handle:
        """Tell the servers the keys of coming pulls; ``wait()`` -> distinct keys queued (each
        server answers once it queued them). Tiered tables (``memory_rows``) promote the
        rows that are only on disk in the background; in-memory tables ignore it."""
        keys = check_key_array(f"prefetch {table!r}", keys, contiguous=False)
        if not len(keys):
            return completed(0)
        router = self._router
        grouping = router.group(keys, dedup=True)
        batch = KeyedBatch("prefetch", table, grouping.keys, ())
        return router.send(batch, grouping, lambda got: sum(r.result["queued"] for _, r in got))

    def _push(self, op: str, table: str, keys, values, name: str, shows, clicks) -> Handle:
        what = f"{op} {table!r}"
        keys = check_key_array(what, keys, contiguous=False)
        values = check_finite_rows(values, name, what, len(keys))
        shows = check_counts_or_none(shows, "shows", what, len(keys))
        clicks = check_counts_or_none(clicks, "clicks", what, len(keys))
        if not len(keys):
            return completed(None)
        router = self._router
        grouping = router.group(keys, dedup=True)
        grouped, inverse = grouping.keys, grouping.inverse
        assert inverse is not None, "a deduplicated grouping maps the caller's keys"
        merged, shows, clicks = merge_by_group(inverse, len(grouped), values, shows, clicks)
        if len(grouped) < len(keys):  # only sums of duplicates can overflow
            check_merged(what, grouped, merged, shows, clicks)
        return router.send(KeyedBatch(op, table, grouped, (merged, shows, clicks)), grouping, _none)

    def push(self, table: str, keys: np.ndarray, grads: np.ndarray,
             shows: np.ndarray | None = None, clicks: np.ndarray | None = None) -> Handle:  # fmt: skip
        """Apply gradients with the table's rule; ``wait()`` -> None.

        Args:
            table: sparse table name.
            keys: 1-D uint64 (duplicates are merged here: summed grads, shows, clicks).
            grads: float32 ``[len(keys), dim]``; NaN/inf rejects the whole push.
            shows, clicks: float32 ``[len(keys)]`` or None (1 show, 0 clicks per key).
        """
        return self._push("push", table, keys, grads, "grads", shows, clicks)

    def push_delta(self, table: str, keys: np.ndarray, deltas: np.ndarray,
                   shows: np.ndarray | None = None, clicks: np.ndarray | None = None) -> Handle:  # fmt: skip
        """Geo mode: add ``deltas`` to the rows (no optimizer rule); else like :meth:`push`."""
        return self._push("push_delta", table, keys, deltas, "deltas", shows, clicks)

    def pull_full(self, table: str, keys: np.ndarray) -> Handle:
        """Embedding and optimizer state of ``keys``; ``wait()`` -> float32
        ``[len(keys), dim + state_dim]`` in the caller's order (:mod:`.client_rows`)."""
        return client_rows.pull_full(self._router, table, keys)

    def pull_counts(self, table: str, keys: np.ndarray) -> Handle:
        """Per key ``[is a row (1/0), pending show, pending click]``; ``wait()`` -> float32
        ``[len(keys), 3]`` (GPUPS under admission; :meth:`SparseTable.pull_counts
        <sparseps.table.SparseTable.pull_counts>`)."""
        return client_rows.pull_counts(self._router, table, keys)

    def write_rows(self, table: str, keys: np.ndarray, rows: np.ndarray,
                   shows: np.ndarray | None = None, clicks: np.ndarray | None = None) -> Handle:  # fmt: skip
        """Overwrite the embedding and state of ``keys`` (unique), add show/click;
        ``wait()`` -> None (:mod:`.client_rows`).

        Raises:
            InputError: keys not 1-D uint64 or repeated, rows not float32 ``[n, width]``
                or not finite, bad counts; nothing was sent. A width other than the
                table's ``dim + state_dim`` is refused by the servers (``RemoteError``).
        """
        return client_rows.write_rows(self._router, table, keys, rows, shows, clicks)

    # -- whole sparse tables (client_tables) ------------------------------------------------

    def create_table(self, config: TableConfig) -> None:
        """Create a sparse table on every server (idempotent for an equal config).

        Raises:
            RemoteError: a table of that name exists with a different config (the message
                names the differing fields and both configs).
        """
        client_tables.create_table(self._table_wide, config)

    def decay(self, table: str, rate: float | None = None) -> None:
        """End of day on every server: decay show/click, age unseen rows."""
        client_tables.decay(self._table_wide, table, rate)

    def shrink(self, table: str) -> np.ndarray:
        """Delete rows per the lifecycle policy; returns the deleted keys (sorted uint64)."""
        return client_tables.shrink(self._table_wide, table)

    def save(self, table: str, directory: str | os.PathLike, *,
             timeout: float | None = None) -> list[dict]:  # fmt: skip
        """Every server writes its shard of ``table`` into ``directory`` (seen by the servers).

        Returns:
            one record per file: ``name``, ``path``, ``bytes``, ``sha256``, ``xxh3_128``,
            ``rows``, ``kind`` (``rows``/``pending``) and ``rank``.
        """
        return client_tables.save(self._table_wide, table, directory, timeout or self.file_timeout)

    def load(self, table: str, files: Sequence, *, timeout: float | None = None) -> dict:
        """Load shard files written by any number of servers; each keeps the keys it owns.

        Args:
            table: an existing table with the same dim and rule as the saved one.
            files: paths, or the records returned by :meth:`save` (checksums verified).

        Returns:
            totals over servers: ``{"rows", "pending", "files"}``.
        """
        return client_tables.load(self._table_wide, table, files, timeout or self.file_timeout)

    def save_inference(self, table: str, directory: str | os.PathLike, mode: str) -> list[dict]:
        """Every server writes its embeddings for serving (``mode`` base or delta, see
        :mod:`sparseps.checkpoint.inference`); returns one file record per server."""
        return client_tables.save_inference(
            self._table_wide, table, directory, mode, self.file_timeout
        )

    def commit_inference(self, table: str) -> None:
        """After an inference save is in place: every server restarts ``table``'s
        changed-rows marker, so the next delta holds only rows changed from now on."""
        client_tables.commit_inference(self._table_wide, table)

    # -- dense tables (client_dense) -------------------------------------------------------

    def create_dense(self, name: str, size: int, rule: Rule,
                     init: np.ndarray | None = None) -> None:  # fmt: skip
        """Create a dense table of ``size`` floats on its server (idempotent when equal)."""
        client_dense.create_dense(self._plain, name, size, rule, init)

    def pull_dense(self, name: str) -> Handle:
        """``wait()`` -> float32 ``[size]`` (a fresh writable copy)."""
        return client_dense.pull_dense(self._plain, name)

    def push_dense(self, name: str, grad: np.ndarray, *, pull: bool = False) -> Handle:
        """Apply a dense gradient with the table's rule. ``pull=True``: ``wait()`` -> the
        values after this step, float32 ``[size]`` (what a ``pull_dense`` sent right
        after would read, in the same round trip)."""
        return client_dense.update_dense(self._plain, "push_dense", name, grad, pull=pull)

    def push_dense_delta(self, name: str, delta: np.ndarray) -> Handle:
        """Geo mode: add ``delta`` to the dense values."""
        return client_dense.update_dense(self._plain, "push_dense_delta", name, delta)

    def set_dense(self, name: str, values: np.ndarray) -> Handle:
        """Overwrite the dense values (optimizer state is kept)."""
        return client_dense.update_dense(self._plain, "set_dense", name, values)

    def save_dense(self, name: str, directory: str | os.PathLike) -> str:
        """The owning server writes the dense table (values + optimizer state) into
        ``directory``; returns the file name (``dense.npz``)."""
        return client_dense.save_dense(self._plain, name, directory, self.file_timeout)

    def load_dense(self, name: str, path: str | os.PathLike, *, sha256: str | None = None) -> None:
        """The owning server restores the dense table from a :meth:`save_dense` file."""
        client_dense.load_dense(self._plain, name, path, sha256, self.file_timeout)

    # -- the servers as processes (client_cluster) -----------------------------------------

    def ping(self, timeout: float | None = None, *,
             ranks: Sequence[int] | None = None) -> list[dict]:  # fmt: skip
        """Each server's ``{"rank", "num_servers", "pid", "v"}``; checks they match this client.

        Args:
            timeout: seconds (default the client's timeout).
            ranks: only these servers (default all).

        Raises:
            ConfigError: a server has another rank or server count than this client expects.
        """
        return client_cluster.ping(self._router, self._channel, self.num_servers, timeout, ranks)

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
        return client_cluster.stats(self._router, self._channel, self.num_servers)

    def replica_status(self) -> list[dict]:
        """Per shard, what each copy this client reaches reports: ``{"shard", "copies":
        [{"rank", "epoch", "members", "recovering", "index"}, ...]}`` (in chain order; one
        copy without replicas). ``members`` is that copy's view, head first; ``index`` the
        writes it applied."""
        return client_cluster.replica_status(
            self._channel, self.views, self.replicas, self.num_servers
        )

    def stop_servers(self, timeout: float | None = None, *,
                     ranks: Sequence[int] | None = None) -> None:  # fmt: skip
        """Ask every server (or ``ranks``) to stop; each replies, then exits."""
        ranks = self._router.server_ranks() if ranks is None else ranks
        client_cluster.each_server(self._channel, ranks, "stop", timeout)
