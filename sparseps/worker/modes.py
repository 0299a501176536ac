"""Training modes: where rows come from and where gradients go (the interface, async, sync).

A mode object owns the per-step communication of a :class:`~sparseps.worker.trainer.Trainer`.
:class:`TrainingMode` declares the interface; a mode's config
(:class:`~sparseps.worker.strategy.Mode`: its knobs, ``self.config`` here) builds it, and
it is complete once constructed (the dense parameters made consistent across workers,
every table of the model known). The trainer never asks which mode it has.

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

from ..core import collectives
from ..core.closing import Closing
from ..core.routing import server_of
from ..files.dense_file import load_dense_file, save_dense_file
from ..table import DenseTable
from .dense_params import DenseParams
from .pipeline import PushQueue
from .sync_exchange import exchange_headers, gather_sparse_grads, step_header

__all__ = [
    "AsyncMode",
    "SyncMode",
    "TrainingMode",
    "WorkerDenseMode",
    "make_mode",
]

log = logging.getLogger(__name__)

DENSE_TABLE = "__dense__"


class TrainingMode(ABC, Closing):
    """The interface every training mode implements (see the module docstring).

    Args:
        client: the worker's ``PSClient``.
        dense: the model's dense parameters.
        dense_rule: the dense optimizer rule.
        strategy: the ``Strategy`` (timeouts, the push queue); ``strategy.mode`` is this
            mode's config (its knobs), kept as ``self.config``.
        rank: this worker's rank.
        tables: every ``TableConfig`` the model reads.
    """

    prefetch_pulls = False

    def __init__(
        self, client, dense: DenseParams, dense_rule, strategy, rank: int, *, tables: list
    ):
        self.client = client
        self.dense = dense
        self.dense_rule = dense_rule
        self.strategy = strategy
        self.config = strategy.mode
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

    def step_grads(self, binder, lookups: dict, leaves: dict, dense: DenseParams) -> tuple:
        """``(grads, dense_grad)`` of the step after its backward, as ``apply`` takes them
        (host arrays; gpups keeps them on its device)."""
        return binder.grads(lookups, leaves), dense.grads()

    def place_model(self, model) -> None:  # noqa: B027 - optional hook, default: nothing
        """Put the model where this mode computes it (gpups: its device)."""

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
            self.client, maxsize=self.strategy.push_queue_size, timeout=timeout, setting=setting,
            merge=self.config.merge_policy(),
        )  # fmt: skip
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
        # The pull rides on the push (one round trip, the values right after this step).
        if self._dense_push is not None:
            self._dense_push.wait()
        pull = self.step % self.config.dense_pull_interval == 0 and self._dense_pull is None
        self._dense_push = self.client.push_dense(DENSE_TABLE, dense_grad, pull=pull)
        if pull:
            self._dense_pull = self._dense_push

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


class WorkerDenseMode(TrainingMode):
    """A mode whose dense parameters live on the workers (sync, hybrid): worker 0's values
    are broadcast at the start, every worker applies the dense rule to its own copy with
    the same gradients, so the copies stay identical; a checkpoint saves worker 0's
    values and optimizer state, and a load gives them to every worker."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        values = collectives.broadcast_array(self.dense.values(), timeout=self.collective_timeout)
        self.dense.set(values)
        self.local_dense = (
            DenseTable(DENSE_TABLE, self.dense.size, rule=self.dense_rule, init=values)
            if self.dense.size
            else None
        )

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


class SyncMode(WorkerDenseMode):
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
        self.global_batch = 0
        self._dims = {config.name: config.dim for config in self.tables}
        self._buffer_sizes: np.ndarray | None = None  # this step's, from its header

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
        timeout = self.collective_timeout
        # the sizes the header announced (a step run outside steps() exchanges them first)
        sizes, self._buffer_sizes = self._buffer_sizes, None
        handles = push_gathered_sparse(self.client, grads, self.rank, sizes=sizes, timeout=timeout)
        if self.local_dense is not None:
            total = collectives.all_reduce_sum(dense_grad, timeout=timeout)
            self.local_dense.push(np.ascontiguousarray(total, np.float32))
            self.dense.set(self.local_dense.pull())
        for handle in handles:
            handle.wait()
        self.step += 1


def push_gathered_sparse(client, grads: list, rank: int, *, sizes, timeout: float) -> list:
    """Sync mode's sparse half of a step: every worker's gradients gathered (one
    all-gather), this worker pushing the share of keys that hashes to its rank, so the
    servers apply the sum of all workers' gradients once. Returns the push handles."""
    world = collectives.world_size()
    handles, routed = [], None
    for table, all_keys, all_grads, all_shows, all_clicks in gather_sparse_grads(
        grads, sizes=sizes, timeout=timeout
    ):
        # tables read through one slot union (wide&deep's two) have the same keys:
        # routed once (comparing costs a hundredth of hashing)
        if routed is None or not np.array_equal(routed[0], all_keys):
            routed = (all_keys, server_of(all_keys, world) == rank if world > 1 else None)
        mine = routed[1] if routed[1] is not None else slice(None)
        handles.append(
            client.push(
                table,
                all_keys[mine],
                all_grads[mine],
                shows=all_shows[mine],
                clicks=all_clicks[mine],
            )  # fmt: skip
        )
    return handles


def make_mode(
    strategy, client, dense: DenseParams, dense_rule, rank: int, *, tables: list
) -> TrainingMode:
    """The training mode ``strategy.mode`` (a resolved strategy: its mode set) builds."""
    mode = strategy.mode.build(client, dense, dense_rule, strategy, rank, tables=tables)
    if not isinstance(mode, TrainingMode):
        raise TypeError(
            f"{type(strategy.mode).__name__}.build returned {mode!r}, not a TrainingMode"
        )
    return mode
