"""How workers and servers cooperate: the training mode with its knobs, and the job's limits.

A mode is an object: ``Strategy(mode=Async(max_staleness=2))``, ``Strategy(mode=Geo(k_steps=
50))``. Each mode's knobs live on its own config class (:class:`Sync`, :class:`Async`,
:class:`Geo`, :class:`GpuPS`, :class:`Heter`, :class:`Hybrid`), checked when it is made,
and the config builds its training mode (:meth:`Mode.build`, the implementation in its
own module, imported then: nothing registers itself at import time). A name is accepted
for a mode with its defaults (``Strategy(mode="sync")``). The knobs every mode shares
(timeouts, the push queue, data prefetch) are the :class:`Strategy`'s.

A mode of one's own: subclass :class:`Mode` and return a
:class:`~sparseps.worker.modes.TrainingMode` from ``build`` (tests/worker/test_custom_mode.py).

Before modes were objects, their knobs were flat fields of ``Strategy``
(``Strategy(mode="geo", k_steps=50)``). Those spellings still work for this release, with a
``DeprecationWarning`` (CHANGELOG.md has the mapping); a flat knob that belongs to another
mode than the one chosen is refused, naming the mode it belongs to.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, fields
from typing import TYPE_CHECKING, ClassVar

from ..core.validate import check_float, check_int
from ..errors import ConfigError
from .push_merge import MergePolicy

if TYPE_CHECKING:
    from ..config import TableConfig
    from ..optim import Rule
    from ..rpc.client import PSClient
    from .dense_params import DenseParams
    from .modes import TrainingMode

__all__ = [
    "DEVICES",
    "MODES",
    "Async",
    "Geo",
    "GpuPS",
    "Heter",
    "Hybrid",
    "Mode",
    "Strategy",
    "Sync",
]

DEVICES = ("cuda", "cpu", "auto")


@dataclass(frozen=True)
class Mode:
    """A training mode's config: its name, its knobs, and how it builds the mode.

    Attributes:
        name: the mode's name (``Strategy(mode=name)`` makes it with its defaults).
        dense_on_heter_workers: the dense network runs on heter workers (a job launched
            with ``--heter-worker-num`` trains in such a mode).
    """

    name: ClassVar[str] = ""
    dense_on_heter_workers: ClassVar[bool] = False

    def build(
        self, client: PSClient, dense: DenseParams, dense_rule: Rule, strategy: Strategy,
        rank: int, *, tables: list[TableConfig],
    ) -> TrainingMode:  # fmt: skip
        """The training mode for one worker (see :class:`~sparseps.worker.modes.TrainingMode`)."""
        raise NotImplementedError(f"{type(self).__name__}.build")

    def merge_policy(self) -> MergePolicy | None:
        """How the mode merges its sparse pushes (None: it does not)."""
        return None


@dataclass(frozen=True)
class Sync(Mode):
    """Every step the servers apply the sum of all workers' sparse gradients once and
    dense gradients are all-reduced among workers, so the result equals one process
    training on the global batch.

    Args:
        backup_workers: each step goes on with the first ``worker count - backup_workers``
            workers' gradients; later ones are dropped (``PassResult.timings
            ["late_dropped"]``) and their worker catches up. 0: every worker's gradients
            make every step. Must be below the worker count.
    """

    name: ClassVar[str] = "sync"
    backup_workers: int = 0

    def __post_init__(self) -> None:
        check_int("Sync", "backup_workers", self.backup_workers, ge=0)

    def build(self, client: PSClient, dense: DenseParams, dense_rule: Rule,
              strategy: Strategy, rank: int, *, tables: list[TableConfig]) -> TrainingMode:  # fmt: skip
        if self.backup_workers:
            from .backup_sync import BackupSyncMode

            return BackupSyncMode(client, dense, dense_rule, strategy, rank, tables=tables)
        from .modes import SyncMode

        return SyncMode(client, dense, dense_rule, strategy, rank, tables=tables)


@dataclass(frozen=True)
class Async(Mode):
    """Pushes are applied as they arrive; dense parameters live in a server dense table.

    Args:
        dense_pull_interval: pull fresh dense parameters every this many steps (the pull
            overlaps the next batch's preparation; stale dense parameters hurt
            Adam-trained MLPs badly, so the default is every step).
        push_merge: ``"on"`` holds the sparse pushes of ``push_merge_window`` steps
            (sooner when steps stall) and sends them as one, each key's gradients, shows
            and clicks summed; ``"auto"`` sizes the window from the measured push latency
            and step interval; ``"off"`` or None sends each step's pushes as soon as the
            previous send is done (docs/training.md, "Push merging").
        push_merge_window: steps ``push_merge="on"`` holds (``"auto"``: at most).
        max_staleness: a worker may run at most this many steps ahead of the slowest
            worker (it waits otherwise; one whose data ran out never holds the others
            back). None: unbounded (docs/training.md, "Stragglers").
    """

    name: ClassVar[str] = "async"
    dense_pull_interval: int = 1
    push_merge: str | None = None
    push_merge_window: int = 8
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_int(owner, "dense_pull_interval", self.dense_pull_interval, ge=1)
        MergePolicy.from_knobs(owner, self.push_merge, self.push_merge_window)
        if self.max_staleness is not None:
            check_int(owner, "max_staleness", self.max_staleness, ge=0)

    def merge_policy(self) -> MergePolicy | None:
        return MergePolicy.from_knobs(type(self).__name__, self.push_merge, self.push_merge_window)

    def build(self, client: PSClient, dense: DenseParams, dense_rule: Rule,
              strategy: Strategy, rank: int, *, tables: list[TableConfig]) -> TrainingMode:  # fmt: skip
        if self.max_staleness is not None:
            from .staleness import BoundedAsyncMode

            return BoundedAsyncMode(client, dense, dense_rule, strategy, rank, tables=tables)
        from .modes import AsyncMode

        return AsyncMode(client, dense, dense_rule, strategy, rank, tables=tables)


@dataclass(frozen=True)
class Heter(Mode):
    """Async training with the dense network on heter workers (docs/heterps.md); the
    default mode of a job launched with ``--heter-worker-num``.

    Args:
        window: steps a trainer has in flight to its heter worker (it prepares and pools
            the next batches while the heter worker computes).
        dense_pull_interval: the heter worker pulls fresh dense parameters every this many
            of its dense updates (one per device batch).
        push_merge, push_merge_window: as :class:`Async`'s.
        gather_rows: a heter worker gathers the requests of its trainers into one device
            batch of up to this many rows (a request is never cut; 0: one request per
            device batch, no gathering; docs/heterps.md, "Request gathering").
        gather_ms: ... and waits at most this many milliseconds after a window's first
            request for more (requests already queued are taken without waiting).
        sync: sync mode's guarantee with the dense network on heter workers: trainers in
            lock-step, each step one dense update of the global batch on one heter worker,
            the sparse gradients summed once (:mod:`sparseps.worker.heter_sync`); one step
            in flight (``window`` and the gathering knobs do not apply).
    """

    name: ClassVar[str] = "heter"
    dense_on_heter_workers: ClassVar[bool] = True
    window: int = 2
    dense_pull_interval: int = 1
    push_merge: str | None = None
    push_merge_window: int = 8
    gather_rows: int = 4096
    gather_ms: float = 2.0
    sync: bool = False

    def __post_init__(self) -> None:
        check_int("Heter", "window", self.window, ge=1)
        check_int("Heter", "dense_pull_interval", self.dense_pull_interval, ge=1)
        check_int("Heter", "gather_rows", self.gather_rows, ge=0)
        check_float("Heter", "gather_ms", self.gather_ms, ge=0)
        if not isinstance(self.sync, bool):
            raise ConfigError(f"Heter.sync: expected a bool, got {self.sync!r}")
        MergePolicy.from_knobs("Heter", self.push_merge, self.push_merge_window)

    def merge_policy(self) -> MergePolicy | None:
        return MergePolicy.from_knobs(type(self).__name__, self.push_merge, self.push_merge_window)

    def build(self, client: PSClient, dense: DenseParams, dense_rule: Rule,
              strategy: Strategy, rank: int, *, tables: list[TableConfig]) -> TrainingMode:  # fmt: skip
        if self.sync:
            from .heter_sync import HeterSyncMode

            return HeterSyncMode(client, dense, dense_rule, strategy, rank, tables=tables)
        from .heter_mode import HeterMode

        return HeterMode(client, dense, dense_rule, strategy, rank, tables=tables)


@dataclass(frozen=True)
class Hybrid(Mode):
    """PERSIA's split: dense gradients all-reduced among workers every step and applied
    on each (identical dense parameters, as in sync mode), sparse gradients pushed in the
    background and rows pulled ahead, as in async mode, scaled as sync mode scales them
    and merged over as many steps as there are workers, so a key gets sync's number of
    updates (docs/training.md, "Hybrid").

    Args:
        push_merge, push_merge_window: as :class:`Async`'s; None (the default) merges the
            pushes of as many steps as there are workers.
    """

    name: ClassVar[str] = "hybrid"
    push_merge: str | None = None
    push_merge_window: int = 8

    def __post_init__(self) -> None:
        MergePolicy.from_knobs("Hybrid", self.push_merge, self.push_merge_window)

    def merge_policy(self, default: MergePolicy | None = None) -> MergePolicy | None:
        return MergePolicy.from_knobs("Hybrid", self.push_merge, self.push_merge_window, default)

    def build(self, client: PSClient, dense: DenseParams, dense_rule: Rule,
              strategy: Strategy, rank: int, *, tables: list[TableConfig]) -> TrainingMode:  # fmt: skip
        from .hybrid_mode import HybridMode

        return HybridMode(client, dense, dense_rule, strategy, rank, tables=tables)


@dataclass(frozen=True)
class Geo(Mode):
    """Workers train local copies for ``k_steps`` steps, then push parameter deltas.

    Args:
        k_steps: local steps between two delta pushes.
        keep_windows: drop a row from the worker's local copy once it went unused for
            this many ``k_steps`` windows (its local optimizer state goes with it; a later
            use pulls it again). None keeps every row the worker ever used.
    """

    name: ClassVar[str] = "geo"
    k_steps: int = 100
    keep_windows: int | None = None

    def __post_init__(self) -> None:
        check_int("Geo", "k_steps", self.k_steps, ge=1)
        if self.keep_windows is not None:
            check_int("Geo", "keep_windows", self.keep_windows, ge=1)

    def build(self, client: PSClient, dense: DenseParams, dense_rule: Rule,
              strategy: Strategy, rank: int, *, tables: list[TableConfig]) -> TrainingMode:  # fmt: skip
        from .geo_mode import GeoMode

        return GeoMode(client, dense, dense_rule, strategy, rank, tables=tables)


@dataclass(frozen=True)
class GpuPS(Mode):
    """Each pass's rows are pulled once into device tables sharded over the workers,
    trained there step by step as in sync mode with the model on the device too, and
    written back at the end of the pass (needs an ``InMemoryDataset``; docs/training.md,
    "GPUPS").

    Args:
        device: where the pass's rows, the model and the rules live: ``"cuda"`` (an error
            when no GPU is visible), ``"cpu"``, or ``"auto"`` (cuda when available).
        memory_bytes: the most device bytes one worker's shard of a pass may take
            (``sparseps.worker.gpups_table.bytes_per_key`` per key); a pass over it is
            split into sub-passes. None: no limit.
    """

    name: ClassVar[str] = "gpups"
    device: str = "auto"
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(f"GpuPS.device: expected one of {DEVICES}, got {self.device!r}")
        if self.memory_bytes is not None:
            check_int("GpuPS", "memory_bytes", self.memory_bytes, ge=1)

    def build(self, client: PSClient, dense: DenseParams, dense_rule: Rule,
              strategy: Strategy, rank: int, *, tables: list[TableConfig]) -> TrainingMode:  # fmt: skip
        from .gpups import GpuPsMode

        return GpuPsMode(client, dense, dense_rule, strategy, rank, tables=tables)


# The built-in modes by name (Strategy(mode=name) makes one with its defaults).
MODES: dict[str, type[Mode]] = {
    cls.name: cls for cls in (Sync, Async, Geo, GpuPS, Heter, Hybrid)
}  # fmt: skip

# The flat Strategy knobs of before modes were objects: (mode classes, their field there).
_FLAT_KNOBS: dict[str, tuple[tuple[type[Mode], ...], str]] = {
    "k_steps": ((Geo,), "k_steps"),
    "geo_keep_windows": ((Geo,), "keep_windows"),
    "dense_pull_interval": ((Async, Heter), "dense_pull_interval"),
    "device": ((GpuPS,), "device"),
    "gpups_memory_bytes": ((GpuPS,), "memory_bytes"),
    "heter_window": ((Heter,), "window"),
    "push_merge": ((Async, Heter, Hybrid), "push_merge"),
    "push_merge_window": ((Async, Heter, Hybrid), "push_merge_window"),
    "max_staleness": ((Async,), "max_staleness"),
    "backup_workers": ((Sync,), "backup_workers"),
}
_UNSET = object()


@dataclass(frozen=True)
class Strategy:
    """The distributed training strategy (Paddle's ``DistributedStrategy`` in one object).

    Args:
        mode: the training mode, a :class:`Mode` (:class:`Sync`, :class:`Async`,
            :class:`Geo`, :class:`GpuPS`, :class:`Heter`, :class:`Hybrid`, or one of your
            own) or a built-in mode's name (its defaults). None: the job's default,
            :class:`Async`, or :class:`Heter` in a job launched with heter workers.
        prefetch: overlap the pull of batch i+1 with the compute of batch i where the
            mode allows it (async, heter, hybrid), and read data one batch ahead in every
            mode.
        push_queue_size: bound of the background push queue (in batches).
        rpc_timeout: seconds any server call may take (None: the client default,
            ``SPARSEPS_RPC_TIMEOUT`` or 60 s); also how long a full push queue may block
            and a flush may go without progress.
        collective_timeout: seconds a worker waits in a worker-to-worker collective (the
            all-gathers and all-reduce of a sync step, of a pass end and of a save) and for
            the next batch from its data reader, before raising ``DeadlineError``. The
            process group's own limit (``SPARSEPS_COLLECTIVE_TIMEOUT_S``, 1800 s) still
            applies when it is lower.

    The flat knobs of earlier releases (``k_steps``, ``geo_keep_windows``,
    ``dense_pull_interval``, ``device``, ``gpups_memory_bytes``, ``heter_window``,
    ``push_merge``, ``push_merge_window``, ``max_staleness``, ``backup_workers``) are
    accepted with a ``DeprecationWarning`` and moved onto the mode.
    """

    mode: Mode | None = None
    prefetch: bool = True
    push_queue_size: int = 8
    rpc_timeout: float | None = None
    collective_timeout: float = 600.0
    k_steps: InitVar[object] = _UNSET
    geo_keep_windows: InitVar[object] = _UNSET
    dense_pull_interval: InitVar[object] = _UNSET
    device: InitVar[object] = _UNSET
    gpups_memory_bytes: InitVar[object] = _UNSET
    heter_window: InitVar[object] = _UNSET
    push_merge: InitVar[object] = _UNSET
    push_merge_window: InitVar[object] = _UNSET
    max_staleness: InitVar[object] = _UNSET
    backup_workers: InitVar[object] = _UNSET

    def __post_init__(self, *flat_values: object) -> None:
        flat = {
            name: value
            for name, value in zip(_FLAT_KNOBS, flat_values, strict=True)
            if value is not _UNSET
        }
        mode = self.mode
        if isinstance(mode, str):
            if mode not in MODES:
                raise ConfigError(
                    f"Strategy.mode: expected a sparseps.Mode or one of {tuple(MODES)}, got {mode!r}"
                )
            mode = MODES[mode]()
        elif mode is not None and not isinstance(mode, Mode):
            raise ConfigError(
                f"Strategy.mode: expected a sparseps.Mode (Sync(), Async(), Geo(), GpuPS(), "
                f"Heter(), Hybrid()) or one of {tuple(MODES)}, got {mode!r}"
            )
        if flat:
            mode = _with_flat_knobs(mode, flat)
        object.__setattr__(self, "mode", mode)
        if not isinstance(self.prefetch, bool):
            raise ConfigError(f"Strategy.prefetch: expected a bool, got {self.prefetch!r}")
        check_int("Strategy", "push_queue_size", self.push_queue_size, ge=1)
        # finite: an infinite timeout would turn a dead peer into a silent hang
        if self.rpc_timeout is not None:
            check_float("Strategy", "rpc_timeout", self.rpc_timeout, gt=0)
        check_float("Strategy", "collective_timeout", self.collective_timeout, gt=0)

    def resolved(self, *, heter_workers: bool) -> Strategy:
        """The strategy a job runs: the default mode filled in (:class:`Heter` with heter
        workers, else :class:`Async`).

        Raises:
            ConfigError: a job with heter workers and a mode that does not run its dense
                network on them (or the other way round is refused by the mode itself).
        """
        mode = self.mode
        if mode is None:
            mode = Heter() if heter_workers else Async()
        elif heter_workers and not mode.dense_on_heter_workers:
            raise ConfigError(
                f"Strategy(mode={mode!r}) in a job with heter workers: heter workers run the "
                "dense network of mode Heter() (the embeddings stay on the trainers); use "
                "mode=sparseps.Heter() (or leave mode unset), or launch without --heter-worker-num"
            )
        return Strategy(
            mode=mode, prefetch=self.prefetch, push_queue_size=self.push_queue_size,
            rpc_timeout=self.rpc_timeout, collective_timeout=self.collective_timeout,
        )  # fmt: skip

    @property
    def mode_name(self) -> str:
        """The mode's name (``"async"`` for the default)."""
        return "async" if self.mode is None else self.mode.name

    @classmethod
    def from_dict(cls, d: Mapping[str, object], *, where: str = "Strategy") -> Strategy:
        """A strategy from a mapping (an online job's YAML): the keys are the fields
        (``mode``, ``prefetch``, ``push_queue_size``, ``rpc_timeout``,
        ``collective_timeout``), a missing one takes the field's default. ``mode`` is a
        :class:`Mode`, a built-in mode's name, or a mapping of its name and its knobs
        (``{"name": "async", "max_staleness": 4}``).

        Raises:
            ConfigError: an unknown key (naming the known ones), an unknown mode or knob
                (naming ``where.mode``), or a value the fields refuse.
        """
        known = ("mode", "prefetch", "push_queue_size", "rpc_timeout", "collective_timeout")
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: "
                              f"{', '.join(known)}")  # fmt: skip
        values = dict(d)
        if "mode" in values:
            values["mode"] = _mode_of(values["mode"], f"{where}.mode")
        return cls(**values)  # type: ignore[arg-type]


