"""``sparseps.Trainer``: train, infer and evaluate a model whose embeddings live on servers.

Per batch: dedup the keys once per table, over every slot its modules read (one pull per
table and server; see :mod:`sparseps.worker.binding`), forward and backward in PyTorch,
then push the merged per-key gradients with show/click counts. How
pulls and pushes travel depends on the :class:`~sparseps.worker.strategy.Strategy` mode
(see :mod:`sparseps.worker.modes`). The trainer connects lazily, on its first use, so a
script may build it before ``if sps.is_server(): sps.run_server()``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from .. import optim
from ..checkpoint.inference_needs import InferenceNeeds
from ..core import collectives
from ..errors import ConfigError, DeadlineError
from ..metrics import CTRMetrics, MetricResult, ReportConfig, UserStats
from ..observe.diagnose import dump_note
from ..rpc.client import PSClient
from .binding import TableBinder
from .losses import Loss, LossOutput, as_loss
from .nn import SparseEmbedding
from .pipeline import Prefetcher
from .reporting import PassReporter, Progress, StepSplit
from .results import InferResult, OnBatch, PassResult, Step
from .state import TrainingState, serve_if_heter_worker
from .strategy import Strategy

if TYPE_CHECKING:
    from ..checkpoint.hooks import SaveHooks
    from ..data.schema import Batch
    from .predict import PredictResult

__all__ = ["InferResult", "PassResult", "Step", "Trainer"]

log = logging.getLogger(__name__)


class Trainer:
    """Trains a model with :class:`~sparseps.nn.SparseEmbedding` modules on a PS cluster.

    Args:
        model: a ``torch.nn.Module`` whose ``forward(batch)`` returns logits ``[B]``.
        dense_optimizer: the rule for the dense parameters (``sparseps.optim.Adam(...)``,
            ``SGD`` or ``Adagrad``); applied by the servers in async/geo mode and by every
            worker identically in sync mode. Default ``Adam(lr=0.001)``.
        strategy: the training mode and its knobs (default async).
        client: an existing ``PSClient`` (default: one to ``sps.server_endpoints()``).
        num_threads: torch compute threads of this worker (default 1: workers and servers
            of a job share the machine's cores; None leaves torch's setting alone).
        report: per-pass metrics and outputs (JSON lines, TensorBoard, AUC buckets,
            UAUC/GAUC grouping, dumps); default: metrics logged by worker 0 only.
        loss: what is minimised (see :mod:`sparseps.worker.losses`): None (binary
            cross-entropy of ``model(batch)`` logits against ``batch.label``), a
            ``Loss`` (e.g. multi-task), or a function ``fn(logits, batch)`` returning
            per-sample losses.

    Raises:
        ConfigError: a bad dense optimizer, or one table declared by several modules with
            different configs.
    """

    def __init__(
        self,
        model: nn.Module,
        dense_optimizer: optim.Rule | None = None,
        strategy: Strategy | None = None,
        *,
        client: PSClient | None = None,
        num_threads: int | None = 1,
        report: ReportConfig | None = None,
        loss: Loss | Callable[[torch.Tensor, Batch], torch.Tensor] | None = None,
    ) -> None:
        self.model = model
        self.loss = as_loss(loss)
        self.dense_rule = dense_optimizer if dense_optimizer is not None else optim.Adam(lr=0.001)
        if not hasattr(self.dense_rule, "state_dim"):
            raise ConfigError(
                "Trainer.dense_optimizer: expected a sparseps.optim rule (SGD, Adagrad, Adam), "
                f"got {type(self.dense_rule).__name__}; dense updates run on the servers"
            )
        if report is not None and not isinstance(report, ReportConfig):
            raise ConfigError(
                f"Trainer.report: expected a sparseps.metrics.ReportConfig, got {type(report).__name__}"
            )
        self.strategy = strategy or Strategy()
        # what save_inference_model needs: an exportable model (checked now, warned when
        # not) and the data trained on (learned per pass); sparseps.checkpoint.inference_needs
        self.inference = InferenceNeeds.of(model)
        self.embeddings = [m for m in model.modules() if isinstance(m, SparseEmbedding)]
        self._binder = TableBinder(self.embeddings)
        self.num_threads = num_threads
        self.report_config = report or ReportConfig()
        self._reporter: PassReporter | None = None
        self._timings: defaultdict[str, float] = defaultdict(float)
        self.state = TrainingState(
            model,
            self._binder.tables,
            self.strategy,
            self.dense_rule,
            client=client,
            num_threads=num_threads,
        )
        serve_if_heter_worker(self)

    @property
    def tables(self) -> dict:
        """``{table name: TableConfig}`` of every table the model reads."""
        return dict(self._binder.tables)

    @property
    def client(self) -> PSClient:
        self._start()
        client = self.state.client
        assert client is not None, "a started state has a client"
        return client

    @property
    def passes(self) -> int:
        """Training passes completed (saved in checkpoints)."""
        return self.state.passes

    @passes.setter
    def passes(self, value: int) -> None:
        self.state.passes = value

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def server_num(self) -> int:
        return self.state.server_num

    @property
    def _mode(self):
        return self.state.mode

    @property
    def _client(self):
        return self.state.client

    def _start(self) -> None:
        self.state.start()
        if self._reporter is None:
            self._reporter = PassReporter(self.model, rank=self.rank, config=self.report_config)

    @property
    def _started_reporter(self) -> PassReporter:
        """The reporter, made by ``_start`` (every method that reports starts first)."""
        assert self._reporter is not None, "Trainer._start() first"
        return self._reporter

    # -- per batch -------------------------------------------------------------------------

    def _pull_all(self, lookups: dict) -> dict:
        """Rows of every table for the batch, ``{table: [U, dim]}``, as the mode reads them."""
        return self._mode.pull_rows({t: lk.keys for t, lk in lookups.items()})

    def _prepare_with_pull(self, batch):
        lookups = self._binder.lookups(batch)
        start = time.perf_counter()
        rows = self._pull_all(lookups)
        self._timings["pull_s"] += time.perf_counter() - start
        return batch, lookups, rows

    def _prepare(self, batch):
        lookups = self._binder.lookups(batch)
        self._prefetch_rows(lookups)
        return batch, lookups, None

    def _prefetch_rows(self, lookups: dict) -> None:
        """Tables with a memory budget: the servers promote this batch's disk rows while
        the batches before it compute (this runs in the pipeline's thread, ahead)."""
        configs = self._binder.tables
        for table, lookup in lookups.items():
            if configs[table].tiered:
                self._client.prefetch(table, lookup.keys).wait()

    def _global(self, metrics) -> MetricResult:
        """The pass metrics over every worker (a collective)."""
        timeout = self.strategy.collective_timeout
        try:
            return metrics.compute(global_=True, timeout=timeout)
        except DeadlineError as exc:
            raise DeadlineError(
                f"pass metrics: not every worker finished its pass within {timeout:.0f} s of "
                "this one; a worker is stuck or has far more data - see the other workers' "
                f"logs, or raise Strategy.collective_timeout{dump_note(exc.message)}",
                op="pass metrics",
                role="worker",
                rank=self.rank,
                seconds=exc.seconds,
                setting="Strategy.collective_timeout",
            ) from exc

    def _task_metrics(self) -> list[CTRMetrics]:
        """One accumulator per task after the first (the reporter's covers the first)."""
        return [self._started_reporter.metrics() for _ in self.loss.tasks[1:]]

    def _update(self, metrics, extra: list, batch, out: LossOutput) -> None:
        self._started_reporter.update(metrics, batch, out.predictions[:, 0], out.labels[:, 0])
        for t, accumulator in enumerate(extra, 1):
            accumulator.update(out.predictions[:, t], out.labels[:, t])

    def _global_tasks(self, main: MetricResult, extra: list) -> dict:
        if not extra:
            return {}
        tasks = {self.loss.tasks[0]: main}
        for name, accumulator in zip(self.loss.tasks[1:], extra, strict=True):
            tasks[name] = self._global(accumulator)
        return tasks

    def _global_stats(self, stats: UserStats) -> dict:
        return stats.compute(global_=True, timeout=self.strategy.collective_timeout)

    def _iterate(self, dataset, *, pulls_ahead: bool) -> Prefetcher:
        prepare = self._prepare_with_pull if pulls_ahead else self._prepare
        depth = 2 if self.strategy.prefetch else 1
        return Prefetcher(
            dataset,
            prepare,
            depth=depth,
            timeout=self.strategy.collective_timeout,
            setting="Strategy.collective_timeout",
        )

    # -- public API ------------------------------------------------------------------------

    def train_from_dataset(
        self, dataset: Iterable[Batch], *, print_period: int = 100, on_batch: OnBatch | None = None,
        next_dataset: Iterable[Batch] | None = None,
    ) -> PassResult:  # fmt: skip
        """One pass over ``dataset`` (this worker's share of it); returns global metrics.

        ``next_dataset``: the next pass's data, prepared while this pass trains
        (:meth:`prefetch_pass`; the GPUPS pipeline, docs/training.md).

        Every ``print_period`` batches this worker logs a progress line (0: none).
        ``on_batch(step, stats)``, when given, is called after each batch with a
        :class:`Step` and the pass's :class:`~sparseps.metrics.UserStats`; the statistics
        it adds are reduced over every worker into ``PassResult.stats``.
        """
        self._start()
        self.inference.trained_on(dataset)  # its schema, format, pipe command
        mode, reporter = self._mode, self._started_reporter
        self.model.train()
        metrics, progress = reporter.metrics(), Progress(print_period)
        extra, stats = self._task_metrics(), UserStats()
        start = time.perf_counter()
        mode.begin_pass(dataset, self._binder.lookups, self.passes)
        if next_dataset is not None:  # after the build: it takes what was prepared for it
            self.prefetch_pass(next_dataset)
        # a dataset that journals finished files (sparseps.data.steal) hears of trained rows
        trained = getattr(dataset, "trained_callback", None)
        trained = None if trained is None else trained()
        prefetcher = self._iterate(
            dataset, pulls_ahead=mode.prefetch_pulls and self.strategy.prefetch
        )
        reporter.begin(self.passes)
        batches = samples = 0
        split = StepSplit(self._timings, mode)
        try:
            steps = split.reading(mode.steps(prefetcher))
            for item, (grads, dense_grad, loss, out) in mode.compute(
                steps, self._train_step, self._binder
            ):
                step_start = time.perf_counter()
                mode.apply(grads, dense_grad)
                self._timings["apply_s"] += time.perf_counter() - step_start
                split.step(0 if out is None else out.predictions.shape[0])
                if out is None:
                    continue
                if trained is not None:
                    trained(item[0])
                preds, labels = out.predictions[:, 0], out.labels[:, 0]
                batches += 1
                samples += preds.size
                self._update(metrics, extra, item[0], out)
                reporter.batch(item[0], preds)
                progress.add(loss, preds, labels)
                if on_batch is not None:
                    on_batch(Step(item[0], loss, out.predictions, out.labels), stats)
            wait_start = time.perf_counter()
            mode.finish_pass()
            split.wait(time.perf_counter() - wait_start)
        except DeadlineError as exc:  # e.g. a server stopped answering: dump every stack
            found = collectives.diagnosed(exc)
            if found is exc:
                raise
            raise found from exc
        finally:
            prefetcher.close()
            self._binder.unbind()
        seconds = time.perf_counter() - start
        timings = {k: round(v, 4) for k, v in self._timings.items()}
        timings.update(self._mode.timings())
        self._timings.clear()
        main = self._global(metrics)
        result = PassResult(
            main, batches, samples, seconds, timings,
            tasks=self._global_tasks(main, extra), stats=self._global_stats(stats),
        )  # fmt: skip
        reporter.end(
            self.passes, "train", result.metrics, samples_per_s=round(result.samples_per_s, 1)
        )
        self.passes += 1
        return result

    def prefetch_pass(self, dataset: Iterable[Batch]) -> None:
        """Prepare the next training pass over ``dataset`` while the current one trains
        (call it before or during the pass that precedes it). GPUPS reads the next pass's
        keys and rows in the background so its build stalls less (docs/training.md,
        "GPUPS"); the other modes do nothing."""
        self._start()
        hook = getattr(self._mode, "prefetch_pass", None)
        if hook is not None:
            hook(dataset, self._binder.lookups)

    def _train_step(self, item):
        dense_params = self._mode.dense
        dense_params.zero_grad()
        if item is None:  # sync mode: this worker has no data left but the others do
            grads = self._binder.empty_grads()
            return grads, np.zeros(dense_params.size, np.float32), 0.0, None
        batch, lookups, rows = item
        if rows is None:
            start = time.perf_counter()
            rows = self._pull_all(lookups)
            self._timings["pull_s"] += time.perf_counter() - start
        start = time.perf_counter()
        self._mode.before_forward()
        leaves = self._binder.bind(batch, lookups, rows, grad=True)
        out = self.loss(self.model, batch)
        (out.loss / self._mode.loss_scale(len(batch))).backward()
        self._timings["compute_s"] += time.perf_counter() - start
        # fresh arrays (or gpups' device tensors): the next backward does not touch them
        grads, dense_grad = self._mode.step_grads(self._binder, lookups, leaves, dense_params)
        return grads, dense_grad, float(out.loss.detach()) / max(len(batch), 1), out

    def infer_from_dataset(
        self, dataset: Iterable[Batch], *, on_batch: OnBatch | None = None
    ) -> InferResult:
        """Predict this worker's share of ``dataset``; no pushes (tables stay unchanged).

        ``on_batch(step, stats)``: as for :meth:`train_from_dataset`.
        """
        self._start()
        self._mode.refresh_dense()
        self.model.eval()
        metrics = self._started_reporter.metrics()
        extra, stats = self._task_metrics(), UserStats()
        predictions, labels = [], []
        prefetcher = self._iterate(dataset, pulls_ahead=True)
        try:
            with torch.no_grad():
                for batch, lookups, rows in prefetcher:
                    self._binder.bind(batch, lookups, rows, grad=False)
                    out = self.loss(self.model, batch)
                    self._update(metrics, extra, batch, out)
                    predictions.append(out.predictions)
                    labels.append(out.labels)
                    if on_batch is not None:
                        loss = float(out.loss) / max(len(batch), 1)
                        on_batch(Step(batch, loss, out.predictions, out.labels), stats)
        finally:
            prefetcher.close()
            self._binder.unbind()
        result = self._global(metrics)
        tasks, user_stats = self._global_tasks(result, extra), self._global_stats(stats)
        self._started_reporter.end_infer(self.passes, result)
        width = len(self.loss.tasks)
        cat = lambda parts: (  # noqa: E731
            np.concatenate(parts) if parts else np.zeros((0, width), np.float32)
        )
        preds, label = cat(predictions), cat(labels)
        if width == 1:
            preds, label = preds[:, 0], label[:, 0]
        return InferResult(preds, label, result, tasks=tasks, stats=user_stats)

    def evaluate(self, dataset: Iterable[Batch]) -> MetricResult:
        """Global metrics (AUC from merged buckets, logloss, ...) of the model on ``dataset``."""
        return self.infer_from_dataset(dataset).metrics

    def predict_from_dataset(
        self, dataset: Iterable[Batch], out_dir: str | Path, *, key: str = "sample_id",
        outputs: Sequence[str] = (), unique_keys: bool = False, rows_per_part: int = 1 << 20,
    ) -> PredictResult:  # fmt: skip
        """Distributed prediction: Parquet parts of every worker's share, plus a manifest.

        Collective (every worker calls it). No push, no table growth: pulls never create
        rows. See :mod:`sparseps.worker.predict` for the columns and the manifest.

        Args:
            dataset: this worker's share of the data (a dataset split by rank).
            out_dir: the output folder (replaced if it exists).
            key: the key column: a slot name (its first id per sample) or ``sample_id``.
            outputs: names of model outputs to write (the model's ``named_outputs``).
            unique_keys: write each key once over all workers (the first occurrence).
            rows_per_part: a Parquet part is written once this many rows are buffered.

        Returns:
            :class:`~sparseps.worker.predict.PredictResult` (the same on every worker).
        """
        from .predict import predict_dataset

        self._start()
        return predict_dataset(
            self, dataset, out_dir, key=key, outputs=tuple(outputs), unique_keys=unique_keys,
            rows_per_part=rows_per_part,
        )  # fmt: skip

    def forward_batches(self, dataset: Iterable[Batch]) -> Iterator[Batch]:
        """Yield ``batch`` with the model bound to its pulled rows, under ``no_grad``.

        For tools that run the model forward themselves (prediction); nothing is pushed.
        The caller must exhaust or close the generator.
        """
        self._start()
        self._mode.refresh_dense()
        self.model.eval()
        prefetcher = self._iterate(dataset, pulls_ahead=True)
        try:
            with torch.no_grad():
                for batch, lookups, rows in prefetcher:
                    self._binder.bind(batch, lookups, rows, grad=False)
                    yield batch
        finally:
            prefetcher.close()
            self._binder.unbind()

    # -- between passes: features and model files (collective; sparseps.checkpoint) ------

    def decay(self, rate: float | None = None) -> None:
        """Decay show/click of every table (end of a day); ``rate`` default: the table's."""
        self.state.decay(rate)

    def shrink(self) -> dict[str, int]:
        """Delete rows by score / unseen days; deleted keys become tombstones of the next delta."""
        return self.state.shrink()

    def tombstones(self, table: str) -> np.ndarray:
        """Keys deleted by shrink since the last inference save (worker 0)."""
        return self.state.tombstones(table)

    def save_checkpoint(
        self, directory: str | Path, *, state: dict | None = None, hooks: SaveHooks | None = None
    ) -> dict | None:
        """Save everything needed to resume; ``hooks``: fault injection for tests
        (:class:`~sparseps.checkpoint.hooks.SaveHooks`)."""
        from ..checkpoint import trainer_files
        from ..checkpoint.hooks import NO_HOOKS

        return trainer_files.save_checkpoint(self, directory, state=state, hooks=hooks or NO_HOOKS)

    def load_checkpoint(self, directory: str | Path) -> dict:
        """Load a checkpoint (any number of servers); returns the saved ``state``."""
        from ..checkpoint import trainer_files

        return trainer_files.load_checkpoint(self, directory)

    def save_inference_model(
        self, directory: str | Path, *, mode: str = "base", hooks: SaveHooks | None = None
    ) -> Path | None:
        """Save filtered embeddings + the exported dense head (``mode`` base or delta)."""
        from ..checkpoint import trainer_files
        from ..checkpoint.hooks import NO_HOOKS

        return trainer_files.save_inference_model(
            self, directory, mode=mode, hooks=hooks or NO_HOOKS
        )

    def stop(self) -> None:
        """Flush pending pushes and release the connection (servers keep running)."""
        self.state.close()
        if self._reporter is not None:
            self._reporter.close()
            self._reporter = None

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
