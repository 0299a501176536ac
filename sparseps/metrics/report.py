"""Per-pass reporting of a :class:`~sparseps.metrics.MetricResult`.

- :func:`format_metrics`: one log line in the bracketed style users of the seed system
  grep for (``pass: [3], auc: [0.771200], bucket_error: [...], ...``).
- :class:`JsonlReporter`: one JSON object per pass and phase appended to a file.
- :class:`TensorBoardReporter`: scalars in TensorBoard event files (needs the optional
  ``tensorboard`` package).
- :class:`ReportConfig`: what a trainer computes and reports per pass (all of the above,
  the AUC resolution, the grouping for UAUC/GAUC and the debugging dumps).

In a multi-worker job the global metrics are identical on every worker, so only one
worker (rank 0) should report them.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ..errors import ConfigError
from .accumulator import DEFAULT_NUM_BUCKETS, MetricResult
from .dump import DumpConfig
from .functions import check_num_buckets

__all__ = [
    "JsonlReporter",
    "Phase",
    "ReportConfig",
    "TensorBoardReporter",
    "format_metrics",
    "read_jsonl",
]

# (field, formatted name) in the order of the log line; floats get 6 decimals
_LINE_FIELDS = (
    ("auc", "auc"),
    ("bucket_error", "bucket_error"),
    ("logloss", "logloss"),
    ("mae", "mae"),
    ("mse", "mse"),
    ("rmse", "rmse"),
    ("accuracy", "accuracy"),
    ("actual_ctr", "actual_ctr"),
    ("predicted_ctr", "predicted_ctr"),
    ("copc", "copc"),
    ("count", "ins_num"),
    ("uauc", "uauc"),
    ("gauc", "gauc"),
)


class Phase(StrEnum):
    TRAIN = "train"
    TEST = "test"


def _phase(value: str) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        accepted = ", ".join(p.value for p in Phase)
        raise ConfigError(f"phase must be one of {accepted}, got {value!r}") from None


def _check_pass(pass_id: object) -> int:
    if isinstance(pass_id, bool) or not isinstance(pass_id, int) or pass_id < 0:
        raise ConfigError(f"pass_id must be an int >= 0, got {pass_id!r}")
    return pass_id


def format_metrics(result: MetricResult, prefix: str = "") -> str:
    """One line with every metric, e.g. ``format_metrics(r, "pass: [3]")`` gives
    ``pass: [3], auc: [0.771200], bucket_error: [0.012000], ..., ins_num: [1000]``.

    ``uauc``/``gauc`` appear only when they were computed; ``auc`` is followed by
    ``(undefined)`` when one class was missing.
    """
    values = result.to_dict()
    parts = [prefix] if prefix else []
    for field, name in _LINE_FIELDS:
        value = values[field]
        if value is None:
            continue
        text = str(value) if isinstance(value, int) else f"{value:.6f}"
        if field == "auc" and not result.auc_defined:
            text += " (undefined)"
        parts.append(f"{name}: [{text}]")
    return ", ".join(parts)


class JsonlReporter:
    """Appends one JSON object per call to ``path`` (JSON Lines).

    Each line is ``{"pass": n, "phase": "train"|"test", "time": unix_seconds, <every
    MetricResult field>, <extra>}``. The file is opened, appended and closed on each call,
    so the reporter holds no resources and a crash loses at most the line being written.

    Args:
        path: the ``.jsonl`` file; its folder is created if missing.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def report(
        self, result: MetricResult, *, pass_id: int, phase: str = "train", **extra: object
    ) -> dict:
        """Append one line; returns the object written.

        Raises:
            ConfigError: bad ``pass_id`` or ``phase``, or an ``extra`` key that would
                overwrite a metric.
        """
        record: dict[str, object] = {
            "pass": _check_pass(pass_id),
            "phase": _phase(phase).value,
            "time": time.time(),
        }
        record.update(result.to_dict())
        clash = set(extra) & set(record)
        if clash:
            raise ConfigError(
                f"JsonlReporter.report: extra keys {sorted(clash)} clash with metrics"
            )
        record.update(extra)
        line = json.dumps(record, allow_nan=False, default=str)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        return record


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every object of a JSON Lines file written by :class:`JsonlReporter`."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class TensorBoardReporter:
    """Writes each numeric metric as a scalar ``{phase}/{name}`` at step ``pass_id``.

    Uses ``torch.utils.tensorboard.SummaryWriter``, imported on construction; the
    ``tensorboard`` package is optional. Close it (or use ``with``) to flush the events.

    Raises:
        ConfigError: ``tensorboard`` is not installed.
    """

    def __init__(self, log_dir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(
                "TensorBoardReporter needs the 'tensorboard' package: pip install tensorboard "
                f"(import failed: {exc})"
            ) from None
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def report(self, result: MetricResult, *, pass_id: int, phase: str = "train") -> None:
        step, tag = _check_pass(pass_id), _phase(phase).value
        for name, value in result.to_dict().items():
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                self._writer.add_scalar(f"{tag}/{name}", value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TensorBoardReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ReportConfig:
    """What a :class:`~sparseps.Trainer` computes and writes once per pass.

    Every output is off by default; the pass metrics are always computed (globally) and
    logged by worker 0.

    Attributes:
        metrics_path: worker 0 appends one JSON line per pass and phase here
            (:class:`JsonlReporter`).
        tensorboard_dir: worker 0 writes every metric as a TensorBoard scalar
            ``{phase}/{name}`` at step = pass (:class:`TensorBoardReporter`; needs the
            ``tensorboard`` package).
        num_buckets: AUC histogram resolution of the pass metrics (default 2**20).
        group_slot: a slot of the batch whose first id per sample groups samples for
            UAUC/GAUC (e.g. a user id slot); samples with no id in it form group 0. None:
            no grouped AUC.
        dump: per-sample fields / parameters to dump each training pass.
    """

    metrics_path: str | os.PathLike | None = None
    tensorboard_dir: str | os.PathLike | None = None
    num_buckets: int = DEFAULT_NUM_BUCKETS
    group_slot: str | None = None
    dump: DumpConfig | None = None

    def __post_init__(self) -> None:
        try:
            check_num_buckets(self.num_buckets)
        except ConfigError as exc:
            raise ConfigError(f"ReportConfig.{exc}") from None
        if self.group_slot is not None and (
            not isinstance(self.group_slot, str) or not self.group_slot
        ):
            raise ConfigError(
                f"ReportConfig.group_slot: expected a slot name or None, got {self.group_slot!r}"
            )
        if self.dump is not None and not isinstance(self.dump, DumpConfig):
            raise ConfigError(
                f"ReportConfig.dump: expected a sparseps.metrics.DumpConfig, got "
                f"{type(self.dump).__name__}"
            )
