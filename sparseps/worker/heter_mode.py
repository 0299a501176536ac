"""Heter mode, the trainer side: embeddings here, the dense network on a heter worker.

A trainer of a job with heter workers (``sparseps launch --heter-worker-num H``) reads
its data, pulls and pools the sparse embeddings as in async mode, and sends each step's
pooled outputs with the batch's dense features and labels to heter worker ``rank % H``
(:mod:`.heter_service`), which runs the dense network forward and backward and sends back the
gradients of the pooled outputs; the trainer finishes the backward into its pulled rows
and pushes the sparse gradients. Up to ``Strategy.heter_window`` steps are in flight per
trainer, so the trainer prepares and pools the next batches while the heter worker
computes (the rows of a step in flight are pulled before the steps ahead of it pushed
theirs: async mode's staleness, by at most the window). The dense parameters live in the
servers' dense table, as in async mode: the heter worker pushes their gradients, and a
trainer pulls them before it evaluates or saves.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from .. import role
from ..errors import ConfigError
from ..rpc.channel import Channel
from ..rpc.handle import Handle
from ..rpc.protocol import Limits
from ..rpc.security import security_from_env
from .heter_ops import HETER_OPS
from .heter_wire import join, split
from .losses import LossOutput
from .modes import AsyncMode

__all__ = ["HeterMode"]


class HeterMode(AsyncMode):
    """``Strategy(mode="heter")``; a job with heter workers promotes async mode to it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        env = role.role_env()
        heter_workers = () if env is None else env.heter_workers
        if not heter_workers:
            raise ConfigError(
                "Strategy(mode='heter') needs heter workers: sparseps launch "
                "--heter-worker-num H (SPARSEPS_HETER_WORKERS lists them)"
            )
        self.heter_rank = self.rank % len(heter_workers)
        self.channel = Channel(
            heter_workers,
            timeout=self.client.timeout
            if self.strategy.rpc_timeout is None
            else self.strategy.rpc_timeout,
            timeout_setting="Strategy.rpc_timeout",
            max_in_flight=max(4, 2 * self.config.window),
            limits=Limits(),
            security=security_from_env(),
            job_id=self.client.job_id,
            role="heter_worker",
            ops=HETER_OPS,
        )
        self._seconds: collections.defaultdict[str, float] = collections.defaultdict(float)

    def _call(
        self, op: str, bufs=(), args: dict | None = None, *, rank: int | None = None
    ) -> Handle:
        rank = self.heter_rank if rank is None else rank
        call = self.channel.submit(rank, op, None, bufs, args)
        return Handle(self.channel, [call], lambda replies: replies[0])

    def step_target(self) -> tuple[int, dict]:
        """The heter worker of the next step and what its request adds (async: this
        trainer's heter worker, nothing)."""
        return self.heter_rank, {}

    def compute(self, items: Iterable, step: Callable, binder) -> Iterator:
        """``(item, (grads, dense_grad, loss, out))`` per step, ``heter_window`` in flight."""
        window: collections.deque = collections.deque()
        for item in items:
            window.append(self._send(item, binder))
            if len(window) >= self.config.window:
                yield self._finish(window.popleft(), binder)
        while window:
            yield self._finish(window.popleft(), binder)

    def _send(self, item, binder) -> tuple:
        batch, lookups, rows = item
        start = time.perf_counter()
        if rows is None:
            rows = self.pull_rows({t: lk.keys for t, lk in lookups.items()})
            self._seconds["pull_s"] += time.perf_counter() - start
            start = time.perf_counter()
        leaves = binder.bind(batch, lookups, rows, grad=True)
        outputs = [emb(batch) for emb in binder.embeddings]
        binder.unbind()
        if not all(isinstance(o, torch.Tensor) for o in outputs):
            raise ConfigError(
                "heter mode splits a model at pooled SparseEmbedding outputs; a module with "
                "pooling=None returns unpooled rows, which heter workers do not take"
            )
        flat, shapes = join(outputs)
        labels = np.asarray(batch.label, np.float32).reshape(-1, 1)
        if batch.extra_labels is not None:
            labels = np.concatenate([labels, np.asarray(batch.extra_labels, np.float32)], axis=1)
        rank, extra = self.step_target()
        handle = self._call(
            "heter_step",
            [np.ascontiguousarray(batch.dense, np.float32), np.ascontiguousarray(labels), flat],
            {"shapes": shapes, "scale": self.loss_scale(len(batch)), **extra},
            rank=rank,
        )
        self._seconds["compute_s"] += time.perf_counter() - start
        return item, lookups, leaves, outputs, shapes, handle

    def _finish(self, sent: tuple, binder) -> tuple:
        item, lookups, leaves, outputs, shapes, handle = sent
        start = time.perf_counter()
        reply = handle.wait()
        waited = time.perf_counter()
        self._seconds["heter_wait_s"] += waited - start
        grads, predictions, labels = reply.bufs
        parts = [torch.from_numpy(np.array(g)) for g in split(grads, shapes)]
        torch.autograd.backward(outputs, parts)
        sparse = binder.grads(lookups, leaves)
        self._seconds["compute_s"] += time.perf_counter() - waited
        loss = float(reply.result["loss"])
        out = LossOutput(torch.tensor(loss), np.array(predictions), np.array(labels))
        return item, (sparse, np.zeros(0, np.float32), loss / max(len(item[0]), 1), out)

    def flush_heter(self) -> dict:
        """The heter worker's dense updates are applied; its busy/idle seconds."""
        report = self._call("heter_flush").wait().result
        for key in ("busy_s", "idle_s"):
            self._seconds[f"heter_{key}"] += float(report[key])
        return report

    def quiesce_local(self) -> None:
        super().quiesce_local()
        self.flush_heter()

    def close(self) -> None:
        super().quiesce_local()  # AsyncMode's: not the heter worker, which may be gone
        self.queue.close()
        self.channel.close()

    def timings(self) -> dict:
        out = super().timings()
        out.update({k: round(v, 4) for k, v in self._seconds.items()})
        self._seconds.clear()
        return out
