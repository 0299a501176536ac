"""Heter in sync mode, the trainer side: ``Strategy(mode=Heter(sync=True))``.

Sync mode's guarantee with the dense network on heter workers: each step is one step of
the global batch. The trainers keep sync mode's lock-step (a header all-gather per step:
who has data, the global batch) and its sparse half (every trainer's gradients
all-gathered, each pushing its share of keys, so the servers apply their sum once). Every
trainer sends step ``i`` to the same heter worker, ``i % H``, with the number of trainers
that contribute to it; that heter worker waits for all of them, stacks their rows in
trainer order, runs the dense network once (each request's loss scaled by the global
batch, so the dense gradient is the global batch's), pushes it to the servers' dense table
as one update and waits until it is applied before it answers (the next step, on another
heter worker, pulls the values after it). The result depends on the data alone, as sync
mode's does: an online job resumes to the same model bit for bit.

One step is in flight per trainer (sync mode pulls a step's rows after the previous
step's pushes); the heter workers take the steps in turn, so each computes one global
batch at a time.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

import numpy as np

from .heter_mode import HeterMode
from .modes import push_gathered_sparse
from .sync_exchange import exchange_headers, step_header

__all__ = ["HeterSyncMode"]


class HeterSyncMode(HeterMode):
    """``Strategy(mode=Heter(sync=True))`` (see the module docstring)."""

    prefetch_pulls = False  # a step's rows are pulled after the step before is applied

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_batch = self.contributing = self.step_no = 0
        self._dims = {config.name: config.dim for config in self.tables}
        self._buffer_sizes: np.ndarray | None = None
        self.heter_count = len(self.channel.endpoints)

    def steps(self, source: Iterable) -> Iterator:
        iterator = iter(source)
        while True:
            item = next(iterator, None)
            header = step_header(item, self._dims)
            self.contributing, self.global_batch, self._buffer_sizes = exchange_headers(
                header, timeout=self.collective_timeout
            )
            if not self.contributing:
                return
            yield item

    def compute(self, items: Iterable, step, binder) -> Iterator:
        for item in items:
            if item is None:  # this trainer's data ran out; the others' step goes on
                self.step_no += 1
                yield None, ([], np.zeros(0, np.float32), 0.0, None)
                continue
            # a step lost with a heter worker that died is lost on every trainer (they all
            # sent it there): each still takes part in the step's sparse exchange, empty
            done = list(self._finished(collections.deque([self._send(item, binder)]), binder))
            yield done[0] if done else (None, ([], np.zeros(0, np.float32), 0.0, None))
            self.step_no += 1

    def step_target(self, rows: int) -> tuple[int, dict]:
        return self.step_no % self.heter_count, {
            "sync": [self.step_no, self.contributing, self.rank]
        }

    def loss_scale(self, batch_size: int) -> float:
        return float(max(self.global_batch, 1))

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        sizes, self._buffer_sizes = self._buffer_sizes, None
        handles = push_gathered_sparse(
            self.client, grads, self.rank, sizes=sizes, timeout=self.collective_timeout
        )
        for handle in handles:
            handle.wait()
        self.step += 1
