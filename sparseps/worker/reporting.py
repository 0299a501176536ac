"""What a trainer reports: progress lines, per-pass metrics, JSON lines, TensorBoard, dumps.

- Every worker logs a progress line every ``print_period`` batches, over its own window
  of batches: ``time: [...], batch: [N], loss: [x], auc: [y], samples/s: [z]``.
- Worker 0 logs one line per pass and phase (``pass: [3], phase: [train], auc: [...]``;
  an evaluation of the model of training pass 3 is ``pass: [3], phase: [test]``) and, as
  configured by :class:`~sparseps.metrics.ReportConfig`, appends one JSON object per pass
  and phase and writes TensorBoard scalars, under the same pass number.
- With a :class:`~sparseps.metrics.DumpConfig`, every worker writes the chosen per-sample
  fields of each pass (``sample_id``, ``label``, ``pred`` and any slot name, whose ids
  are written as a list column) and worker 0 the chosen dense parameters; the formats
  are documented in docs/metrics.md.
- Every worker records Prometheus metrics (:mod:`sparseps.observe.registry`): samples and
  batches trained, the step time split (:class:`StepSplit`), the staleness of its
  pushes, and the global AUC and logloss of the last pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.closing import Closing
from ..errors import ConfigError, InputError
from ..metrics import (
    CTRMetrics,
    FieldDumper,
    JsonlReporter,
    MetricResult,
    ReportConfig,
    TensorBoardReporter,
    dump_params,
    format_metrics,
)
from ..observe.registry import worker_metrics

if TYPE_CHECKING:
    import torch

    from ..data import Batch

__all__ = ["PROGRESS_BUCKETS", "PassReporter", "Progress", "StepSplit", "group_ids"]

log = logging.getLogger(__name__)

_BUILTIN_FIELDS = ("sample_id", "label", "pred")

# Progress lines show a coarse AUC over the last print_period batches of this worker
# (a windowed indicator like the seed system's; the pass metric is global and exact).
PROGRESS_BUCKETS = 2**12


def group_ids(batch: Batch, slot: str) -> np.ndarray:
    """The first id of ``slot`` per sample (uint64 ``[B]``); 0 where the sample has none."""
    found = batch.slots.get(slot)
    if found is None:
        raise InputError(
            f"ReportConfig.group_slot {slot!r} is not a slot of the batch (batch slots: "
            f"{', '.join(batch.slots)}); name one of them or set group_slot=None"
        )
    offsets = np.asarray(found.offsets, np.int64)
    has = offsets[1:] > offsets[:-1]
    groups = np.zeros(len(batch), np.uint64)
    groups[has] = np.asarray(found.values, np.uint64)[offsets[:-1][has]]
    return groups


class Progress:
    """The progress line of one worker, every ``period`` batches (0: never)."""

    def __init__(self, period: int) -> None:
        self.period = period
        self.window = CTRMetrics(num_buckets=PROGRESS_BUCKETS)
        self.batches = 0
        self._loss = 0.0
        self._samples = 0
        self._last = time.perf_counter()

    def add(self, loss: float, preds: np.ndarray, labels: np.ndarray) -> None:
        """One batch's mean loss and predictions; logs when a window is complete."""
        self.batches += 1
        if not self.period:
            return
        self._loss += loss
        self._samples += preds.size
        self.window.update(preds, labels)
        if self.batches % self.period:
            return
        now = time.perf_counter()
        log.info(
            "time: [%s], batch: [%d], loss: [%.6f], auc: [%.6f], samples/s: [%.0f]",
            time.strftime("%Y-%m-%d %H:%M:%S"),
            self.batches,
            self._loss / self.period,
            self.window.compute().auc,
            self._samples / max(now - self._last, 1e-9),
        )
        self._last, self._loss, self._samples = now, 0.0, 0
        self.window.reset()


class StepSplit:
    """Where a training pass's time goes, as ``sparseps_worker_step_seconds_total{phase}``.

    Phases: ``read`` (the step loop waiting for its next batch: reading, parsing and,
    when pulls run ahead in the pipeline, waiting for them), ``pull`` (pull requests,
    ahead or inline), ``compute`` (forward and backward), ``push`` (handing gradients to
    the servers or the push queue, back-pressure included), ``wait`` (the end-of-pass
    flush and barrier). Counters grow once per batch, never per key.

    Args:
        timings: the trainer's running seconds (``pull_s``, ``compute_s``, ``apply_s``).
        mode: the training mode; its push queue (when it has one) gives the staleness.
    """

    _PHASES = (("pull", "pull_s"), ("compute", "compute_s"), ("push", "apply_s"))

    def __init__(self, timings: MutableMapping[str, float], mode: object) -> None:
        self.metrics = worker_metrics()
        self.timings = timings
        self.queue = getattr(mode, "queue", None)
        self._seen = {key: timings.get(key, 0.0) for _, key in self._PHASES}
        self._counters = {phase: self.metrics.step_seconds.labels(phase) for phase in
                          ("read", "pull", "compute", "push", "wait")}  # fmt: skip

    def reading(self, items: Iterable) -> Iterator:
        """Yield ``items``, adding the time spent waiting for each to ``read``."""
        iterator = iter(items)
        while True:
            start = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self._counters["read"].inc(time.perf_counter() - start)
            yield item

    def step(self, samples: int) -> None:
        """One step done (``samples``: its batch size, 0 for an empty sync step)."""
        for phase, key in self._PHASES:
            now = self.timings.get(key, 0.0)
            if now > self._seen[key]:
                self._counters[phase].inc(now - self._seen[key])
            self._seen[key] = now
        if samples:
            self.metrics.samples.inc(samples)
            self.metrics.batches.inc()
        if self.queue is not None:
            self.metrics.staleness.set(self.queue.stats().pending)

    def wait(self, seconds: float) -> None:
        self._counters["wait"].inc(seconds)