def _mode_of(value: object, where: str) -> Mode | None:
    """The :class:`Mode` of ``value``: a Mode, None, a built-in name, or ``{name: ..., knobs}``."""
    if value is None or isinstance(value, Mode):
        return value
    knobs: dict[str, object] = {}
    if isinstance(value, Mapping):
        knobs = {str(k): v for k, v in value.items() if k != "name"}
        value = value.get("name")
        if not isinstance(value, str):
            raise ConfigError(f"{where}: a mapping needs 'name' (one of {tuple(MODES)})")
    if not isinstance(value, str) or value not in MODES:
        raise ConfigError(f"{where}: expected one of {tuple(MODES)} or a mapping "
                          f"{{name: ..., knob: value}}, got {value!r}")  # fmt: skip
    cls = MODES[value]
    known = sorted(f.name for f in fields(cls))
    if unknown := sorted(set(knobs) - set(known)):
        raise ConfigError(f"{where} {value}: unknown knob(s) {unknown} (known: {known})")
    return cls(**knobs)


for _name in _FLAT_KNOBS:  # no class attribute: strategy.k_steps is an AttributeError
    delattr(Strategy, _name)


def _with_flat_knobs(mode: Mode | None, flat: dict[str, object]) -> Mode:
    """``mode`` with the deprecated flat knobs moved onto it (refusing a knob of another mode)."""
    warnings.warn(
        f"Strategy({', '.join(f'{k}=...' for k in flat)}): the flat mode knobs are deprecated; "
        "set them on the mode, e.g. Strategy(mode=sparseps.Geo(k_steps=50)) (CHANGELOG.md)",
        DeprecationWarning,
        stacklevel=4,
    )
    target = type(mode) if mode is not None else None
    if target is None:  # no mode named: the knobs say which (async when they fit it)
        candidates = {cls for name in flat for cls in _FLAT_KNOBS[name][0]}
        target = Async if Async in candidates else min(candidates, key=lambda c: c.name)
    values = {} if mode is None else {f.name: getattr(mode, f.name) for f in fields(mode)}
    for name, value in flat.items():
        owners, attr = _FLAT_KNOBS[name]
        if target in owners:
            values[attr] = value
            continue
        default = next(f.default for f in fields(owners[0]) if f.name == attr)
        if value != default:
            where = " or ".join(f"{cls.__name__}({attr}=...)" for cls in owners)
            raise ConfigError(
                f"Strategy.{name}={value!r}: a knob of {where}, not of mode {target.name!r}; "
                f"set it on the mode it belongs to"
            )
    return target(**values)
