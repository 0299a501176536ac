"""Metrics for CTR models: pure functions, accumulators, global (all-worker) metrics.

Three layers, each usable alone (DESIGN §2.7):

- pure functions (:mod:`.functions`): ``bucketize``, ``auc_from_histograms``,
  ``exact_auc``, ``grouped_auc``, ``bucket_error_from_histograms``, ``accuracy``,
  ``mse``, ``rmse``, ``mae``;
- the stateful bundle :class:`CTRMetrics` (``update`` / ``merge`` / ``compute`` /
  ``reset`` / ``state``), whose integer state makes global metrics exact;
- the collectives (:mod:`.distributed`) that ``compute(global_=True)`` uses;
- user statistics (:class:`UserStats`: sum / max / min of any number or tensor, by name)
  and :func:`all_reduce` (``sps.all_reduce``), over every worker (:mod:`.stats`).

Plus per-pass reporting (:func:`format_metrics`, :class:`JsonlReporter`,
:class:`TensorBoardReporter`, :class:`ReportConfig` for a trainer) and debugging dumps (:class:`FieldDumper`,
:func:`dump_params`, :func:`read_dump`). Definitions and formats: ``docs/metrics.md``.
"""

from __future__ import annotations

from .accumulator import DEFAULT_NUM_BUCKETS, CTRMetrics, MetricResult
from .dump import DumpConfig, FieldDumper, dump_params, pass_dir, read_dump
from .functions import (
    GroupedAUC,
    accuracy,
    auc_from_histograms,
    bucket_error_from_histograms,
    bucketize,
    exact_auc,
    grouped_auc,
    mae,
    mse,
    rmse,
)
from .report import (
    JsonlReporter,
    Phase,
    ReportConfig,
    TensorBoardReporter,
    format_metrics,
    read_jsonl,
)
from .stats import UserStats, all_reduce

__all__ = [
    "DEFAULT_NUM_BUCKETS",
    "CTRMetrics",
    "DumpConfig",
    "FieldDumper",
    "GroupedAUC",
    "JsonlReporter",
    "MetricResult",
    "Phase",
    "ReportConfig",
    "TensorBoardReporter",
    "UserStats",
    "accuracy",
    "all_reduce",
    "auc_from_histograms",
    "bucket_error_from_histograms",
    "bucketize",
    "dump_params",
    "exact_auc",
    "format_metrics",
    "grouped_auc",
    "mae",
    "mse",
    "pass_dir",
    "read_dump",
    "read_jsonl",
    "rmse",
]
