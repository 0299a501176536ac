"""Sync mode with backup workers: ``Strategy(mode="sync", backup_workers=B)``.

Each step goes on with the first ``A = W - B`` workers' gradients; a later worker's
gradients for that step are dropped and counted, and that worker catches up (it skips to
the step the others are on) instead of stalling the job (TensorFlow's
``SyncReplicasOptimizer`` with backup workers).

Why the rendezvous store and not gloo: gloo collectives need every worker, which is what
backup workers must avoid. Admission is one atomic ``add`` on the store (a ticket per
step, first come first served); the dense gradients travel as bytes through the store
(they are small: the MLP of a CTR model), the sparse ones go straight to the servers.

One step ``s``, on a worker that takes part in it:

1. compute on rows pulled after step ``s-1`` completed; take ticket ``n`` of step ``s``;
2. ``n <= A``: push the sparse gradients, wait until applied, then write the dense
   gradient to slot ``n`` of step ``s``; ``n > A``: late: drop both (counted);
3. read slots ``1..A`` of step ``s`` (waiting for them), sum them in slot order and apply
   the dense optimizer rule locally: every worker adds the same numbers in the same order,
   so dense parameters stay bit-identical across workers, as in sync mode.

After a late step a worker reads how many steps were opened (``head``); when it is behind
it applies the dense updates of the steps it missed, drops a batch of its data for each
(so it reads at the others' pace) and joins the newest. A worker whose data
ran out keeps filling slots of the steps the others open with empty gradients (so ``A``
contributions keep arriving) until every worker is out of data; while the workers still
reading could make a step alone, it first gives them about a step's time. The last reader of a step
deletes its keys.

What it gives up against plain sync: there is no barrier between steps, so a worker may
pull rows that already carry a faster worker's pushes of the next step; each admitted
worker's sparse push is applied on its own (an update per worker, not one of the sum); a
late worker's batch is not trained. Per pass, :meth:`BackupSyncMode.timings` reports
``late_dropped`` (steps whose gradients this worker dropped), ``steps_skipped``
(steps it caught up over, dropping a batch for each), ``dropped_rows`` (about the rows of
both: batches are counted at the size of this worker's last one) and ``store_s``.
"""

from __future__ import annotations

import itertools
import logging
import time

import numpy as np

from ..core import collectives, worker_store
from ..errors import ConfigError, DeadlineError
from .modes import SyncMode

__all__ = ["BackupSyncMode"]

log = logging.getLogger(__name__)

_SETTING = "Strategy.collective_timeout"
# every worker builds its modes in the same order: the n-th one of each process shares keys
_instances = itertools.count()


