"""The three training modes: where rows come from and where gradients go.

A mode object owns the per-step communication of a :class:`~sparseps.worker.trainer.Trainer`.
:class:`TrainingMode` declares the interface; a mode is registered under a name with
:func:`register_mode` (``Strategy(mode=name)`` accepts registered names) and is built
complete by its constructor (the dense parameters made consistent across workers, every
table of the model known). The trainer never asks which mode it has.

- ``prefetch_pulls``: whether ``pull_rows`` may run ahead in the prefetch thread;
- ``begin_pass(dataset, lookups, index)``: before a training pass (gpups builds the
  pass's working set from the dataset; ``lookups(batch)`` is the trainer's per-batch
  ``{table: SlotLookup}``);
- ``pull_rows({table: keys})``: the current rows of every table for a training step;
- ``steps(source)``: the step loop (sync mode keeps workers in lock-step);
- ``compute(items, step, binder)``: each step's forward and backward (heter mode: remote);
- ``loss_scale(batch_size)``: the denominator of the summed per-sample loss;
- ``apply(grads, dense_grad)``: send one step's gradients;
- ``finish_pass()``: flush, so the servers hold every update of the pass;
- ``refresh_dense()``: make the local dense parameters current (before evaluating).

``grads`` is a list of ``(table, keys, grad [U, dim], shows, clicks)``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator

import numpy as np

from ..config import Lifecycle, TableConfig
from ..core import collectives
from ..core.routing import server_of
from ..files.dense_file import load_dense_file, save_dense_file
from ..table import DenseTable, SparseTable
from .dense_params import DenseParams
from .pipeline import PushQueue
from .sync_exchange import exchange_headers, gather_sparse_grads, step_header

__all__ = [
    "AsyncMode",
    "GeoMode",
    "SyncMode",
    "TrainingMode",
    "make_mode",
    "mode_names",
    "register_mode",
]

log = logging.getLogger(__name__)

DENSE_TABLE = "__dense__"


class TrainingMode(ABC):
    """The interface every training mode implements (see the module docstring).

    Args:
        client: the worker's ``PSClient``.
        dense: the model's dense parameters.
        dense_rule: the dense optimizer rule.
        strategy: the ``Strategy`` (knobs such as ``k_steps``, timeouts).
        rank: this worker's rank.
        tables: every ``TableConfig`` the model reads.
    """

    prefetch_pulls = False

    def __init__(self, client, dense: DenseParams, dense_rule, strategy, rank: int, tables: list):
        self.client = client
        self.dense = dense
        self.dense_rule = dense_rule
        self.strategy = strategy
        self.rank = rank
        self.tables = list(tables)
        self.step = 0

    def begin_pass(self, dataset, lookups, index: int) -> None:  # noqa: B027 - optional hook
        """Called before training pass ``index`` over ``dataset`` (default: nothing)."""

    def pull_rows(self, keys: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rows of every table for a training step, ``{table: [U, dim]}`` (sent together)."""
        pending = {t: self.client.pull(t, k) for t, k in keys.items()}
        return {t: h.wait() for t, h in pending.items()}

    def before_forward(self) -> None:  # noqa: B027 - optional hook, default: nothing
        """Called before each training forward pass (async: install fresh dense values)."""

    def steps(self, source: Iterable) -> Iterator:
        yield from source

    def compute(self, items: Iterable, step, binder) -> Iterator:
        """``(item, step(item))`` per step: ``step`` runs forward and backward here
        (heter mode sends them to a heter worker instead; ``binder``: the trainer's
        :class:`~sparseps.worker.binding.TableBinder`)."""
        for item in items:
            yield item, step(item)

    def loss_scale(self, batch_size: int) -> float:
        return float(max(batch_size, 1))

    @abstractmethod
    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        """Send one step's gradients (``grads``: ``(table, keys, grad, shows, clicks)``)."""

    def finish_pass(self) -> None:  # noqa: B027 - optional hook, default: nothing
        """Flush at the end of a pass, so the servers hold every update of it."""

    def refresh_dense(self) -> None:  # noqa: B027 - optional hook, default: nothing
        """Make the local dense parameters current (before evaluating)."""

    @property
    def collective_timeout(self) -> float:
        return self.strategy.collective_timeout

    def quiesce(self) -> None:
        """Every update sent so far is applied, and every worker got here (a consistent cut)."""
        collectives.barrier(timeout=self.collective_timeout)

    def save_dense(self, directory) -> str:
        """Worker 0: write the dense parameters + optimizer state; returns the file name."""
        return self.client.save_dense(DENSE_TABLE, str(directory))

    def load_dense(self, path) -> None:
        """Worker 0: restore the dense parameters + optimizer state where they live."""
        self.client.load_dense(DENSE_TABLE, str(path))

    def load_dense_local(self, path) -> None:
        """Every worker, after ``load_dense``: make the local copy current."""
        self.refresh_dense()

    def close(self) -> None:  # noqa: B027 - optional hook, default: nothing
        """Release what the mode holds (threads, queues)."""

    def timings(self) -> dict:
        """Seconds spent in background sends this pass (reset on read)."""
        return {}

    def _create_dense_on_servers(self) -> None:
        """Worker 0 creates the server dense table from its parameters; all then pull it."""
        if self.dense.size == 0:
            return
        if self.rank == 0:
            self.client.create_dense(
                DENSE_TABLE, self.dense.size, self.dense_rule, init=self.dense.values()
            )
        collectives.barrier(timeout=self.collective_timeout)
        self.dense.set(self.client.pull_dense(DENSE_TABLE).wait())


