"""Per-pass reporting of a trainer: the log line, a JSON line, and debugging dumps.

- Worker 0 logs one line per pass and phase (``pass: [3], phase: [train], auc: [...]``)
  and, when ``metrics_path`` is set, appends one JSON object per pass and phase to it.
- With a :class:`~sparseps.metrics.DumpConfig`, every worker writes the chosen per-sample
  fields of each pass (``sample_id``, ``label``, ``pred`` and any slot name, whose ids
  are written as a list column) and worker 0 the chosen dense parameters; the formats
  are documented in docs/metrics.md.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import ConfigError
from ..metrics import DumpConfig, FieldDumper, JsonlReporter, dump_params, format_metrics

__all__ = ["PassReporter"]

log = logging.getLogger(__name__)

_BUILTIN_FIELDS = ("sample_id", "label", "pred")


class PassReporter:
    """Reports and dumps of one trainer (cheap no-ops when nothing is configured)."""

    def __init__(
        self, model, *, rank: int, metrics_path: str | None, dump: DumpConfig | None
    ) -> None:
        self.rank = rank
        self.jsonl = JsonlReporter(metrics_path) if metrics_path and rank == 0 else None
        self.dump = dump or DumpConfig()
        self.fields = (
            FieldDumper(self.dump.directory, self.dump.fields, worker_rank=rank)
            if self.dump.dump_fields
            else None
        )
        self.params = dict(model.named_parameters()) if self.dump.dump_params else {}
        unknown = [name for name in self.dump.params if name not in self.params]
        if unknown:
            raise ConfigError(
                f"DumpConfig.params: no parameter named {unknown} (have {sorted(self.params)})"
            )

    def begin(self, pass_id: int) -> None:
        if self.fields is not None:
            self.fields.begin_pass(pass_id)

    def batch(self, batch, preds: np.ndarray) -> None:
        if self.fields is None:
            return
        columns = {}
        for name in self.dump.fields:
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
                    f"DumpConfig.fields: {name!r} is neither one of {_BUILTIN_FIELDS} nor a slot of the batch"
                )
        self.fields.add(**columns)

    def end(self, pass_id: int, phase: str, metrics, **extra) -> None:
        if self.fields is not None:
            self.fields.end_pass()
        self._report(pass_id, phase, metrics, **extra)

    def end_infer(self, pass_id: int, metrics) -> None:
        """Evaluation after training pass ``pass_id - 1`` (no dumps: those are per training pass)."""
        self._report(pass_id, "test", metrics, dump=False)

    def _report(self, pass_id: int, phase: str, metrics, *, dump: bool = True, **extra) -> None:
        if self.rank == 0:
            log.info("%s", format_metrics(metrics, prefix=f"pass: [{pass_id}], phase: [{phase}], "))
            if self.jsonl is not None:
                self.jsonl.report(metrics, pass_id=pass_id, phase=phase, **extra)
            if self.params and dump:
                named = {n: self.params[n].detach().numpy().copy() for n in self.dump.params}
                dump_params(self.dump.directory, pass_id, named)