class BackupSyncMode(SyncMode):
    """Sync steps that need only the first ``W - backup_workers`` workers (module doc).

    Raises:
        ConfigError: ``Strategy.backup_workers`` is not below the worker count.
    """

    def __init__(self, *args, **kwargs):
        strategy = args[3] if len(args) > 3 else kwargs["strategy"]
        world, backup = collectives.world_size(), strategy.mode.backup_workers
        if backup >= world:
            raise ConfigError(
                f"Strategy.backup_workers: expected fewer than the {world} worker(s) of this "
                f"job (at least one worker's gradients must make a step), got {backup}"
            )
        super().__init__(*args, **kwargs)
        self.store = worker_store.current()
        self.world, self.need = world, world - backup
        self._job = f"sparseps/backup/{next(_instances)}"
        self._prefix = f"{self._job}/0"
        self.s = 0  # steps whose dense update this worker applied (this pass)
        self._late = False  # this worker's last step was late: it may be behind
        self._batch_rows = 0  # rows of this worker's last batch (for the dropped-rows count)
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.late_dropped = self.skipped = self.dropped_rows = 0
        self.store_s = 0.0

    # -- store helpers ---------------------------------------------------------------------

    def _add(self, key: str, amount: int) -> int:
        start = time.perf_counter()
        value = int(self.store.add(f"{self._prefix}/{key}", amount))
        self.store_s += time.perf_counter() - start
        return value

    def _timed(self, call, *args):
        start = time.perf_counter()
        out = call(*args)
        self.store_s += time.perf_counter() - start
        return out

    def _apply_step(self, step: int) -> None:
        """Read step ``step``'s admitted dense gradients, apply their sum, free the step."""
        keys = [f"{self._prefix}/{step}/g{n}" for n in range(1, self.need + 1)]
        parts = [self._timed(self.store.get, key) for key in keys]
        if self.local_dense is not None:
            total = np.zeros(self.dense.size, np.float32)
            for part in parts:  # slot order: the same sum, bit for bit, on every worker
                if part:
                    total += np.frombuffer(part, np.float32)
            self.local_dense.push(total)
            self.dense.set(self.local_dense.pull())
        self.s = step + 1
        if self._add(f"{step}/read", 1) == self.world:  # the last reader frees the step
            for key in [*keys, f"{self._prefix}/{step}/n", f"{self._prefix}/{step}/read"]:
                self._timed(self.store.delete_key, key)

    def _catch_up(self) -> int:
        """Apply the steps the others completed meanwhile; join the newest one opened.
        Returns how many steps this worker missed."""
        head = self._add("head", 0)
        target = max(self.s, head - 1)
        behind = target - self.s
        self._late = False
        self.skipped += behind
        self.dropped_rows += behind * self._batch_rows
        while self.s < target:
            self._apply_step(self.s)
        return behind

    # -- the TrainingMode interface --------------------------------------------------------

    def begin_pass(self, dataset, lookups, index: int) -> None:
        self._prefix = f"{self._job}/{index}"
        self.s, self._late = 0, False

    def steps(self, source):
        if self.store is None:  # one worker (backup_workers=0 never gets here)
            yield from source
            return
        iterator = iter(source)
        for item in iterator:
            # a batch per step missed is dropped: the worker reads at the others' pace
            # only a worker whose last step was late can be behind (no round trip otherwise)
            for _ in range(self._catch_up() if self._late else 0):
                item = next(iterator, None)
                if item is None:
                    break
            if item is None:
                break
            yield item
        self._drain()

    def _drain(self) -> None:
        """Out of data: fill the steps the others open with empty gradients until every
        worker is out of data (so ``need`` contributions keep arriving)."""
        finished = self._add("finished", 1)
        start, pause = time.perf_counter(), 0.0005
        interval, last = 0.05, start  # a step's duration, as seen from here (moving mean)
        opened = None  # when this worker saw step self.s open
        while True:
            if self.s < self._add("head", 0):
                now = time.perf_counter()
                opened = now if opened is None else opened
                # while the active workers alone can make the step, give them about a
                # step's time first: an empty slot would push one's gradients out
                if (
                    self.world - finished >= self.need
                    and now - opened < interval
                    and self._add(f"{self.s}/n", 0) < self.need
                ):
                    time.sleep(min(pause, interval))
                    finished = self._add("finished", 0)
                    continue
                ticket = self._add(f"{self.s}/n", 1)
                if ticket <= self.need:
                    self._timed(self.store.set, f"{self._prefix}/{self.s}/g{ticket}", b"")
                self._apply_step(self.s)
                now = time.perf_counter()
                interval, last, opened = 0.8 * interval + 0.2 * (now - last), now, None
                start, pause = now, 0.0005
                continue
            # finished first, head second: once all are out of data no step opens any more
            if self._add("finished", 0) >= self.world and self.s >= self._add("head", 0):
                return
            waited = time.perf_counter() - start
            if waited > self.collective_timeout:
                raise DeadlineError(
                    f"worker {self.rank}: out of data, waited {waited:.1f} s for the other "
                    f"workers to open a step or finish (backup sync, step {self.s}); check "
                    f"their logs, or raise {_SETTING}",
                    op="backup sync drain", role="worker", seconds=waited, setting=_SETTING,
                )  # fmt: skip
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def loss_scale(self, batch_size: int) -> float:
        self._batch_rows = batch_size
        # the A admitted gradients are summed: each worker's loss is its share of the mean
        return float(max(batch_size, 1) * self.need)

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        if self.store is None:
            super().apply(grads, dense_grad)
            return
        step = self.s
        ticket = self._add(f"{step}/n", 1)
        if ticket == 1:
            self._add("head", 1)  # step `step` is open (head == step + 1)
        if ticket <= self.need:
            handles = [
                self.client.push(table, keys, grad, shows=shows, clicks=clicks)
                for table, keys, grad, shows, clicks in grads
            ]
            for handle in handles:
                handle.wait()
            payload = np.ascontiguousarray(dense_grad, np.float32).tobytes()
            self._timed(self.store.set, f"{self._prefix}/{step}/g{ticket}", payload)
        else:
            self.late_dropped += 1
            self._late = True
            self.dropped_rows += self._batch_rows
        self._apply_step(step)
        self.step += 1

    def timings(self) -> dict:
        out = {
            "late_dropped": self.late_dropped,
            "steps_skipped": self.skipped,
            "dropped_rows": self.dropped_rows,
            "store_s": round(self.store_s, 4),
        }
        if self.late_dropped or self.skipped:
            log.info(
                "backup sync: dropped %d late step(s), caught up over %d step(s) this pass",
                self.late_dropped, self.skipped,
            )  # fmt: skip
        self._reset_stats()
        return out