class AsyncMode(TrainingMode):
    """Pushes applied as they arrive; dense parameters in a server dense table."""

    prefetch_pulls = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._push_seen = 0.0
        if self.strategy.rpc_timeout is not None:
            timeout, setting = self.strategy.rpc_timeout, "Strategy.rpc_timeout"
        else:  # the client's own limit (its timeout= argument or SPARSEPS_RPC_TIMEOUT)
            timeout = self.client.timeout
            setting = "Strategy.rpc_timeout (default: the client's timeout, SPARSEPS_RPC_TIMEOUT)"
        self.queue = PushQueue(
            self.client, maxsize=self.strategy.push_queue_size, timeout=timeout, setting=setting
        )
        self._dense_push = None
        self._dense_pull = None
        self._create_dense_on_servers()

    def before_forward(self) -> None:
        if self._dense_pull is not None:
            self.dense.set(self._dense_pull.wait())
            self._dense_pull = None

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        for table, keys, grad, shows, clicks in grads:
            self.queue.put_sparse(table, keys, grad, shows, clicks)
        self.step += 1
        if not dense_grad.size:
            return
        # Dense gradients go straight out (one in flight, so they stay in order) and the
        # fresh parameters are fetched while the next batch is prepared: with Adam, even
        # ten steps of stale dense parameters cost several points of AUC.
        if self._dense_push is not None:
            self._dense_push.wait()
        self._dense_push = self.client.push_dense(DENSE_TABLE, dense_grad)
        if self.step % self.strategy.dense_pull_interval == 0 and self._dense_pull is None:
            self._dense_pull = self.client.pull_dense(DENSE_TABLE)

    def finish_pass(self) -> None:
        self.quiesce()
        self.refresh_dense()

    def quiesce(self) -> None:
        self.quiesce_local()
        self.before_forward()
        collectives.barrier(timeout=self.collective_timeout)

    def refresh_dense(self) -> None:
        if self.dense.size:
            self.dense.set(self.client.pull_dense(DENSE_TABLE).wait())

    def close(self) -> None:
        self.quiesce_local()
        self.queue.close()

    def quiesce_local(self) -> None:
        """This worker's pushes (sparse and dense) are applied; no barrier."""
        self.queue.flush()
        if self._dense_push is not None:
            self._dense_push.wait()
            self._dense_push = None

    def timings(self) -> dict:
        seconds = self.queue.stats().push_seconds
        spent, self._push_seen = seconds - self._push_seen, seconds
        return {"push_s": round(spent, 4)}


