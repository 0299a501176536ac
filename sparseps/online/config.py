"""The YAML config of an online job, as frozen dataclasses validated at load.

Example (every key but ``data.root``, ``schedule.start_day`` and ``save.model_dir`` has a
default)::

    job:      {server_num: 1, worker_num: 2, mode: sync}
    data:     {root: /data/stream, pattern: "{day}/{hhmm}", split_minutes: 5,
               splits_per_pass: 12, done_marker: _SUCCESS, wait_timeout_s: 3600}
    schedule: {start_day: "20240101", days: 3}
    model:    {emb_dim: 8, hidden: [64, 32], dense_lr: 0.001, deep_lr: 0.01}
    save:     {model_dir: /models/ctr, delta_every: 1, checkpoint_every: 4}
    predict:  {enabled: true, key: item, outputs: [item_vec], unique_keys: true}

Any job, not only the built-in wide&deep on Criteo: ``data.schema`` (a built-in name or
the fields of a :class:`sparseps.data.Schema`), ``data.format`` and ``data.pipe_command``,
``model.builder`` (``module:function`` building the model from the schema and
``model.params``) and ``model.loss`` (``module:name`` of a loss).

Unknown sections and keys are rejected (one ``ConfigError`` names every one of them and
lists the accepted keys); every value is type- and range-checked and an error names
``section.key``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.stats import MAX_BAD_RATIO
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..data.schema import Schema
from .config_values import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_str,
    parse_day,
    reject_unknown,
)

__all__ = [
    "DataConfig",
    "JobConfig",
    "ModelConfig",
    "OnlineConfig",
    "PredictConfig",
    "SaveConfig",
    "ScheduleConfig",
    "load_config",
]

MINUTES_PER_DAY = 24 * 60
PATTERN_FIELDS = ("day", "hhmm", "year", "month", "dd", "hour", "minute")
BUILTIN_SCHEMAS = ("criteo", "criteo_slot", "avazu")
SCHEMA_KEYS = ("label", "dense", "slots", "dense_transform", "id_column", "extra_labels",
               "multislot_order")  # fmt: skip


def _formats() -> tuple[str, ...]:
    from ..data.sources import Format

    return tuple(f.value for f in Format)


def check_ref(name: str, value: object) -> str:
    """A ``module:attribute`` reference (imported by the job, not here)."""
    text = check_str(name, value)
    module, _, attribute = text.partition(":")
    if (
        not module
        or not attribute
        or not all(part.isidentifier() for part in (*module.split("."), *attribute.split(".")))
    ):
        raise ConfigError(f"{name}: expected 'package.module:function', got {value!r}")
    return text


def resolve_ref(name: str, ref: str):
    """The object ``module:attribute`` names; ConfigError naming ``name`` if it cannot."""
    import importlib

    module, _, attribute = ref.partition(":")
    try:
        value = importlib.import_module(module)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{name}: cannot import {ref!r} ({type(exc).__name__}: {exc})") from None
    return value


def _resources(where: str, value: object) -> dict[str, float]:
    """Ray resources: a mapping of resource names to amounts > 0 (``{CPU: 2, GPU: 1}``)."""
    import json

    from ..launch.ray_placement import parse_resources

    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of Ray resources such as "
                          f"{{CPU: 2, GPU: 1}}, got {value!r}")  # fmt: skip
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # a value YAML made that JSON cannot hold
        raise ConfigError(f"{where}: expected resource amounts > 0, got {value!r}") from None
    return parse_resources(where, text)


@dataclass(frozen=True)
class JobConfig:
    """Processes and training mode.

    Args:
        server_num, worker_num: processes the launcher starts (1..64).
        mode: ``sync`` (exact, reproducible), ``async`` or ``geo``.
        log_dir: per-role logs (default ``MODEL_DIR/log``).
        job_id: id of the job's processes (default: the launcher's).
        rpc_timeout_s, collective_timeout_s: see :class:`sparseps.Strategy`.
        backend: ``local`` (the processes start on this machine) or ``ray`` (``sparseps
            launch --backend ray``: Ray places and starts them on its cluster,
            docs/cluster.md).
        ray_address: the Ray cluster (``--address``; default ``RAY_ADDRESS``, a running
            local cluster, or a new one). ``backend: ray`` only.
        server_resources, worker_resources: each server's / worker's Ray resources, a
            mapping such as ``{CPU: 2, GPU: 1}`` (``--server-resources`` /
            ``--worker-resources``; default ``{CPU: 1}``). ``backend: ray`` only.
    """

    server_num: int = 1
    worker_num: int = 1
    mode: str = "sync"
    log_dir: str | None = None
    job_id: str | None = None
    rpc_timeout_s: float = 120.0
    collective_timeout_s: float = 3600.0
    backend: str = "local"
    ray_address: str | None = None
    server_resources: dict | None = None
    worker_resources: dict | None = None

    def __post_init__(self) -> None:
        check_int("job.server_num", self.server_num, 1, 64)
        check_int("job.worker_num", self.worker_num, 1, 64)
        check_choice("job.mode", self.mode, ("sync", "async", "geo"))
        if self.log_dir is not None:
            check_str("job.log_dir", self.log_dir)
        if self.job_id is not None:
            check_str("job.job_id", self.job_id)
        check_float("job.rpc_timeout_s", self.rpc_timeout_s, 0.0, open_lo=True)
        check_float("job.collective_timeout_s", self.collective_timeout_s, 0.0, open_lo=True)
        check_choice("job.backend", self.backend, ("local", "ray"))
        for key in ("ray_address", "server_resources", "worker_resources"):
            if getattr(self, key) is not None and self.backend != "ray":
                raise ConfigError(f"job.{key}: applies only to job.backend: ray (the backend "
                                  f"is {self.backend!r})")  # fmt: skip
        if self.ray_address is not None:
            check_str("job.ray_address", self.ray_address)
        for key in ("server_resources", "worker_resources"):
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, _resources(f"job.{key}", value))


@dataclass(frozen=True)
class DataConfig:
    """Where the stream lies and how it is cut into passes.

    Split ``i`` of a day starts at minute ``i * split_minutes`` and lives in
    ``root / pattern.format(day="YYYYMMDD", hhmm="HHMM", ...)``; it is ready once its
    ``done_marker`` file exists. A pass is ``splits_per_pass`` consecutive splits.

    Args:
        root: the stream's root folder.
        pattern: a ``str.format`` pattern with fields day, hhmm, year, month, dd, hour, minute.
        split_minutes: minutes per split (divides a day).
        splits_per_pass: splits per pass.
        done_marker: file name that says a split is complete.
        wait_timeout_s: how long to wait for a split's marker before stopping the job.
        poll_s: how often to look for a marker.
        format: file format, any of :class:`sparseps.data.Format`: ``criteo_tsv``,
            ``csv``, ``slot_text``, ``parquet``, ``multislot``, ``multislot_string``.
        pipe_command: a shell command each file is piped through (its stdout is read in
            ``format``), as for :class:`sparseps.data.InMemoryDataset`.
        schema: ``criteo``, ``criteo_slot``, ``avazu``, or a mapping of
            :class:`sparseps.data.Schema` fields (label, dense, slots, dense_transform,
            id_column, extra_labels, multislot_order). Default: ``criteo_slot`` for
            ``slot_text``, else ``criteo``.
        batch_size, threads: see :class:`sparseps.data.InMemoryDataset`.
        max_bad_ratio: the share of a pass's lines that may be bad (skipped) before the
            pass fails with ``InputError`` (default :data:`sparseps.data.MAX_BAD_RATIO`,
            1 in 100; 0: any bad line fails it). The job stops; the pass is not in the
            ledger and the model files are as the previous pass left them.
        shuffle_seed: base seed of the per-pass global shuffle (``None``: no shuffle).
        preload: load the next pass in the background while the current one trains
            (``false``: load each pass when its turn comes, holding one pass in memory).
        split: how a pass's files are shared among the workers: ``static`` (worker ``r``
            of ``w`` reads ``files[r::w]``) or ``steal`` (each worker takes the next file
            from a queue shared by the pass's workers, docs/data.md §6.1).
        lease_s: with ``split: steal``, a worker silent this long loses its claimed file
            to the others (docs/data.md §6.1); in an async job a worker that dies while it
            trains then *leaves*: the others re-read its files and finish the pass
            (docs/online.md, "Workers joining and leaving"). Each worker then shuffles its
            own files' rows (no global shuffle), so a dead worker's rows are its files'.
            ``null`` (default): no lease, a worker's death fails the pass.
    """

    root: str = ""
    pattern: str = "{day}/{hhmm}"
    split_minutes: int = 5
    splits_per_pass: int = 12
    done_marker: str = "_SUCCESS"
    wait_timeout_s: float = 3600.0
    poll_s: float = 5.0
    format: str = "criteo_tsv"
    batch_size: int = 512
    threads: int = 1
    max_bad_ratio: float = MAX_BAD_RATIO
    shuffle_seed: int | None = 0
    preload: bool = True
    split: str = "static"
    lease_s: float | None = None
    pipe_command: str | None = None
    schema: str | dict | None = None

    def __post_init__(self) -> None:
        check_str("data.root", self.root)
        check_str("data.pattern", self.pattern)
        try:
            self.pattern.format(**dict.fromkeys(PATTERN_FIELDS, "x"))
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"data.pattern: {self.pattern!r} is not a format string over the fields "
                f"{', '.join(PATTERN_FIELDS)} ({type(exc).__name__}: {exc})"
            ) from None
        if os.path.isabs(self.pattern) or ".." in Path(self.pattern).parts:
            raise ConfigError(f"data.pattern: must be relative to data.root, got {self.pattern!r}")
        check_int("data.split_minutes", self.split_minutes, 1, MINUTES_PER_DAY)
        if MINUTES_PER_DAY % self.split_minutes:
            raise ConfigError(
                f"data.split_minutes: must divide a day (1440 minutes), got {self.split_minutes}"
            )
        check_int(
            "data.splits_per_pass", self.splits_per_pass, 1, MINUTES_PER_DAY // self.split_minutes
        )
        check_str("data.done_marker", self.done_marker)
        if "/" in self.done_marker:
            raise ConfigError(
                f"data.done_marker: a file name, not a path; got {self.done_marker!r}"
            )
        check_float("data.wait_timeout_s", self.wait_timeout_s, 0.0)
        check_float("data.poll_s", self.poll_s, 0.0, open_lo=True)
        check_choice("data.format", self.format, _formats())
        if self.pipe_command is not None:
            check_str("data.pipe_command", self.pipe_command)
        object.__setattr__(self, "schema", self._check_schema())
        check_int("data.batch_size", self.batch_size, 1, 1 << 20)
        check_int("data.threads", self.threads, 1, 64)
        check_float("data.max_bad_ratio", self.max_bad_ratio, 0.0, 1.0)
        if self.shuffle_seed is not None:
            check_int("data.shuffle_seed", self.shuffle_seed, 0)
        check_bool("data.preload", self.preload)
        check_choice("data.split", self.split, ("static", "steal"))
        if self.lease_s is not None:
            check_float("data.lease_s", self.lease_s, 0.0, open_lo=True)
            if self.split != "steal":
                raise ConfigError("data.lease_s: needs data.split: steal (a lease hands a "
                                  "claimed file to the others)")  # fmt: skip

    def _check_schema(self):
        value = self.schema
        if value is None or isinstance(value, str):
            if value is not None:
                check_choice("data.schema", value, BUILTIN_SCHEMAS)
            return value
        if not isinstance(value, dict):
            raise ConfigError(
                f"data.schema: expected one of {BUILTIN_SCHEMAS} or a mapping of Schema "
                f"fields, got {value!r}"
            )
        unknown = sorted(str(k) for k in value if k not in SCHEMA_KEYS)
        if unknown:
            raise ConfigError(
                f"data.schema: unknown keys {', '.join(unknown)} (accepted: "
                f"{', '.join(SCHEMA_KEYS)})"
            )
        if "label" not in value or "slots" not in value:
            raise ConfigError("data.schema: a mapping needs at least 'label' and 'slots'")
        self.build_schema(dict(value))  # validates (ConfigError names the field)
        return dict(value)

    @staticmethod
    def build_schema(value: str | Mapping[str, Any] | None) -> Schema | None:
        from ..data import schema as schemas

        if value is None or isinstance(value, str):
            return None if value is None else getattr(schemas, value.upper())
        fields_ = dict(value)
        for key in ("dense", "slots", "extra_labels", "multislot_order"):
            if fields_.get(key) is not None:
                fields_[key] = tuple(fields_[key])
        try:
            return schemas.Schema(**fields_)
        except TypeError as exc:  # a field this version's Schema does not have
            raise ConfigError(f"data.schema: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"data.schema: {exc}") from None

    def dataset_options(self) -> dict:
        """The keyword arguments every dataset of the job is built with (besides files,
        schema, batch size and threads): format, pipe_command, max_bad_ratio, split."""
        return {
            "pipe_command": self.pipe_command,
            "format": self.format,
            "max_bad_ratio": self.max_bad_ratio,
            "split": self.split,
            **({"lease_s": self.lease_s} if self.lease_s is not None else {}),
        }

    def dataset_schema(self) -> Schema:
        """The :class:`sparseps.data.Schema` of the stream."""
        built = self.build_schema(self.schema)
        if built is not None:
            return built
        from ..data import CRITEO, CRITEO_SLOT

        return CRITEO_SLOT if self.format == "slot_text" else CRITEO


@dataclass(frozen=True)
class ScheduleConfig:
    """Which passes run.

    Args:
        start_day: first day, ``YYYYMMDD``.
        days: how many days.
        passes_per_day: passes per day (default: the whole day,
            ``1440 / (split_minutes * splits_per_pass)``; fewer ends each day early).
        evaluate_only: only evaluate each pass (progressive metrics of a frozen model,
            e.g. loaded with ``model.init_checkpoint``); nothing is trained or saved.
    """

    start_day: str = ""
    days: int = 1
    passes_per_day: int | None = None
    evaluate_only: bool = False

    def __post_init__(self) -> None:
        day = parse_day("schedule.start_day", self.start_day)
        object.__setattr__(self, "start_day", day.strftime("%Y%m%d"))
        check_int("schedule.days", self.days, 1, 36600)
        if self.passes_per_day is not None:
            check_int("schedule.passes_per_day", self.passes_per_day, 1)
        check_bool("schedule.evaluate_only", self.evaluate_only)


@dataclass(frozen=True)
class ModelConfig:
    """The built-in wide&deep model and its optimizers.

    Args:
        emb_dim: deep embedding width.  hidden: MLP widths.
        dense_lr: Adam learning rate of the dense part.
        deep_rule, deep_lr: server rule of the deep table (adam, adagrad, sgd).
        wide_lr: FTRL alpha of the wide table.
        seed: torch seed of the dense initialisation.
        decay_rate: end-of-day show/click decay (in (0, 1]).
        shrink_score, shrink_unseen_days: end-of-day shrink thresholds.
        init_checkpoint: warm start from this checkpoint when the model dir has none.
        builder: ``module:function`` called as ``function(schema, **params)`` on every
            worker, returning the model (a ``torch.nn.Module`` with SparseEmbedding
            modules); None: the built-in wide&deep, which uses the knobs above.
        params: keyword arguments of ``builder`` (JSON-like values).
        loss: ``module:name`` of a loss: a function ``fn(logits, batch)``, a
            :class:`sparseps.worker.losses.Loss` instance, or a Loss class (built with no
            arguments); None: binary cross-entropy.
    """

    emb_dim: int = 8
    hidden: tuple[int, ...] = (64, 32)
    dense_lr: float = 0.001
    deep_rule: str = "adam"
    deep_lr: float = 0.01
    wide_lr: float = 0.1
    seed: int = 0
    decay_rate: float = 0.98
    shrink_score: float = 0.0
    shrink_unseen_days: int = 30
    init_checkpoint: str | None = None
    builder: str | None = None
    params: dict | None = None
    loss: str | None = None

    def __post_init__(self) -> None:
        check_int("model.emb_dim", self.emb_dim, 1, 1024)
        if self.builder is not None:
            check_ref("model.builder", self.builder)
        if self.loss is not None:
            check_ref("model.loss", self.loss)
        if self.params is not None:
            if not isinstance(self.params, dict) or not all(
                isinstance(k, str) for k in self.params
            ):
                raise ConfigError(f"model.params: expected a mapping of names, got {self.params!r}")
            if self.builder is None:
                raise ConfigError("model.params: only used with model.builder, which is not set")
        if not isinstance(self.hidden, list | tuple) or not self.hidden:
            raise ConfigError(
                f"model.hidden: expected a non-empty list of widths, got {self.hidden!r}"
            )
        object.__setattr__(
            self, "hidden", tuple(check_int("model.hidden[]", h, 1, 1 << 16) for h in self.hidden)
        )
        check_float("model.dense_lr", self.dense_lr, 0.0, open_lo=True)
        check_choice("model.deep_rule", self.deep_rule, ("adam", "adagrad", "sgd"))
        check_float("model.deep_lr", self.deep_lr, 0.0, open_lo=True)
        check_float("model.wide_lr", self.wide_lr, 0.0, open_lo=True)
        check_int("model.seed", self.seed, 0)
        check_float("model.decay_rate", self.decay_rate, 0.0, 1.0, open_lo=True)
        check_float("model.shrink_score", self.shrink_score, 0.0)
        check_int("model.shrink_unseen_days", self.shrink_unseen_days, 0)
        if self.init_checkpoint is not None:
            check_str("model.init_checkpoint", self.init_checkpoint)


@dataclass(frozen=True)
class SaveConfig:
    """What is saved and when (see docs/online.md for the model directory's layout).

    Args:
        model_dir: the job's model directory (ledger, checkpoints, inference model).
        delta_every: save a delta inference model every this many passes (0: never).
        delta_every, checkpoint_every: count passes from the start of each day (see
            :mod:`sparseps.online.schedule`); the end of each day always saves a base and
            a checkpoint. Passes after the last checkpoint are redone after a crash.
        keep_checkpoints: complete checkpoints kept (older ones are deleted).
        keep_bases: inference bases kept, each with the deltas after it; older saves
            are deleted once a checkpoint covers the newest kept base (the newest
            base's chain, which serving loads, is never deleted).
        check_inference: after each inference save, compare the inference model's
            predictions on the pass's data with the trainer's (fails beyond 1e-6).
    """

    model_dir: str = ""
    delta_every: int = 1
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    keep_bases: int = 2
    check_inference: bool = False

    def __post_init__(self) -> None:
        check_str("save.model_dir", self.model_dir)
        check_int("save.delta_every", self.delta_every, 0)
        check_int("save.checkpoint_every", self.checkpoint_every, 1)
        check_int("save.keep_checkpoints", self.keep_checkpoints, 1)
        check_int("save.keep_bases", self.keep_bases, 1)
        check_bool("save.check_inference", self.check_inference)


@dataclass(frozen=True)
class PredictConfig:
    """An optional per-pass distributed prediction step (see docs/online.md).

    After a pass is trained (and its inference model saved), every worker predicts its
    share of ``data`` (default: the pass's own splits) into
    ``MODEL_DIR/predict/SEQ-DAY-PASS/`` with :meth:`sparseps.Trainer.predict_from_dataset`.

    Args:
        enabled: run the step.
        every: on every this-many-th pass of a day (counted from the day's first), and
            always on a day's last pass.
        key, outputs, unique_keys: as for ``predict_from_dataset``.
        data: files or folders to predict instead of the pass's data (e.g. an item
            catalogue), read in ``data.format`` with ``data.schema``.
        keep: prediction folders kept (older ones are deleted).
    """

    enabled: bool = False
    every: int = 1
    key: str = "sample_id"
    outputs: tuple[str, ...] = ()
    unique_keys: bool = False
    data: str | None = None
    keep: int = 2

    def __post_init__(self) -> None:
        check_bool("predict.enabled", self.enabled)
        check_int("predict.every", self.every, 1)
        check_str("predict.key", self.key)
        if not isinstance(self.outputs, list | tuple):
            raise ConfigError(f"predict.outputs: expected a list of names, got {self.outputs!r}")
        object.__setattr__(
            self, "outputs", tuple(check_str("predict.outputs[]", o) for o in self.outputs)
        )
        check_bool("predict.unique_keys", self.unique_keys)
        if self.data is not None:
            check_str("predict.data", self.data)
        check_int("predict.keep", self.keep, 1)


_SECTIONS = {
    "job": JobConfig,
    "data": DataConfig,
    "schedule": ScheduleConfig,
    "model": ModelConfig,
    "save": SaveConfig,
    "predict": PredictConfig,
}
_REQUIRED = {"data": ("root",), "schedule": ("start_day",), "save": ("model_dir",)}


@dataclass(frozen=True)
class OnlineConfig:
    """The whole job: one section per concern."""

    job: JobConfig
    data: DataConfig
    schedule: ScheduleConfig
    model: ModelConfig
    save: SaveConfig
    predict: PredictConfig = PredictConfig()

    def __post_init__(self) -> None:
        per_day = MINUTES_PER_DAY // (self.data.split_minutes * self.data.splits_per_pass)
        if self.schedule.passes_per_day is not None and self.schedule.passes_per_day > per_day:
            raise ConfigError(
                f"schedule.passes_per_day: {self.schedule.passes_per_day} passes of "
                f"{self.data.splits_per_pass} x {self.data.split_minutes} min do not fit in a "
                f"day (at most {per_day})"
            )

    @property
    def passes_per_day(self) -> int:
        if self.schedule.passes_per_day is not None:
            return self.schedule.passes_per_day
        return MINUTES_PER_DAY // (self.data.split_minutes * self.data.splits_per_pass)

    @property
    def model_dir(self) -> Path:
        return Path(self.save.model_dir)

    @property
    def log_dir(self) -> Path:
        return Path(self.job.log_dir) if self.job.log_dir else self.model_dir / "log"

    @classmethod
    def from_dict(cls, raw: Any, *, base: Path | None = None) -> OnlineConfig:
        """Build from a parsed YAML mapping; relative paths resolve against ``base``."""
        if not isinstance(raw, dict):
            raise ConfigError(
                f"online config: expected a mapping of sections, got {type(raw).__name__}"
            )
        for name in _SECTIONS:
            if not isinstance(raw.get(name) or {}, dict):
                raise ConfigError(f"{name}: expected a mapping, got {raw[name]!r}")
        reject_unknown(
            raw, {name: [f.name for f in fields(kind)] for name, kind in _SECTIONS.items()}
        )
        built = {}
        for name, kind in _SECTIONS.items():
            section = raw.get(name) or {}
            for key in _REQUIRED.get(name, ()):
                if key not in section:
                    raise ConfigError(f"{name}.{key}: required")
            section = dict(section)
            if base is not None:
                for key in ("root", "model_dir", "log_dir", "init_checkpoint", "data"):
                    value = section.get(key)
                    if isinstance(value, str) and value and not os.path.isabs(value):
                        section[key] = str((base / value).resolve())
            built[name] = kind(**section)
        return cls(**built)

    def to_dict(self) -> dict:
        out = {}
        for name in _SECTIONS:
            section = getattr(self, name)
            out[name] = {f.name: _plain(getattr(section, f.name)) for f in fields(section)}
        return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def load_config(path: str | os.PathLike) -> OnlineConfig:
    """Read and validate a YAML config; relative paths are relative to the file's folder.

    Raises:
        ConfigError: the file is missing, not YAML, or a value is invalid (names the key).
    """
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"online config {path}: cannot read ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"online config {path}: not valid YAML ({exc})") from None
    try:
        return OnlineConfig.from_dict(raw, base=path.resolve().parent)
    except ConfigError as exc:
        raise ConfigError(f"online config {path}: {exc}") from None
