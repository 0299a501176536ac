"""Metrics for CTR models: pure functions, accumulators, global (all-worker) metrics.

Three layers, each usable alone (DESIGN §2.7):

- pure functions (:mod:`.functions`): ``bucketize``, ``auc_from_histograms``,
  ``exact_auc``, ``grouped_auc``, ``bucket_error_from_histograms``;
- the stateful bundle :class:`CTRMetrics` (``update`` / ``merge`` / ``compute`` /
  ``reset`` / ``state``), whose integer state makes global metrics exact;
- the collectives (:mod:`.distributed`) that ``compute(global_=True)`` uses.

Plus per-pass reporting (:func:`format_metrics`, :class:`JsonlReporter`,
:class:`TensorBoardReporter`, :class:`ReportConfig` for a trainer) and debugging dumps (:class:`FieldDumper`,
:func:`dump_params`, :func:`read_dump`). Definitions and formats: ``docs/metrics.md``.
"""

from __future__ import annotations

from .accumulator import DEFAULT_NUM_BUCKETS, CTRMetrics, MetricResult
from .dump import DumpConfig, FieldDumper, dump_params, pass_dir, read_dump
from .functions import (
    GroupedAUC,
    auc_from_histograms,
    bucket_error_from_histograms,
    bucketize,
    exact_auc,
    grouped_auc,
)
from .report import (
    JsonlReporter,
    Phase,
    ReportConfig,
    TensorBoardReporter,
    format_metrics,
    read_jsonl,
)

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
    "auc_from_histograms",
    "bucket_error_from_histograms",
    "bucketize",
    "dump_params",
    "exact_auc",
    "format_metrics",
    "grouped_auc",
    "pass_dir",
    "read_dump",
    "read_jsonl",
]