class SyncMode(TrainingMode):
    """Lock-step: the servers apply the sum of all workers' gradients once per step.

    Every worker contributes to each step (an empty contribution once its data ran out),
    the sparse gradients are all-gathered and each worker pushes the share of keys that
    hashes to its rank, the dense gradients are all-reduced and applied by the same dense
    rule on every worker (so dense parameters stay identical without a broadcast).

    Three collectives per step (:mod:`~sparseps.worker.sync_exchange`): the step's header,
    every table's sparse gradients in one buffer, the dense all-reduce. No barrier ends a
    step: a worker joins the next header only once its pushes are applied, and pulls
    after it, so no pull sees a step half applied (a callback between steps, such as
    ``on_batch``, may run before the other workers' pushes of that step are applied).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        values = collectives.broadcast_array(self.dense.values(), timeout=self.collective_timeout)
        self.dense.set(values)
        self.local_dense = (
            DenseTable(DENSE_TABLE, self.dense.size, rule=self.dense_rule, init=values)
            if self.dense.size
            else None
        )
        self.global_batch = 0
        self._dims = {config.name: config.dim for config in self.tables}
        self._buffer_sizes: np.ndarray | None = None  # this step's, from its header

    def save_dense(self, directory) -> str:
        arrays = (
            self.local_dense.export()
            if self.local_dense is not None
            else {"values": self.dense.values()}
        )
        return save_dense_file(directory, arrays)

    def load_dense(self, path) -> None:
        pass  # every worker holds the dense optimizer: see load_dense_local

    def load_dense_local(self, path) -> None:
        arrays = load_dense_file(path)
        if self.local_dense is not None:
            self.local_dense.import_(arrays)
            self.dense.set(self.local_dense.pull())

    def steps(self, source: Iterable) -> Iterator:
        iterator = iter(source)
        while True:
            item = next(iterator, None)
            header = step_header(item, self._dims)
            active, self.global_batch, self._buffer_sizes = exchange_headers(
                header, timeout=self.collective_timeout
            )
            if not active:
                return
            yield item

    def loss_scale(self, batch_size: int) -> float:
        return float(max(self.global_batch, 1))

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        world, timeout = collectives.world_size(), self.collective_timeout
        # the sizes the header announced (a step run outside steps() exchanges them first)
        sizes, self._buffer_sizes = self._buffer_sizes, None
        handles, routed = [], None
        for table, all_keys, all_grads, all_shows, all_clicks in gather_sparse_grads(
            grads, sizes=sizes, timeout=timeout
        ):
            # tables read through one slot union (wide&deep's two) have the same keys:
            # routed once (comparing costs a hundredth of hashing)
            if routed is None or not np.array_equal(routed[0], all_keys):
                routed = (all_keys, server_of(all_keys, world) == self.rank if world > 1 else None)
            mine = routed[1] if routed[1] is not None else slice(None)
            handles.append(
                self.client.push(
                    table,
                    all_keys[mine],
                    all_grads[mine],
                    shows=all_shows[mine],
                    clicks=all_clicks[mine],
                )
            )
        if self.local_dense is not None:
            total = collectives.all_reduce_sum(dense_grad, timeout=timeout)
            self.local_dense.push(np.ascontiguousarray(total, np.float32))
            self.dense.set(self.local_dense.pull())
        for handle in handles:
            handle.wait()
        self.step += 1


class GeoMode(TrainingMode):
    """Local training for ``k_steps`` steps, then parameter deltas go to the servers.

    Each worker keeps, per table, a local table of the rows it has used (trained with the
    table's own rule, whose state persists across windows) and a base copy of their values
    as last fetched. Every ``k_steps`` it pushes ``local - base`` for the keys touched in
    the window (servers add it, with the window's show/click counts), then refreshes those
    keys from the servers. Keys not touched in a window keep their last fetched value.

    The local copy holds every row the worker used, unless ``Strategy.geo_keep_windows``
    is set: then a row unused for that many windows is dropped from it (the local tables'
    own lifecycle does the bookkeeping: a decay per window ages rows not pushed in it, a
    shrink drops those older than the limit).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_dense_on_servers()
        self.workers = max(collectives.world_size(), 1)  # dense deltas are averaged over them
        self.local_dense = None
        if self.dense.size:
            self.base_dense = self.dense.values()
            self.local_dense = DenseTable(
                DENSE_TABLE, self.dense.size, rule=self.dense_rule, init=self.base_dense
            )
        self.local: dict[str, SparseTable] = {}
        self.base: dict[str, SparseTable] = {}
        self.touched: dict[str, list] = {}
        for config in self.tables:
            self._register(config)

    def _register(self, config: TableConfig) -> None:
        keep = self.strategy.geo_keep_windows
        # admission happens on the servers; locally every used key is a row. decay_rate 1:
        # the local decay only ages rows (show/click are not used locally).
        lifecycle = (
            Lifecycle()
            if keep is None
            else Lifecycle(decay_rate=1.0, shrink_score=0.0, shrink_unseen_days=keep - 1)
        )
        local = TableConfig(
            name=config.name,
            dim=config.dim,
            rule=config.rule,
            initializer=config.initializer,
            lifecycle=lifecycle,
            seed=config.seed,
        )
        self.local[config.name] = SparseTable(local)
        self.base[config.name] = SparseTable(local)
        self.touched[config.name] = []

    def pull_rows(self, keys: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Training pulls read the worker's local copy (missing rows fetched first)."""
        return {t: self._pull_local(t, k) for t, k in keys.items()}

    def _pull_local(self, table: str, keys: np.ndarray) -> np.ndarray:
        local = self.local[table]
        missing = keys[~local.contains(keys)]
        if missing.size:
            fresh = self.client.pull(table, missing).wait()
            for target in (local, self.base[table]):
                target.import_rows(_rows_columns(target, missing, fresh))
        return local.pull(keys)

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        for table, keys, grad, shows, clicks in grads:
            self.local[table].push(keys, grad, shows=shows, clicks=clicks)
            self.touched[table].append((keys, shows, clicks))
        if self.local_dense is not None:
            self.local_dense.push(np.ascontiguousarray(dense_grad, np.float32))
            self.dense.set(self.local_dense.pull())
        self.step += 1
        if self.step % self.strategy.k_steps == 0:
            self._sync()

    def _sync(self) -> None:
        handles, windows = [], {}
        for name, parts in self.touched.items():
            if not parts:
                continue
            keys, inverse = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
            shows = np.bincount(inverse, np.concatenate([p[1] for p in parts]), keys.size).astype(
                np.float32
            )
            clicks = np.bincount(inverse, np.concatenate([p[2] for p in parts]), keys.size).astype(
                np.float32
            )
            delta = self.local[name].pull(keys) - self.base[name].pull(keys)
            handles.append(self.client.push_delta(name, keys, delta, shows=shows, clicks=clicks))
            windows[name] = keys
            parts.clear()
        if self.local_dense is not None:
            # averaged, not summed: every worker trains every dense parameter, so the sum
            # of N workers' deltas is N steps of the same size from the same start (it
            # diverged at low click rates: test AUC 0.55-0.75 at 4% clicks against 0.83
            # with the average; docs/training.md). Sparse deltas stay summed: most keys
            # are touched by one worker in a window.
            handles.append(self.client.push_dense_delta(DENSE_TABLE, self._dense_delta()))
        for handle in handles:
            handle.wait()
        for name, keys in windows.items():
            fresh = self.client.pull(name, keys).wait()
            zeros = np.zeros(keys.size, np.float32)
            for target in (self.local[name], self.base[name]):
                # move the embedding to the fresh value, keep the optimizer state
                target.push_delta(keys, fresh - target.pull(keys), shows=zeros, clicks=zeros)
        if self.strategy.geo_keep_windows is not None:
            # local and base saw the same pushes this window, so they drop the same rows
            for name in self.local:
                for target in (self.local[name], self.base[name]):
                    target.decay(1.0)
                    target.shrink()
        self.refresh_dense()

    def finish_pass(self) -> None:
        self.quiesce()
        self.refresh_dense()

    def _dense_delta(self) -> np.ndarray:
        """This worker's share of the window's dense change: its delta over the workers."""
        assert self.local_dense is not None
        return (self.local_dense.pull() - self.base_dense) / np.float32(self.workers)

    def quiesce(self) -> None:
        self._sync()
        collectives.barrier(timeout=self.collective_timeout)

    def refresh_dense(self) -> None:
        if self.local_dense is not None:
            self.base_dense = self.client.pull_dense(DENSE_TABLE).wait()
            self.local_dense.set(self.base_dense)
            self.dense.set(self.base_dense)


def _rows_columns(table: SparseTable, keys: np.ndarray, embedding: np.ndarray) -> dict:
    n = keys.size
    return {
        "key": keys,
        "embedding": np.ascontiguousarray(embedding, np.float32),
        "state": np.zeros((n, table.layout.state_dim), np.float32),
        "show": np.zeros(n, np.float32),
        "click": np.zeros(n, np.float32),
        "unseen_days": np.zeros(n, np.int32),
        "delta_score": np.zeros(n, np.float32),
    }


_MODES: dict[str, type[TrainingMode]] = {"async": AsyncMode, "sync": SyncMode, "geo": GeoMode}


def register_mode(name: str, cls: type[TrainingMode]) -> None:
    """Make ``Strategy(mode=name)`` train with ``cls`` (a :class:`TrainingMode` subclass)."""
    if not (isinstance(cls, type) and issubclass(cls, TrainingMode)):
        raise TypeError(f"register_mode: {cls!r} is not a TrainingMode subclass")
    _MODES[name] = cls


def mode_names() -> tuple[str, ...]:
    """Names ``Strategy.mode`` accepts."""
    return tuple(_MODES)


def make_mode(
    strategy, client, dense: DenseParams, dense_rule, rank: int, *, tables: list
) -> TrainingMode:
    return _MODES[strategy.mode](client, dense, dense_rule, strategy, rank, tables)
