"""The pass loop of streaming training (every worker runs it; saves are collective).

Per pass, in order:

1. take the pass's data, loaded in the background while the previous pass trained
   (:mod:`sparseps.online.pass_loader`: it first waits for every split's done-marker, up
   to ``data.wait_timeout_s``; ``data.preload: false`` loads it only now); the record
   keeps how long the load took (``load_s``) and how long the pass waited for it
   (``data_wait_s``), both the slowest worker's;
2. global shuffle (seed = ``data.shuffle_seed`` and the pass's ``seq``: a redone pass
   sees the same order);
3. **evaluate the new data with the current model** (progressive metrics: the model has
   never seen these samples);
4. train one pass; once the next pass's data is loaded, the trainer prepares that pass
   while this one trains (``Trainer.prefetch_pass``, :class:`~.pass_loader.PrepareNext`:
   the GPUPS pipeline reads its keys and pulls its rows; the other modes ignore it). Not
   with members or ``leaves`` (the next pass's share may change at the boundary) nor
   ``schedule.evaluate_only``; a global shuffle keeps the union of the workers' keys, so
   the keys read before it build the same device tables;
5. the saves :func:`sparseps.online.schedule.plan_pass` plans: at the end of a day
   decay + shrink and a base inference model, otherwise a delta every
   ``save.delta_every`` passes (``save.check_inference``: each inference save is checked
   against the trainer, :mod:`sparseps.online.inference_check`);
6. optionally (``predict.enabled``) distributed prediction over the pass's data (or
   ``predict.data``) into ``MODEL_DIR/predict/SEQ-DAY-PASS/``; the record lists it under
   ``saved.predict`` with its row count. The folder is named by the pass, so a pass redone
   after a crash replaces its folder (never a second copy), and the step runs before the
   checkpoint, so a pass the ledger counts as done always has its prediction;
7. a checkpoint every ``save.checkpoint_every`` passes and at the end of each day (its
   manifest state holds the pass record); then old checkpoints and inference saves are
   pruned (``save.keep_checkpoints``, ``save.keep_bases``);
8. worker 0 appends the pass record to the ledger and logs it (one line + one JSON line).

Every worker sets ``sparseps_online_pass_seq`` (its ``/metrics``; the status page of
``sparseps online --status-port P`` shows it) to the pass it runs.

An optional ``on_phase`` hook is called at named points of this loop
(:mod:`sparseps.online.phases`); tests use it to crash a job at an exact point.

Restart: the newest complete checkpoint is loaded and the loop continues with the pass
after it (the ledger's rule, see :mod:`sparseps.online.ledger`).

Workers joining and leaving (async mode, :mod:`sparseps.online.membership`): at each
pass boundary the workers take worker 0's decision on who trains the next pass; a changed
membership re-forms the gloo group, discards a pass preloaded for the old one (its share
was cut for the old world) and loads it again; a worker whose rank is beyond the new world
leaves after the pass's ledger line (exit 0), and a newcomer joins with the state worker
0 put in the decision (last pass, trained passes, whether a base exists).

A worker that dies mid-pass (async, ``data.split: steal``, ``data.lease_s``): each
worker trains its own files' rows (a local shuffle), its training data ends at a fence on
the store where the survivors learn of the death, re-form their group and re-read the
dead worker's files before the pass's metrics are reduced (:mod:`sparseps.online.leaving`);
the record gets ``left``, ``rows_reread`` and ``rows_trained``.

Before any of it, worker 0 takes the model directory's lock
(:mod:`sparseps.online.lock`; already held for it when ``sparseps online`` launched the
job): a second job on the same folder stops here, before it deletes or writes anything.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from .. import env as sps_env
from ..checkpoint.hooks import SaveHooks
from ..core import collectives
from ..errors import ConfigError
from ..observe.registry import online_pass
from .config import OnlineConfig
from .inference_check import check_inference
from .layout import DataLayout, PassId
from .leaving import Fence, LeaveAware
from .ledger import Ledger
from .lock import ModelDirLock
from .membership import Membership
from .model_dir import ModelDir
from .pass_loader import PassLoader, PrepareNext
from .phases import CountingDataset, PhaseEvent, PhaseHook
from .schedule import plan_pass

__all__ = ["OnlineDriver"]

log = logging.getLogger(__name__)


class OnlineDriver:
    """Runs the schedule of an online job on one worker.

    Args:
        config: the validated job config.
        trainer: a :class:`sparseps.Trainer` of the job's model (connected on first use).
        rank, world: this worker and the number of workers.
        on_phase: called with a :class:`~sparseps.online.phases.PhaseEvent` at each
            phase of the loop (see :mod:`sparseps.online.phases`); ``None``: no calls.
        save_hooks: a :class:`~sparseps.checkpoint.hooks.SaveHooks` handed to every
            checkpoint and inference save (fault injection for tests); ``None``: none.
        members: the worker's :class:`~sparseps.online.membership.Membership` (workers
            join and leave at pass boundaries); ``None``: the workers are fixed.
        newcomer: this worker was started for a scale-up: it waits for the boundary that
            admits it (``members`` required).
    """

    def __init__(
        self, config: OnlineConfig, trainer, *, rank: int, world: int,
        on_phase: PhaseHook | None = None, save_hooks: SaveHooks | None = None,
        members: Membership | None = None, newcomer: bool = False,
    ) -> None:  # fmt: skip
        self.config = config
        self.trainer = trainer
        self.rank, self.world = rank, world
        self.layout = DataLayout(config)
        self.dir = ModelDir(config.model_dir)
        self.ledger = Ledger.of(config.model_dir)
        self.lock = ModelDirLock(config.model_dir, what=f"online worker {rank}")
        self.on_phase = on_phase
        self.save_hooks = save_hooks
        self._last_checkpoint: str | None = None
        self._has_base = False
        self.members = members
        self.newcomer = newcomer
        if newcomer and members is None:
            raise ConfigError("OnlineDriver(newcomer=True) needs members=")

    def _phase(self, phase: str, pass_id: PassId) -> None:
        if self.on_phase is not None:
            self.on_phase(PhaseEvent(phase, pass_id, self.rank))

    # -- data --------------------------------------------------------------------------

    def _dataset(self, folders, *, queue: bool = False, world: int | None = None,
                 steal_key: str | None = None, rank: int | None = None):  # fmt: skip
        """A dataset of ``folders`` for ``world`` workers (default: the current pass's);
        ``steal_key`` names its file queue with ``data.split: steal`` (equal on every
        worker of the pass; default: the datasets' own count)."""
        from ..data import InMemoryDataset, QueueDataset

        data = self.config.data
        kind, threads = (QueueDataset, 1) if queue else (InMemoryDataset, data.threads)
        options = data.dataset_options()
        if queue:  # prediction and checks read a fixed share: no queue shared with others
            options["split"] = "static"
            options.pop("lease_s", None)
            # the share of the group rank (launch ranks need not be contiguous once a
            # worker left: sparseps.online.leaving)
            rank = self._group_rank() if rank is None else rank
        elif steal_key is not None and options.get("split") == "steal":
            options["steal_key"] = steal_key
        return kind(
            [str(f) for f in folders], data.dataset_schema(), data.batch_size, threads,
            rank=self.rank if rank is None else rank,
            world=self.world if world is None else world, **options,
        )  # fmt: skip

    def _group_rank(self) -> int:
        return self.rank if self.members is None else self.members.group_rank

    @property
    def leaves(self) -> bool:
        """Whether a worker that dies mid-pass leaves (the others finish the pass):
        members, ``data.split: steal`` and ``data.lease_s`` (:mod:`.leaving`)."""
        data = self.config.data
        return self.members is not None and data.split == "steal" and data.lease_s is not None

    def _loader(self, pass_id: PassId) -> PassLoader:
        """Start loading ``pass_id``'s share for the current membership."""
        world = self.world
        if self.members is not None and self.config.data.split == "steal":
            # a queue's claimer is named by its launch rank, which must be < world; once a
            # worker left, launch ranks are not 0..world-1 (sparseps.online.leaving)
            world = max(max(self.members.members) + 1, world)
        version = 0 if self.members is None else self.members.version
        key = f"online/{pass_id.seq}/v{version}"

        def make(folders):
            return self._dataset(folders, world=world, steal_key=key)

        return PassLoader(self.layout, pass_id, make, version)

    def _load_timeout(self) -> float:
        return self.config.data.wait_timeout_s + self.config.job.collective_timeout_s

    # -- resume ------------------------------------------------------------------------

    def resume(self) -> int:
        """Load the newest checkpoint (or ``model.init_checkpoint``); returns its last ``seq``."""
        if self.rank == 0:
            self.dir.clean_incomplete()
        collectives.barrier()
        latest = self.dir.latest_checkpoint()
        last_seq, restored = -1, None
        if latest is not None:
            path, state = latest
            self.trainer.load_checkpoint(path)
            restored = state["online"]
            last_seq = int(restored["seq"])
            self._check_schedule(path, restored)
            self._last_checkpoint = str(path)
            log.info("resuming after %s/pass-%03d from %s", restored["day"], restored["pass"], path)
        elif self.config.model.init_checkpoint:
            self.trainer.load_checkpoint(self.config.model.init_checkpoint)
            self.trainer.passes = 0
            log.info("warm start from %s", self.config.model.init_checkpoint)
        if self.rank == 0:
            if self.ledger.records():
                self.ledger.resume(last_seq, self._last_checkpoint, restored)
            self.dir.rewind_inference(self.trainer.passes)
            self.dir.rewind_predictions(last_seq)
        # worker 0 owns the folder's state; every worker must plan the same saves
        flag = np.array([self.dir.has_base() if self.rank == 0 else 0], np.int64)
        self._has_base = bool(collectives.all_reduce_sum(flag)[0])
        return last_seq

    def _check_schedule(self, path: Path, record: dict) -> None:
        expected = {p.seq: p for p in self.layout.passes()}.get(int(record["seq"]))
        if expected is not None and (expected.day, expected.index) != (
            record["day"],
            record["pass"],
        ):
            raise ConfigError(
                f"{path}: holds pass {record['day']}/{record['pass']} as seq {record['seq']}, but "
                f"this config's schedule has {expected}; schedule.start_day, "
                "schedule.passes_per_day and data.splits_per_pass must not change between runs "
                "of one model directory"
            )

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> list[dict]:
        """Run every pass after the last checkpoint; returns this run's pass records.

        Raises:
            ModelDirBusyError: (worker 0) another job holds the model directory.
        """
        if self.rank == 0:  # worker 0 alone cleans, prunes and writes the ledger
            # held by the `sparseps online` command of this job (local: our parent; Ray:
            # another process tree, which recorded the job id)
            self.lock.acquire(
                accept_ancestor=True, accept_job=sps_env.process_environ().get(sps_env.JOB_ID)
            )
        try:
            return self._run()
        finally:
            self.lock.release()

    def _run(self) -> list[dict]:
        if self.newcomer:
            last_seq = self._join()
            if last_seq is None:
                return []
        else:
            last_seq = self.resume()
            if self.members is not None:
                self.members.start(leaves=self.leaves)
        todo = [p for p in self.layout.passes() if p.seq > last_seq]
        records = []
        if self.rank == 0:
            self.dir.write_status("running", next=str(todo[0]) if todo else None)
        preload = self.config.data.preload
        loader = self._loader(todo[0]) if todo and preload else None
        for i, pass_id in enumerate(todo):
            if loader is None:
                loader = self._loader(pass_id)
            start = time.perf_counter()
            folders, dataset = loader.get(self._load_timeout())
            # collective, so also the barrier the shuffle needs: every worker holds its data
            timing, rows = self._gather_load(loader.seconds, time.perf_counter() - start, dataset)
            loader = None
            if preload and i + 1 < len(todo):
                loader = self._loader(todo[i + 1])
            ahead = self._prepare_next(loader) if loader is not None else None
            records.append(self._run_pass(pass_id, folders, dataset, timing, rows, ahead))
            dataset.release_memory()
            if self.members is not None and i + 1 < len(todo):
                stays, loader = self._boundary(pass_id, loader)
                if not stays:
                    return records
        if self.members is not None:
            self.members.end(self._state(todo[-1].seq if todo else last_seq))
        if self.rank == 0:
            self.dir.write_status("completed", passes=len(self.ledger.passes()))
        return records

    def _prepare_next(self, loader: PassLoader) -> PrepareNext | None:
        """The hook that prepares the next pass while the current one trains (step 4)."""
        if self.members is not None or self.config.schedule.evaluate_only:
            return None
        return PrepareNext(loader, self.trainer.prefetch_pass)

    # -- workers joining and leaving (async mode) ----------------------------------------

    def _state(self, seq: int) -> dict:
        """What a newcomer needs to go on after pass ``seq`` (worker 0's view)."""
        return {"seq": seq, "passes": self.trainer.passes, "has_base": self._has_base,
                "last_checkpoint": self._last_checkpoint}  # fmt: skip

    def _boundary(
        self, pass_id: PassId, loader: PassLoader | None
    ) -> tuple[bool, PassLoader | None]:
        """The pass boundary after ``pass_id``: agree on the next pass's workers. Returns
        whether this worker stays and the next pass's loader (None: load it now)."""
        members = self.members
        assert members is not None, "only called with members"
        decision = members.decide(self._state(pass_id.seq))
        stays = members.apply(decision)
        if loader is not None and loader.version != members.version:
            # loaded for the old membership: its share (or its file queue) is the old one's
            loader.discard()
            loader = None
        self.world = members.world
        return stays, loader

    def _join(self) -> int | None:
        """A newcomer: wait for the boundary that admits it; the last seq done before it
        (None: not needed, leave)."""
        members = self.members
        assert members is not None, "a newcomer has members"
        # the trainer connects while the running pass goes on (its start's barrier is in
        # this worker's group of one), so the members wait for the group alone
        self.trainer.client  # noqa: B018 - starts the trainer
        decision = members.join()
        if decision is None:
            return None
        state = decision.state
        # the dense values the members' last pass left (pulled from the servers)
        self.trainer.state.load_dense_local(None)
        self.trainer.passes = int(state["passes"])
        self._has_base = bool(state["has_base"])
        self._last_checkpoint = state["last_checkpoint"]
        members.form()
        self.world = members.world
        log.info("worker %d joined at boundary %d: %d workers from the pass after seq %d",
                 self.rank, decision.boundary, self.world, state["seq"])  # fmt: skip
        return int(state["seq"])

    def _gather_load(self, load_s: float, wait_s: float, dataset) -> tuple[list[float], list[int]]:
        """The slowest worker's load and wait (a pass starts when the slowest worker has
        data) and every worker's loaded rows, in rank order (one collective)."""
        mine = np.array([[load_s, wait_s, len(dataset)]], np.float64)
        every = np.concatenate(collectives.all_gather_arrays(mine))
        return np.max(every[:, :2], axis=0).tolist(), every[:, 2].astype(np.int64).tolist()

    def _run_pass(self, pass_id: PassId, folders, dataset, timing: list[float],
                  rows: list[int], ahead: PrepareNext | None = None) -> dict:  # fmt: skip
        trainer, config, save = self.trainer, self.config, self.config.save
        start = time.perf_counter()
        online_pass().set(pass_id.seq)
        self._phase("pass_start", pass_id)
        if config.data.shuffle_seed is not None:
            seed = config.data.shuffle_seed * 1_000_003 + pass_id.seq
            if self.leaves:  # each worker trains its own files' rows (re-read if it dies)
                dataset.local_shuffle(seed=seed * 64 + self.rank)
            else:
                dataset.global_shuffle(seed=seed)
        progressive = trainer.evaluate(dataset)
        record = {
            "kind": "pass", "seq": pass_id.seq, "day": pass_id.day, "pass": pass_id.index,
            "splits": [str(f) for f in folders], "eval": progressive.to_dict(),
            "load_s": round(timing[0], 4), "data_wait_s": round(timing[1], 4),
            "workers": len(rows), "worker_rows": rows,
        }  # fmt: skip
        self._phase("evaluated", pass_id)
        if config.schedule.evaluate_only:
            record.update(trained=False, seconds=round(time.perf_counter() - start, 3))
            self._finish(pass_id, record)
            return record
        plan = plan_pass(
            pass_id.index, self.layout.per_day, delta_every=save.delta_every,
            checkpoint_every=save.checkpoint_every, has_base=self._has_base,
        )  # fmt: skip
        fence = None
        if self.leaves:
            assert self.members is not None, "leaves needs members"
            fence = Fence(self.members, pass_id.seq, timeout_s=config.job.collective_timeout_s)
            dataset = LeaveAware(dataset, list(dataset.files), fence, self._reread)
        if self.on_phase is not None:  # the same batches (CountingDataset.pass_data)
            dataset = CountingDataset(dataset, self.on_phase, pass_id, self.rank)
        result = trainer.train_from_dataset(dataset, print_period=0, on_batch=ahead)
        record.update(trained=True, train=result.metrics.to_dict(), samples=result.metrics.count)
        if "prepared" in result.timings:  # GPUPS: built from a pass prepared during the last
            record["prepared"] = bool(result.timings["prepared"])
        if fence is not None and fence.departed:  # workers died and left (leaving.py)
            assert self.members is not None, "a fence has members"
            self.world = len(self.members.members)
            record.update(fence.summary(), workers_after=self.world,
                          members=list(self.members.members))  # fmt: skip
            record["rows_trained"] = record["samples"] + record["rows_reread"]
        saved = record["saved"] = {}
        if plan.end_of_day:
            trainer.decay(config.model.decay_rate)
            record["decay_rate"] = config.model.decay_rate
            record["shrunk"] = trainer.shrink()
        self._phase("trained", pass_id)
        if plan.inference:
            folder = trainer.save_inference_model(
                self.dir.inference, mode=plan.inference, hooks=self.save_hooks
            )
            self._has_base = True
            if self.rank == 0:
                saved[plan.inference] = str(folder)
            if save.check_inference:
                record["inference_max_diff"] = check_inference(
                    self.trainer, self.dir.inference, self._dataset(folders, queue=True), folders
                )
            self._phase("inference_saved", pass_id)
        if self._predicts(pass_id, plan.end_of_day):
            saved["predict"] = record["predict"] = self._predict(pass_id, folders)
            self._phase("predicted", pass_id)
        record["passes"] = trainer.passes
        record["seconds"] = round(time.perf_counter() - start, 3)
        if plan.checkpoint:
            path = self.dir.checkpoint_path(pass_id)
            saved["checkpoint"] = record["checkpoint"] = str(path)
            self._phase("checkpoint", pass_id)
            trainer.save_checkpoint(
                path, state={"online": _jsonable(record)}, hooks=self.save_hooks
            )
            self._last_checkpoint = str(path)
            if self.rank == 0:
                self.dir.prune(save.keep_checkpoints)
                # only now: a restart never rewinds before this checkpoint, so the bases
                # it covers stay (pruning earlier could leave no base after a rewind)
                self.dir.prune_inference(save.keep_bases, covered_passes=trainer.passes)
            self._phase("checkpointed", pass_id)
        self._finish(pass_id, record)
        return record

    def _finish(self, pass_id: PassId, record: dict) -> None:
        record.setdefault("checkpoint", self._last_checkpoint)
        if self.rank == 0:
            self.ledger.append(_jsonable(record))
            self.dir.write_status("running", last=str(pass_id))
            eval_auc = record["eval"]["auc"]
            train = record.get("train") or {}
            log.info(
                "online pass %s: progressive auc=%.6f logloss=%.6f count=%d | train auc=%s | "
                "saved=%s | %.1f s",
                pass_id, eval_auc, record["eval"]["logloss"], record["eval"]["count"],
                f"{train['auc']:.6f}" if train else "-", sorted(record.get("saved", {})),
                record["seconds"],
            )  # fmt: skip
            log.info("online pass record: %s", json.dumps(record, sort_keys=True))
            self._phase("ledger_written", pass_id)
        collectives.barrier()

    def _reread(self, files: list[str]):
        """A departed worker's files, read from their start (this survivor's share)."""
        return self._dataset(files, queue=True, world=1, rank=0)

    def _predicts(self, pass_id: PassId, end_of_day: bool) -> bool:
        predict = self.config.predict
        return predict.enabled and (end_of_day or (pass_id.index + 1) % predict.every == 0)

    def _predict(self, pass_id: PassId, folders) -> dict:
        """The pass's prediction step (collective); returns its ledger entry."""
        predict = self.config.predict
        sources = [predict.data] if predict.data else folders
        out = self.dir.predict_path(pass_id)
        result = self.trainer.predict_from_dataset(
            self._dataset(sources, queue=True), out, key=predict.key, outputs=predict.outputs,
            unique_keys=predict.unique_keys,
        )  # fmt: skip
        if self.rank == 0:
            self.dir.prune_predictions(predict.keep)
        return {"dir": str(out), "rows": result.rows, "parts": result.parts}


def _jsonable(record: dict) -> dict:
    """Plain JSON values (numpy scalars become Python numbers)."""

    def plain(value):
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(f"not JSON serialisable: {type(value).__name__}")

    return json.loads(json.dumps(record, default=plain))
