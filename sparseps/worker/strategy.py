"""How workers and servers cooperate: the training mode and its knobs."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.validate import check_float, check_int
from ..errors import ConfigError
from . import backup_sync as _backup  # noqa: F401 - sync with backup_workers
from . import geo_mode as _geo  # noqa: F401 - registers mode "geo"
from . import gpups as _gpups  # noqa: F401 - registers mode "gpups"
from . import heter_mode as _heter  # noqa: F401 - registers mode "heter"
from . import hybrid_mode as _hybrid  # noqa: F401 - registers mode "hybrid"
from . import staleness as _staleness  # noqa: F401 - async with max_staleness
from .modes import mode_names
from .push_merge import MERGE_MODES

__all__ = ["DEVICES", "MODES", "Strategy"]

MODES = (
    "sync",
    "async",
    "geo",
    "gpups",
    "heter",
    "hybrid",
)  # the built-in modes; more with modes.register_mode
DEVICES = ("cuda", "cpu", "auto")


@dataclass(frozen=True)
class Strategy:
    """The distributed training strategy (Paddle's ``DistributedStrategy`` in one object).

    Args:
        mode: ``"sync"``: every step the servers apply the sum of all workers' sparse
            gradients once and dense gradients are all-reduced among workers, so the result
            equals one process training on the global batch. ``"async"``: pushes are applied
            as they arrive; dense parameters live in a server dense table. ``"geo"``: workers
            train local copies for ``k_steps`` steps, then push parameter deltas.
            ``"gpups"``: each pass's rows are pulled once into device tables sharded over
            the workers, trained there step by step as in sync mode, and written back at
            the end of the pass (needs an ``InMemoryDataset``; docs/training.md, "GPUPS").
            ``"heter"``: async mode with the dense network on heter workers (a job
            launched with ``--heter-worker-num`` promotes ``"async"`` to it;
            docs/heterps.md).
            ``"hybrid"``: PERSIA's split: dense gradients all-reduced among workers every
            step and applied on each (identical dense parameters, as in sync mode; dense
            optimizer state on the workers), sparse gradients pushed in the background
            and rows pulled ahead, as in async mode, scaled as sync mode scales them and
            merged over as many steps as there are workers (``push_merge``), so a key
            gets sync's number of updates (docs/training.md, "Hybrid").
        k_steps: geo mode: local steps between two delta pushes.
        dense_pull_interval: async mode: pull fresh dense parameters every this many steps
            (the pull overlaps the next batch's preparation; stale dense parameters hurt
            Adam-trained MLPs badly, so the default is every step).
        prefetch: overlap the pull of batch i+1 with the compute of batch i (async mode;
            sync and geo prefetch data only, since their pulls must see the last update).
        geo_keep_windows: geo mode: drop a row from the worker's local copy once it went
            unused for this many ``k_steps`` windows (its local optimizer state goes with
            it; a later use pulls it again). None keeps every row the worker ever used, so
            the local copy grows with the keys of its data.
        push_queue_size: bound of the background push queue (in batches).
        rpc_timeout: seconds any server call may take (None: the client default,
            ``SPARSEPS_RPC_TIMEOUT`` or 60 s); also how long a full push queue may block
            and a flush may go without progress.
        collective_timeout: seconds a worker waits in a worker-to-worker collective (the
            gloo all-gathers and all-reduce of a sync step, of a pass end and of a save)
            and for the next batch from its data reader, before raising ``DeadlineError``.
            The process group's own limit (``SPARSEPS_COLLECTIVE_TIMEOUT_S``, 1800 s)
            still applies when it is lower.
        device: gpups mode: where the pass's rows and their optimizer rule live:
            ``"cuda"`` (an error when no GPU is visible), ``"cpu"``, or ``"auto"`` (cuda
            when available, else cpu).
        gpups_memory_bytes: gpups mode: the most device bytes one worker's shard of a
            pass may take (``sparseps.worker.gpups_table.bytes_per_key`` per key); a pass
            over it is refused with an error naming the pass, keys and bytes (not split).
            None: no limit.
        heter_window: heter mode: steps a trainer has in flight to its heter worker
            (it prepares and pools the next batches while the heter worker computes).
        push_merge: async and hybrid modes: ``"on"`` holds the sparse pushes of
            ``push_merge_window`` steps (sooner when steps stall) and sends them as one,
            each key's gradients, shows and clicks summed; ``"auto"`` sizes the window
            from the measured push latency and step interval (1 step when the servers
            keep up); ``"off"`` sends each step's pushes as soon as the previous send is
            done. Merging applies one optimizer update with the summed gradient where
            there were several (docs/training.md, "Push merging", has its measured
            throughput and AUC). None: the mode's default: off in async mode; in hybrid
            mode the pushes of as many steps as there are workers, so a key gets as many
            optimizer updates per sample as in sync mode.
        push_merge_window: steps ``push_merge="on"`` holds (``"auto"``: at most).
        max_staleness: async mode: a worker may run at most this many steps ahead of the
            slowest worker (it waits otherwise; one whose data ran out never holds the
            others back); the measured staleness of each pass is in
            ``PassResult.timings`` (``staleness_max``, ``staleness_mean``). None: unbounded
            (docs/training.md, "Stragglers").
        backup_workers: sync mode: each step goes on with the first
            ``worker count - backup_workers`` workers' gradients; later ones are dropped
            (``PassResult.timings["late_dropped"]``) and their worker catches up. 0: every
            worker's gradients make every step (plain sync). Must be below the worker count.
    """

    mode: str = "async"
    k_steps: int = 100
    dense_pull_interval: int = 1
    prefetch: bool = True
    geo_keep_windows: int | None = None
    push_queue_size: int = 8
    rpc_timeout: float | None = None
    collective_timeout: float = 600.0
    device: str = "auto"
    gpups_memory_bytes: int | None = None
    heter_window: int = 2
    push_merge: str | None = None
    push_merge_window: int = 8
    max_staleness: int | None = None
    backup_workers: int = 0

    def __post_init__(self) -> None:
        if self.mode not in mode_names():
            raise ConfigError(f"Strategy.mode: expected one of {mode_names()}, got {self.mode!r}")
        for name in ("k_steps", "dense_pull_interval", "push_queue_size", "heter_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"Strategy.{name}: expected an integer >= 1, got {value!r}")
        if self.geo_keep_windows is not None and (
            isinstance(self.geo_keep_windows, bool)
            or not isinstance(self.geo_keep_windows, int)
            or self.geo_keep_windows < 1
        ):
            raise ConfigError(
                f"Strategy.geo_keep_windows: expected None or an integer >= 1, "
                f"got {self.geo_keep_windows!r}"
            )
        # finite: an infinite timeout would turn a dead peer into a silent hang
        if self.rpc_timeout is not None:
            check_float("Strategy", "rpc_timeout", self.rpc_timeout, gt=0)
        check_float("Strategy", "collective_timeout", self.collective_timeout, gt=0)
        if self.device not in DEVICES:
            raise ConfigError(f"Strategy.device: expected one of {DEVICES}, got {self.device!r}")
        if self.gpups_memory_bytes is not None:
            check_int("Strategy", "gpups_memory_bytes", self.gpups_memory_bytes, ge=1)
        if self.push_merge is not None and self.push_merge not in MERGE_MODES:
            raise ConfigError(
                f"Strategy.push_merge: expected None or one of {MERGE_MODES}, "
                f"got {self.push_merge!r}"
            )
        check_int("Strategy", "push_merge_window", self.push_merge_window, ge=1)
        if self.max_staleness is not None:
            check_int("Strategy", "max_staleness", self.max_staleness, ge=0)
            if self.mode != "async":
                raise ConfigError(
                    f"Strategy.max_staleness: bounds async mode only, got mode={self.mode!r}"
                )
        check_int("Strategy", "backup_workers", self.backup_workers, ge=0)
        if self.backup_workers and self.mode != "sync":
            raise ConfigError(
                f"Strategy.backup_workers: applies to sync mode only, got mode={self.mode!r}"
            )
