"""GPUPS mode: a pass's working set in device memory, sharded over the machine's workers.

``Strategy(mode="gpups", device="cuda"|"cpu"|"auto")``. Per pass (``train_from_dataset``
on an :class:`~sparseps.data.InMemoryDataset`):

1. **build**: each worker takes the unique keys of its share of the pass, per table
   (the trainer's own per-batch dedup, concatenated and deduplicated once), and sends
   each key to its owner, worker ``server_of(key, W)`` (all-to-all). Each owner gets
   its keys' whole rows (embedding and optimizer state: ``PSClient.pull_full``) into a
   :class:`~.gpups_table.DeviceTable` on its device. A shard larger than
   ``Strategy.gpups_memory_bytes`` is cut into sub-passes that fit (:mod:`.gpups_split`),
   decided on every worker before anything is pulled. With the next pass prepared
   during this one (``Trainer.train_from_dataset(next_dataset=...)``) its keys are known
   and its rows at hand when it begins (:mod:`.gpups_build`: carried over from this
   pass's final rows, or pulled while it trained).
2. **train**: every step on the device (:mod:`.gpups_step`), like sync mode (workers
   in lock-step over the global batch): a batch's keys go to their owners and the rows
   come back as device tensors bound to the model, which lives on the device with its
   dense optimizer row (:mod:`.gpups_device`); the backward's gradients, with show/click
   counts, go to the owners, which sum them per key and apply the table's rule as torch
   kernels (:mod:`sparseps.optim.device_rules`); the dense gradient is summed over the
   workers and stepped there too. Rows and gradients travel device to device (NCCL on
   CUDA, gloo on CPU). So one GPUPS step is one sync step: the same rows, sums and rules.
3. **write back**: each owner writes its rows whole (final embedding and optimizer
   state) with the pass's show/click counts (``PSClient.write_rows``: an overwrite,
   safe because each key has one owner) and frees the device table. The servers then
   hold exactly the device table's final rows and state: checkpoints, inference saves,
   decay/shrink, evaluation and a new job read it as after any other mode.

Outside a pass (evaluation, prediction) pulls read the servers as in sync mode. The rows
of a pass that fails are dropped, not written back: the servers keep the sparse model of
the last completed pass (the dense parameters keep the steps it made, as in sync mode).
With the next pass prepared, the write-back is left in flight and settles during the
next pass's first step (:meth:`GpuPsMode.settle_write_back`), before any server read.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from ..config import Admission
from ..core import collectives
from ..core.keysets import unique_keys
from ..core.routing import server_of
from ..errors import ConfigError
from ..optim.device_rules import check_device_rule
from .gpups_admit import check_admission
from .gpups_build import (
    Carry,
    NextPass,
    WriteBack,
    agree_groups,
    check_pass_dataset,
    exchange_early,
    full_width,
    pass_keys,
    pick_rows,
)
from .gpups_device import DeviceDense, DeviceExchange, resolve_device, to_device
from .gpups_inputs import InputStager, step_inputs
from .gpups_split import SubPasses, check_budget
from .gpups_step import DeviceSteps
from .gpups_table import DeviceTable
from .modes import SyncMode

__all__ = ["GpuPsMode", "resolve_device"]

log = logging.getLogger(__name__)

_pass_keys = pass_keys  # the name the tests know

#: PassResult.timings of a GPUPS pass: the build, the write-back (the results copied off
#: the device and the writes sent), the wait for an earlier write-back still in flight,
#: the background preparation of the next pass, the sub-passes it was cut into, the
#: steps' time in the exchanges (waits for the other workers included) and the rules,
#: and ``prepared`` (1: the pass's build took a pass prepared while the one before trained)
TIMINGS = ("build_s", "write_back_s", "write_back_wait_s", "next_pass_s", "sub_passes",
           "exchange_s", "rule_s", "prepared")  # fmt: skip


class GpuPsMode(SyncMode):
    """Sync-mode steps over a pass-resident, device-sharded table (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.device = resolve_device(self.config.device, self.rank)
        self.world = max(collectives.world_size(), 1)
        self.configs = {c.name: c for c in sorted(self.tables, key=lambda c: c.name)}
        for config in self.configs.values():
            check_device_rule(config.rule, config.name)
            check_device_rule(config.accessor.embed_rule_or(config.rule), config.name)
            if config.accessor.cvm:
                raise ConfigError(
                    f"table {config.name!r}: Strategy(mode='gpups') does not pull show/click "
                    "(accessor.cvm): a pass's rows are trained on the device, where the "
                    "servers' counts are not; train this table with mode='sync' or 'async'"
                )
            check_admission(config)
        self.shards: dict[str, DeviceTable] | None = None  # during a pass
        self._split: SubPasses | None = None  # a pass over the budget, in sub-passes
        self._begun = 0  # passes begun (NextPass.target counts them)
        self._local: dict[str, np.ndarray] = {}  # this worker's keys of the running pass
        self._next: NextPass | None = None  # the next pass, prepared in the background
        self._carry: dict[str, Carry] | None = None  # the last pass's rows, for the next
        self._rows_after: dict[str, int] = {}  # the servers' row counts after its write-back
        self.groups: list[list[str]] = [[name] for name in self.configs]
        self._steps: DeviceSteps | None = None  # during a pass
        self._pending: WriteBack | None = None  # the last pass's write-back, in flight
        self.exchange = DeviceExchange(self.device, self.collective_timeout)
        self._stager = InputStager(self.device)  # a step's inputs, one step ahead
        self.device_dense = None
        if self.local_dense is not None:  # the model's parameters move to the device
            for param in self.dense.params:
                param.data = param.data.to(self.device)
            self.device_dense = DeviceDense(
                self.dense.params, self.dense_rule, self.local_dense.export(), self.device
            )
        self._timings = dict.fromkeys(TIMINGS, 0.0)
        self.last_build: dict = {}
        log.info(
            "GPUPS mode: worker %d trains its shard of each pass on %s", self.rank, self.device
        )

    # -- build ---------------------------------------------------------------------------

    def begin_pass(self, dataset: Iterable, lookups: Callable, index: int) -> None:
        """Build this worker's shard of the pass's working set (collective); a pass over
        the device budget is split into sub-passes (:mod:`.gpups_split`)."""
        check_pass_dataset(dataset)
        start = time.perf_counter()
        prepared = self._take_next(dataset)
        if prepared is not None:
            local, shared, early = prepared.local, prepared.shared, prepared.early
        else:
            local, shared = pass_keys(dataset, lookups, list(self.configs))
            early = {}
        carry = self._take_carry()
        if carry is None:
            early = {}  # the servers' rows changed between the passes (a shrink)
            self.settle_write_back()  # everything is pulled: the writes land first
        self._local = local
        nxt = self._next
        if nxt is not None:  # prepared for the pass after this one: its pulls may start
            nxt.exclude = local
            self._release_next()
        self._begun += 1
        self._split = None
        if not self._build(local, shared, early, carry, index, start):
            total = self._total_steps(dataset)
            self._split = SubPasses(dataset, lookups, list(self.configs), index, total)
            self._next_sub_pass()

    def _total_steps(self, dataset) -> int:
        """The pass's global steps: the most batches a worker has (sync lock-step)."""
        mine = np.zeros(self.world, np.int64)
        mine[self.rank] = sum(1 for _ in dataset)
        return int(collectives.all_reduce_sum(mine, timeout=self.collective_timeout).max())

    def _next_sub_pass(self) -> None:
        """Build the longest run of the pass's next steps that fits the budget (halving
        the run until it does; a single step is built whatever its size)."""
        split = self._split
        assert split is not None
        self.settle_write_back()
        while True:
            start = time.perf_counter()
            local, shared = split.keys(split.start, split.stop)
            if self._build(local, shared, {}, None, split.index, start, force=split.single):
                break
            split.halve()
        log.info("GPUPS pass %d: over Strategy.gpups_memory_bytes=%s, sub-pass %d trains "
                 "steps %d..%d of %d", split.index, self.config.memory_bytes, split.built,
                 split.start, split.stop, split.total)  # fmt: skip
        split.built += 1
        self._timings["sub_passes"] += 1

    def _build(self, local: dict, shared: np.ndarray, early: dict, carry, index: int,
               start: float, *, force: bool = False) -> bool:  # fmt: skip
        """Route the keys to their owners and fill the device tables; False (nothing
        pulled) when a worker's shard is over the budget, unless ``force``."""
        laps = [time.perf_counter()]  # phases: keys, route (+ waiting for the others), rows
        self.groups = agree_groups(list(self.configs), shared, self.collective_timeout)
        timeout = self.collective_timeout
        owned = {}
        for group in self.groups:  # tables of a group share their keys: route them once
            keys = local[group[0]]
            order, counts = self._owners(keys)
            received, _ = collectives.all_to_all_rows(keys[order], counts, timeout=timeout)
            owned.update(dict.fromkeys(group, unique_keys(received)))
        fits, anyone_early = check_budget(
            owned, self.configs, self.config.memory_bytes, self.rank, self.world,
            early=bool(early), timeout=timeout,
        )  # fmt: skip
        if not fits and not force:
            return False
        laps.append(time.perf_counter())
        received_early = {}
        if anyone_early:
            received_early = exchange_early(
                self.groups, early, owned, self.configs, self.collective_timeout
            )
        self.shards, sources = self._fill(owned, carry, received_early)
        self._steps = DeviceSteps(
            self.shards, self.groups, self.configs, self.exchange, self.device_dense,
            timeout=self.collective_timeout,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        self._timings["build_s"] += seconds
        self.last_build = {
            "pass": index,
            "keys": {name: len(shard) for name, shard in self.shards.items()},
            "bytes": sum(shard.nbytes for shard in self.shards.values()),
            "seconds": round(seconds, 4),
            **sources,
            "phases_s": dict(
                zip(
                    ("keys", "route", "rows"),
                    np.round(np.diff([start, *laps, start + seconds]), 4).tolist(),
                    strict=True,
                )
            ),  # fmt: skip
        }
        log.info("GPUPS pass %d built: %s", index, self.last_build)
        return True

    def prefetch_pass(self, dataset: Iterable, lookups: Callable) -> None:
        """Prepare the pass after the running one (or, between passes, after the next one)
        over ``dataset`` in the background: its keys now, and the whole rows of those not
        in the running pass once it has begun (:mod:`.gpups_build`). Its build then
        takes them, with the running pass's final rows for the keys they share; a
        different dataset, or another pass in between, drops them. Not a collective."""
        check_pass_dataset(dataset)
        if self._next is not None:
            self._next.cancel()
        running = self.shards is not None
        self._next = NextPass(
            dataset, lookups, list(self.configs), self.client,
            target=self._begun if running else self._begun + 1,
        )  # fmt: skip
        if running:
            self._next.exclude = self._local
            self._release_next()

    def _release_next(self) -> None:
        """Let the next pass's early pulls start, once no write-back is in flight (a row
        read before the last pass's write lands would be stale)."""
        if self._pending is None and self._next is not None:
            self._next.start_pulls.set()

    def _take_next(self, dataset) -> NextPass | None:
        """The prepared pass, if it is this one (else dropped, or kept for the next)."""
        nxt = self._next
        if nxt is None or nxt.target == self._begun + 1:
            return None
        self._next = None
        # a wrapper that yields a dataset's batches unchanged names it (``pass_data``:
        # the online driver's CountingDataset), so a pass prepared over it is this one
        if nxt.target != self._begun or nxt.dataset is not getattr(dataset, "pass_data", dataset):
            nxt.cancel()
            log.info("GPUPS: the prepared pass is not this one (another dataset or pass); dropped")
            return None
        usable = nxt.result(self.collective_timeout)
        self._timings["next_pass_s"] += nxt.seconds
        self._timings["prepared"] = float(usable)
        return nxt if usable else None

    def _take_carry(self) -> dict[str, Carry] | None:
        """The last pass's final rows, if the servers still hold them as it left them."""
        carry, self._carry = self._carry, None
        if carry is None or self._pending is not None:  # in flight: nothing ran between
            return carry
        now = self._server_rows()
        if now != self._rows_after:
            log.info("GPUPS: rows changed on the servers since the last pass (%s -> %s): "
                     "its carry-over is dropped", self._rows_after, now)  # fmt: skip
            return None
        return carry

    def _server_rows(self) -> dict[str, int]:
        tables = self.client.stats()["total"]["tables"]
        return {name: int(tables.get(name, {}).get("rows", -1)) for name in self.configs}

    def _fill(self, owned: dict, carry, early: dict) -> tuple[dict[str, DeviceTable], dict]:
        """Each owned table's rows: carried, early, or pulled now (:mod:`.gpups_build`)."""
        counts = {"carried": 0, "early": 0, "pulled": 0}
        picked, handles = {}, {}
        for group in self.groups:
            has, erows = early.get(group[0], (None, None))
            at = 0
            for name in group:
                width = full_width(self.configs[name])
                part = None if erows is None else erows[:, at : at + width]
                at += width
                table_carry = None if carry is None else carry.get(name)
                rows, need, got = pick_rows(owned[name], table_carry, has, part, width)
                picked[name] = (rows, need)
                for key in got:
                    counts[key] += got[key]
                if need.size:
                    handles[name] = self.client.pull_full(name, owned[name][need])
                    counts["pulled"] += int(need.size)
        counted = [n for n in picked if self.configs[n].lifecycle.admission != Admission.ALWAYS]
        if counted:  # the servers' counters include the last pass's write-back
            self.settle_write_back()
        states = {name: self.client.pull_counts(name, owned[name]) for name in counted}
        shards = {}
        for name, (rows, need) in picked.items():
            if name in handles:
                rows[need] = handles[name].wait()
            dim = self.configs[name].dim
            shards[name] = DeviceTable(
                self.configs[name], owned[name], rows[:, :dim], rows[:, dim:], self.device,
                counts=states[name].wait() if name in states else None,
            )  # fmt: skip
        return shards, counts

    def _owners(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(order, counts)``: ``keys[order]`` grouped by owner, ``counts[w]`` per owner."""
        if self.world == 1:
            return np.arange(keys.size), np.array([keys.size], np.int64)
        owner = server_of(keys, self.world) if keys.size else np.zeros(0, np.int64)
        order = np.argsort(owner, kind="stable")
        return order, np.bincount(owner, minlength=self.world).astype(np.int64)

    # -- per step: on the device (gpups_step) ----------------------------------------------

    def place_model(self, model: torch.nn.Module) -> None:
        """The model (parameters and buffers) on this worker's device."""
        model.to(self.device)
        if self.device_dense is not None:
            self.device_dense.import_(self.device_dense.export())  # params alias its row

    def pull_rows(self, keys: dict[str, np.ndarray]) -> dict:
        """During a pass: the step's rows from the owners' device tables, as device tensors
        (:class:`~.gpups_step.DeviceSteps`); otherwise from the servers, onto the device."""
        if self._steps is None:
            if self._pending is not None:  # settled by refresh_dense, collectively,
                self._pending.wait()  # before an evaluation: this worker's writes at least
            rows = super().pull_rows(keys)
            return {name: to_device(r, self.device) for name, r in rows.items()}
        return self._steps.rows(keys)

    def step_grads(self, binder, lookups: dict, leaves: dict, dense) -> tuple[list, object]:
        """The step's gradients where the backward left them: on the device."""
        if self._steps is None:
            return super().step_grads(binder, lookups, leaves, dense)
        grads = [
            (table, lookup.keys, leaves[table].grad, lookup.shows, lookup.clicks)
            for table, lookup in lookups.items()
        ]
        return grads, None if self.device_dense is None else self.device_dense.grads()

    def steps(self, source: Iterable) -> Iterator:
        """Sync mode's lock-step, its header folded into the keys' routing
        (``DeviceSteps.announce``: one collective)."""
        if self._steps is None:
            yield from super().steps(source)  # outside a pass: apply() says what is wrong
            return
        iterator = iter(source)
        item = next(iterator, None)
        staged = self._stager.stage(step_inputs(item))
        try:
            for step in itertools.count():
                split = self._split
                if split is not None and step == split.stop < split.total:  # the next sub-pass
                    self._write_back(defer=False)
                    split.advance()
                    self._next_sub_pass()
                assert self._steps is not None, "a pass's steps run over its device tables"
                keys = None if item is None else {t: lk.keys for t, lk in item[1].items()}
                active, self.global_batch = self._steps.announce(
                    keys, 0 if item is None else len(item[0])
                )
                if not active:
                    return
                # the next step's inputs go to the device while this one computes
                following = None if item is None else next(iterator, None)
                ahead = self._stager.stage(step_inputs(following))
                self._steps.inputs = staged.take()
                if item is None:
                    self._steps.rows({})  # no data left here: still answer the owners' exchange
                yield item
                item, staged = following, ahead
        except GeneratorExit:  # the pass was abandoned (an error): its rows are not written
            self.shards, self._steps = None, None  # back, later pulls read the servers
            raise

    def apply(self, grads: list, dense_grad) -> None:
        if self._steps is None:
            raise ConfigError(
                "GPUPS mode: a training step outside a pass; train with "
                "Trainer.train_from_dataset (it builds the pass's working set first)"
            )
        self._steps.apply(grads, dense_grad)
        self.step += 1
        self.settle_write_back()  # the last pass's write-back overlapped this first step

    def save_dense(self, directory) -> str:
        if self.device_dense is not None and self.local_dense is not None:
            self.local_dense.import_(self.device_dense.export())
        return super().save_dense(directory)

    def load_dense_local(self, path) -> None:
        """After a checkpoint load: the servers' rows are not the ones prepared; the
        loaded dense row goes to the device."""
        super().load_dense_local(path)
        if self.device_dense is not None and self.local_dense is not None:
            self.device_dense.import_(self.local_dense.export())
        self._drop_prepared()

    # -- write back ----------------------------------------------------------------------

    def finish_pass(self) -> None:
        """The pass's (or its last sub-pass's) write-back (:meth:`_write_back`)."""
        self._split = None
        self._write_back(defer=True)

    def _write_back(self, *, defer: bool) -> None:
        """Write every owned row whole, with its counts, to the servers; free the device
        rows (kept on the host as the next pass's carry-over when it is prepared). With
        the next pass prepared the writes are left in flight: the next pass builds from
        the carry-over and its first step waits for them (:meth:`settle_write_back`)."""
        if self.shards is None:
            return
        self.settle_write_back()  # the last pass's writes land before this one's
        start = time.perf_counter()
        jobs = [
            (name, shard.result(), self.configs[name].dim) for name, shard in self.shards.items()
        ]
        carry = {name: Carry(result["key"], result["rows"]) for name, result, _ in jobs}
        if self._steps is not None:  # the steps' exchange and rule seconds
            for key, seconds in self._steps.seconds.items():
                self._timings[key] += seconds
        self.shards, self._steps = None, None
        nxt = self._next
        keep = defer and nxt is not None and nxt.target == self._begun  # the next pass
        if defer and self.world > 1:  # every worker leaves its writes in flight, or none:
            # settling them is a collective (a worker may hold no prepared pass: e.g. the
            # online driver prepares one only once its data is loaded, on each worker)
            votes = collectives.all_reduce_sum(
                np.array([int(keep)], np.int64), timeout=self.collective_timeout
            )  # fmt: skip
            keep = int(votes[0]) == self.world
        self._pending = WriteBack(self.client, jobs, background=keep)  # takes the rows
        if keep:
            self._carry = carry
        else:
            self.settle_write_back(timing="write_back_s")
        self._timings["write_back_s"] += time.perf_counter() - start

    def settle_write_back(self, *, timing: str = "write_back_wait_s") -> None:
        """The last pass's write-back is on the servers, every worker's (a collective when
        one is in flight: every worker has one then). Runs before anything reads the
        servers: a step of the next pass, its build when it pulls, an evaluation, a
        checkpoint, decay and shrink (``quiesce``). ``timing``: the PassResult.timings
        key its wait counts in (a deferred write-back's: ``write_back_wait_s``)."""
        if self._pending is None:
            return
        start = time.perf_counter()
        pending, self._pending = self._pending, None
        pending.wait()
        collectives.barrier(timeout=self.collective_timeout)  # the servers hold every pass row
        if self._carry is not None:
            self._rows_after = self._server_rows()
        self._release_next()  # its early pulls may read the written rows now
        self._timings[timing] += time.perf_counter() - start

    def refresh_dense(self) -> None:
        self.settle_write_back()

    def quiesce(self) -> None:
        self.settle_write_back()
        super().quiesce()

    def _drop_prepared(self) -> None:
        if self._next is not None:
            self._next.cancel()
        self._next, self._carry = None, None

    def close(self) -> None:
        if self._pending is not None:
            self._pending.wait()
        self.shards, self._steps, self._pending = None, None, None
        self._drop_prepared()

    def timings(self) -> dict:
        out = {k: round(v, 4) for k, v in self._timings.items()}
        self._timings = dict.fromkeys(self._timings, 0.0)
        return out
