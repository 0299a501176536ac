"""Hybrid mode: dense parameters synchronous among workers, sparse rows asynchronous.

PERSIA's split (``Strategy(mode="hybrid")``). The dense network is small and every
sample touches all of it, so its gradients are all-reduced every step and applied by the
same dense rule on every worker, as in sync mode: the workers' dense parameters stay
identical, with no server round trip for them. The embeddings are huge and each step
touches a few rows, so their gradients go to the servers through the background push
queue and the next batch's rows are pulled ahead, as in async mode (rows a pull reads
may miss the pushes still in flight, never a dense update).

One collective per step: the all-reduce of ``[dense gradient * batch size, batch size,
has data]``. The dense gradient applied is the global batch's mean, whatever the
workers' batch sizes. A worker whose data ran out keeps taking part with an empty step
until the all-reduce says no worker has data (one such step ends every pass). Dense
optimizer state lives on the workers: a checkpoint saves worker 0's, a load gives it to
every worker (as sync mode).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ..core import collectives
from ..files.dense_file import load_dense_file, save_dense_file
from ..table import DenseTable
from .modes import DENSE_TABLE, TrainingMode, register_mode
from .pipeline import PushQueue
from .push_merge import policy_of

__all__ = ["HybridMode"]


class HybridMode(TrainingMode):
    """``Strategy(mode="hybrid")``: dense all-reduced per step, sparse pushed async."""

    prefetch_pulls = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        values = collectives.broadcast_array(self.dense.values(), timeout=self.collective_timeout)
        self.dense.set(values)
        self.local_dense = (
            DenseTable(DENSE_TABLE, self.dense.size, rule=self.dense_rule, init=values)
            if self.dense.size
            else None
        )
        self.queue = _push_queue(self.client, self.strategy)
        self._push_seen = 0.0
        self._batch = 0  # this step's local batch size (0: no data left)
        self._active = 1  # workers with data in the last step

    # -- the step loop -----------------------------------------------------------------

    def steps(self, source: Iterable) -> Iterator:
        iterator, exhausted = iter(source), False
        while True:
            item = None if exhausted else next(iterator, None)
            exhausted = item is None
            self._batch = 0 if item is None else len(item[0])
            yield item
            if not self._active:  # the step's all-reduce: no worker had data
                return

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        for table, keys, grad, shows, clicks in grads:
            if len(keys):
                self.queue.put_sparse(table, keys, grad, shows, clicks)
        size = self.dense.size
        buffer = np.empty(size + 2, np.float32)  # counts exact below 2**24
        buffer[:size] = dense_grad
        buffer[:size] *= self._batch  # the loss is the local mean: back to a sum
        buffer[size:] = (self._batch, self._batch > 0)
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

    def close(self) -> None:
        self.queue.flush()
        self.queue.close()

    def timings(self) -> dict:
        stats = self.queue.stats()
        spent, self._push_seen = stats.push_seconds - self._push_seen, stats.push_seconds
        return {"push_s": round(spent, 4)}


def _push_queue(client, strategy) -> PushQueue:
    """The background push queue of async mode, with its timeout and merge policy."""
    if strategy.rpc_timeout is not None:
        timeout, setting = strategy.rpc_timeout, "Strategy.rpc_timeout"
    else:
        timeout = client.timeout
        setting = "Strategy.rpc_timeout (default: the client's timeout, SPARSEPS_RPC_TIMEOUT)"
    return PushQueue(
        client, maxsize=strategy.push_queue_size, timeout=timeout, setting=setting,
        merge=policy_of(strategy),
    )  # fmt: skip


register_mode("hybrid", HybridMode)
