"""The per-pass sections of an online config: ``schedule`` (which passes run), ``save``
(what each pass saves, and how much is kept) and ``predict`` (an optional prediction step
after a pass).

Together they say what happens at each pass; :func:`sparseps.online.schedule.plan_pass`
turns them into one pass's plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .config_values import check_bool, check_int, check_str, parse_day

__all__ = ["PredictConfig", "SaveConfig", "ScheduleConfig"]


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