class PassReporter(Closing):
    """Metrics, reports and dumps of one trainer (cheap no-ops when nothing is configured).

    Args:
        model: the trained module (its named parameters are what ``dump.params`` names).
        rank: this worker's rank; only worker 0 writes reports and parameter dumps.
        config: what to compute and write.
    """

    def __init__(self, model: torch.nn.Module, *, rank: int, config: ReportConfig) -> None:
        self.rank = rank
        self.config = config
        self.jsonl = (
            JsonlReporter(config.metrics_path) if config.metrics_path and rank == 0 else None
        )
        self.tensorboard = (
            TensorBoardReporter(config.tensorboard_dir)
            if config.tensorboard_dir and rank == 0
            else None
        )
        self.dump = dump = config.dump
        self.fields = (
            FieldDumper(dump.directory, dump.fields, worker_rank=rank)
            if dump is not None and dump.directory is not None and dump.dump_fields
            else None
        )
        self.params = (
            dict(model.named_parameters())
            if self.dump is not None and self.dump.dump_params
            else {}
        )
        unknown = [n for n in (self.dump.params if self.dump else ()) if n not in self.params]
        if unknown:
            raise ConfigError(
                f"DumpConfig.params: no parameter named {unknown} (have {sorted(self.params)})"
            )

    def metrics(self) -> CTRMetrics:
        """A fresh accumulator for a pass, at the configured resolution."""
        return CTRMetrics(num_buckets=self.config.num_buckets)

    def update(
        self, metrics: CTRMetrics, batch: Batch, preds: np.ndarray, labels: np.ndarray
    ) -> None:
        """Add a batch to a pass's metrics, with its grouping ids when configured."""
        slot = self.config.group_slot
        metrics.update(preds, labels, None if slot is None else group_ids(batch, slot))

    def begin(self, pass_id: int) -> None:
        if self.fields is not None:
            self.fields.begin_pass(pass_id)

    def batch(self, batch: Batch, preds: np.ndarray) -> None:
        if self.fields is None:
            return
        columns: dict[str, object] = {}
        for name in self.fields.fields:
            if name == "sample_id":
                columns[name] = np.asarray(batch.ids, np.int64)
            elif name == "label":
                columns[name] = np.asarray(batch.label, np.float32)
            elif name == "pred":
                columns[name] = np.asarray(preds, np.float32)
            elif name in batch.slots:
                columns[name] = (batch.slots[name].values, batch.slots[name].offsets)
            else:
                raise ConfigError(
                    f"DumpConfig.fields: {name!r} is neither one of {_BUILTIN_FIELDS} nor a slot "
                    f"of the batch (slots: {', '.join(batch.slots)})"
                )
        self.fields.add(**columns)

    def end(self, pass_id: int, phase: str, metrics: MetricResult, **extra: Any) -> None:
        if self.fields is not None:
            self.fields.end_pass()
        self._report(pass_id, phase, metrics, **extra)

    def end_infer(self, passes_done: int, metrics: MetricResult) -> None:
        """An evaluation after ``passes_done`` training passes (no dumps: those are per pass).

        It is reported under the number of the training pass whose model it measured,
        ``passes_done - 1``, so that ``pass: [0], phase: [train]`` is followed by
        ``pass: [0], phase: [test]``; an evaluation before any training pass reports pass 0
        (the model that pass starts from).
        """
        self._report(max(passes_done - 1, 0), "test", metrics, dump=False)

    def _report(
        self, pass_id: int, phase: str, metrics: MetricResult, *, dump: bool = True, **extra: object
    ) -> None:
        # global metrics: every worker holds the same values; each one's /metrics shows them
        worker_metrics().pass_done(pass_id, phase, metrics.auc, metrics.logloss)
        if self.rank != 0:
            return
        log.info("%s", format_metrics(metrics, prefix=f"pass: [{pass_id}], phase: [{phase}]"))
        if self.jsonl is not None:
            self.jsonl.report(metrics, pass_id=pass_id, phase=phase, **extra)
        if self.tensorboard is not None:
            self.tensorboard.report(metrics, pass_id=pass_id, phase=phase)
        if self.params and dump:
            config = self.dump
            assert config is not None and config.directory is not None  # params are kept then
            named = {n: self.params[n].detach().numpy().copy() for n in config.params}
            dump_params(config.directory, pass_id, named)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
