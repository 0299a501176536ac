"""Heter mode, the trainer side: embeddings here, the dense network on a heter worker.

A trainer of a job with heter workers (``sparseps launch --heter-worker-num H``) reads
its data, pulls and pools the sparse embeddings as in async mode, and sends each step's
pooled outputs with the batch's dense features and labels to a heter worker (the one the
throughput it measured says answers first, :mod:`.heter_routing`), which runs the dense
network forward and backward (:mod:`.heter_service`) and sends back the gradients of the
pooled outputs; the trainer finishes the backward into its pulled rows
and pushes the sparse gradients. Up to ``Strategy.heter_window`` steps are in flight per
trainer, so the trainer prepares and pools the next batches while the heter worker
computes (the rows of a step in flight are pulled before the steps ahead of it pushed
theirs: async mode's staleness, by at most the window). The dense parameters live in the
servers' dense table, as in async mode: the heter worker pushes their gradients, and a
trainer pulls them before it evaluates or saves.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .. import role
from ..errors import ConfigError, DeadlineError, UnavailableError
from ..rpc.channel import Channel
from ..rpc.handle import Handle
from ..rpc.protocol import Limits
from ..rpc.security import security_from_env
from .heter_ops import HETER_OPS
from .heter_routing import HeterRouter
from .heter_wire import join, split
from .losses import LossOutput
from .modes import AsyncMode

__all__ = ["HeterMode"]

log = logging.getLogger(__name__)


@dataclass
class _Sent:
    """A step sent to a heter worker, until its reply."""

    item: tuple
    lookups: dict
    leaves: dict
    outputs: list
    shapes: list
    handle: Handle
    heter: int  # the heter worker it went to
    rows: int
    sent_at: float  # time.perf_counter()


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
            # a heter worker that dies fails the steps in flight to it at once (not after
            # rpc_timeout): the trainer counts them lost and waits for its restart
            detect_loss=True,
        )
        self.lost_steps = 0  # steps in flight to a heter worker when it died
        self.router = HeterRouter(len(heter_workers), home=self.heter_rank)
        self._seconds: collections.defaultdict[str, float] = collections.defaultdict(float)

    def _call(
        self, op: str, bufs=(), args: dict | None = None, *, rank: int | None = None
    ) -> Handle:
        rank = self.heter_rank if rank is None else rank
        call = self.channel.submit(rank, op, None, bufs, args)
        return Handle(self.channel, [call], lambda replies: replies[0])

    def step_target(self, rows: int) -> tuple[int, dict]:
        """The heter worker of the next step of ``rows`` rows and what its request adds
        (async: the one the router picks by measured throughput, nothing)."""
        return self.router.pick(rows), {}

    def compute(self, items: Iterable, step: Callable, binder) -> Iterator:
        """``(item, (grads, dense_grad, loss, out))`` per step, ``heter_window`` in flight
        (the steps in flight to a heter worker that died are lost: :meth:`_finished`)."""
        window: collections.deque = collections.deque()
        for item in items:
            window.append(self._send(item, binder))
            if len(window) >= self.config.window:
                yield from self._finished(window, binder)
        while window:
            yield from self._finished(window, binder)

    def _finished(self, window: collections.deque, binder) -> Iterator:
        """The oldest step of ``window`` done; when its heter worker died, every step in
        flight to it is dropped (counted, logged) and the trainer waits for the launcher
        to restart it (``--max-restarts``)."""
        sent = window.popleft()
        try:
            yield self._finish(sent, binder)
        except UnavailableError as exc:
            rank = sent.heter
            lost = [sent, *(s for s in window if s.heter == rank)]
            for other in lost[1:]:
                window.remove(other)
            for step in lost:
                self.router.lost(rank, step.rows)
            self.lost_steps += len(lost)
            self._seconds["heter_lost_steps"] += len(lost)
            log.warning(
                "trainer %d: heter worker %d at %s died (%s); the %d step(s) in flight to it "
                "are lost (their sparse and dense updates; %d lost so far); waiting for it "
                "to restart", self.rank, rank, self.channel.endpoints[rank], exc, len(lost),
                self.lost_steps,
            )  # fmt: skip
            self._await_restart(rank)

    def _await_restart(self, rank: int) -> None:
        """Reconnect to heter worker ``rank`` once a new process serves its port."""
        timeout = self.channel.timeout
        start = time.monotonic()
        deadline = start + timeout
        while True:
            try:
                self.channel.revive(rank, timeout=min(10.0, timeout))
                call = self.channel.submit(rank, "ping", None, (), None)
                self.channel.wait(call, min(deadline, time.monotonic() + 5.0), 5.0)
            except (UnavailableError, DeadlineError) as exc:
                if time.monotonic() >= deadline:
                    raise UnavailableError(
                        f"heter worker {rank} at {self.channel.endpoints[rank]} did not come "
                        f"back within {timeout:.3g} s ({exc}); the launcher restarts heter "
                        "workers while --max-restarts allows (Strategy.rpc_timeout bounds the "
                        "wait)", op="heter_step", role="heter_worker", rank=rank,
                        address=self.channel.endpoints[rank],
                    ) from None  # fmt: skip
                time.sleep(0.2)
                continue
            log.warning(
                "trainer %d: heter worker %d is back after %.1f s; training goes on",
                self.rank, rank, time.monotonic() - start,
            )  # fmt: skip
            return

    def _send(self, item, binder) -> _Sent:
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
        rank, extra = self.step_target(len(batch))
        handle = self._call(
            "heter_step",
            [np.ascontiguousarray(batch.dense, np.float32), np.ascontiguousarray(labels), flat],
            {"shapes": shapes, "scale": self.loss_scale(len(batch)), **extra},
            rank=rank,
        )
        sent_at = time.perf_counter()
        self._seconds["compute_s"] += sent_at - start
        return _Sent(item, lookups, leaves, outputs, shapes, handle, rank, len(batch), sent_at)

    def _finish(self, sent: _Sent, binder) -> tuple:
        item = sent.item
        start = time.perf_counter()
        reply = sent.handle.wait()
        waited = time.perf_counter()
        # the heter worker's throughput: its device batch's seconds per row (the trainer's
        # own wait would count the steps ahead of this one in its window)
        self.router.done(
            sent.heter, sent.rows, float(reply.result["device_s"]), int(reply.result["batch_rows"])
        )
        self._seconds["heter_wait_s"] += waited - start
        grads, predictions, labels = reply.bufs
        parts = [torch.from_numpy(np.array(g)) for g in split(grads, sent.shapes)]
        torch.autograd.backward(sent.outputs, parts)
        sparse = binder.grads(sent.lookups, sent.leaves)
        self._seconds["compute_s"] += time.perf_counter() - waited
        loss = float(reply.result["loss"])
        out = LossOutput(torch.tensor(loss), np.array(predictions), np.array(labels))
        return item, (sparse, np.zeros(0, np.float32), loss / max(len(item[0]), 1), out)

    def flush_heter(self) -> None:
        """The dense updates of every heter worker this trainer used are applied; their
        busy/idle seconds (since their last flush) go to the timings."""
        used = [h for h in range(self.router.count) if self.router.steps[h]] or [self.heter_rank]
        handles = [self._call("heter_flush", rank=h) for h in used]
        for handle in handles:
            report = handle.wait().result
            for key in ("busy_s", "idle_s"):
                self._seconds[f"heter_{key}"] += float(report[key])
        for h in used:
            self._seconds[f"heter_steps_{h}"] += self.router.steps[h]
            self.router.steps[h] = 0

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
