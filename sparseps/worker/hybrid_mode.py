"""Hybrid mode: dense parameters synchronous among workers, sparse rows asynchronous.

PERSIA's split (``Strategy(mode="hybrid")``). The dense network is small and every
sample touches all of it, so its gradients are all-reduced every step and applied by the
same dense rule on every worker, as in sync mode: the workers' dense parameters stay
identical, with no server round trip for them. The embeddings are huge and each step
touches a few rows, so their gradients go to the servers through the background push
queue and the next batch's rows are pulled ahead, as in async mode (rows a pull reads
may miss the pushes still in flight, never a dense update).

Sparse gradients as sync mode makes them: the loss is divided by the global batch (this
worker's batch times the number of workers), and by default (``Strategy.push_merge``
None) a worker's pushes of W steps are merged into one (W: the number of workers), so a
key gets one optimizer update per W local steps, as many per sample as in sync mode. Each
worker pushing every step instead (``push_merge="off"``) doubles, with 2 workers, the
sparse updates against the dense ones: with Adam on both (the demo job) that cost 0.02
of test AUC against sync (docs/training.md, "Hybrid").

One collective per step: the all-reduce of ``[dense gradient * batch size, batch size,
has data]``. The dense gradient applied is the global batch's mean, whatever the
workers' batch sizes. A worker whose data ran out keeps taking part with an empty step
until the all-reduce says no worker has data (one such step ends every pass). Dense
optimizer state lives on the workers: a checkpoint saves worker 0's, a load gives it to
every worker (as sync mode).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from ..core import collectives
from .modes import WorkerDenseMode
from .pipeline import PushQueue
from .push_merge import MergePolicy

__all__ = ["HybridMode"]


class HybridMode(WorkerDenseMode):
    """``Strategy(mode="hybrid")``: dense all-reduced per step, sparse pushed async."""

    prefetch_pulls = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.world = collectives.world_size()
        self.queue = _push_queue(self.client, self.strategy, self.world)
        self._push_seen = 0.0
        self._scales: deque[float] = deque()  # loss scales of steps not applied yet
        self._active = 1  # workers with data in the last step

    # -- the step loop -----------------------------------------------------------------

    def steps(self, source: Iterable) -> Iterator:
        iterator, exhausted = iter(source), False
        while True:
            item = None if exhausted else next(iterator, None)
            exhausted = item is None
            self._scales.append(0.0 if item is None else self.loss_scale(len(item[0])))
            yield item
            if not self._active:  # the step's all-reduce: no worker had data
                return

    def loss_scale(self, batch_size: int) -> float:
        # sync mode's denominator, the global batch (its size were every worker's batch
        # this one's): a key's gradients of the workers' steps add up to sync's
        return float(max(batch_size, 1) * self.world)

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        for table, keys, grad, shows, clicks in grads:
            if len(keys):
                self.queue.put_sparse(table, keys, grad, shows, clicks)
        size, scale = self.dense.size, self._scales.popleft() if self._scales else 0.0
        batch = round(scale / self.world)
        buffer = np.empty(size + 2, np.float32)  # counts exact below 2**24
        buffer[:size] = dense_grad
        buffer[:size] *= scale  # back to the sum over this worker's batch
        buffer[size:] = (batch, batch > 0)
        total = collectives.all_reduce_sum(buffer, timeout=self.collective_timeout)
        global_batch, self._active = int(total[size]), int(total[size + 1])
        if self.local_dense is not None and global_batch:
            self.local_dense.push(np.ascontiguousarray(total[:size] / global_batch, np.float32))
            self.dense.set(self.local_dense.pull())
        self.step += 1

    # -- consistency, files, lifecycle --------------------------------------------------

    def finish_pass(self) -> None:
        self.quiesce()

    def quiesce(self) -> None:
        self.queue.flush()
        collectives.barrier(timeout=self.collective_timeout)

    def close(self) -> None:
        self.queue.flush()
        self.queue.close()

    def timings(self) -> dict:
        stats = self.queue.stats()
        spent, self._push_seen = stats.push_seconds - self._push_seen, stats.push_seconds
        return {"push_s": round(spent, 4)}


def _push_queue(client, strategy, world: int) -> PushQueue:
    """The background push queue of async mode, with its timeout and merge policy (by
    default the pushes of ``world`` steps merged: one update per key per global step)."""
    if strategy.rpc_timeout is not None:
        timeout, setting = strategy.rpc_timeout, "Strategy.rpc_timeout"
    else:
        timeout = client.timeout
        setting = "Strategy.rpc_timeout (default: the client's timeout, SPARSEPS_RPC_TIMEOUT)"
    return PushQueue(
        client, maxsize=strategy.push_queue_size, timeout=timeout, setting=setting,
        merge=strategy.mode.merge_policy(MergePolicy(window=world, auto=False) if world > 1 else None),
    )  # fmt: skip
