"""Distributed prediction: every worker writes Parquet parts, worker 0 a manifest.

``trainer.predict_from_dataset(dataset, out_dir, key="item", outputs=("item_vec",))``
runs the model forward over each worker's share of ``dataset`` — pulls only, which never
create rows (docs/table.md), no push, no show/click counting — and writes::

    out_dir/part-RRRRR-NNNNN.parquet     worker R's N-th part
    out_dir/MANIFEST.json                written last, by worker 0, after a barrier

Columns of every part (worked example: ``key="item"``, ``outputs=("item_vec",)``, a
single-task loss, a 4-wide item vector)::

    key: uint64         the first id of slot "item" per sample (0 if it has none);
                        int64 for key="sample_id" (Batch.ids)
    pred: float         the predicted probability; one column per task, named
                        pred_<task>, when the loss has several tasks
    item_vec: fixed_size_list<float>[4]   a [B, d] output; a [B] output is a float column

**Named outputs.** A model exposes them with ``named_outputs(batch) -> {name: tensor}``
(each ``[B]`` or ``[B, d]``); :class:`sparseps.models.TwoTower` has ``user_vec`` and
``item_vec``. Asking for an output the model does not name is a ``ConfigError``.

**Each key once.** With ``unique_keys=True`` a key is written once over all workers:
each worker keeps the first row of each key it reads, then the workers exchange their
kept keys (keys only, not rows) and a worker drops a key that a lower rank also kept.

The manifest: ``{"format": "sparseps-predictions", "version": 1, "key", "key_type",
"prediction_columns", "outputs", "unique_keys", "workers", "rows", "parts": [{"file",
"worker", "rows", "bytes"}, ...]}``. A folder without it is incomplete (a crash mid-way):
:func:`read_predictions` refuses it and a new prediction into the folder replaces it.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import collectives
from ..core.atomic_file import replaced_atomically
from ..errors import CheckpointError, ConfigError
from .reporting import group_ids

__all__ = ["MANIFEST", "PredictResult", "predict_dataset", "read_manifest", "read_predictions"]

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
FORMAT = "sparseps-predictions"


@dataclass(frozen=True)
class PredictResult:
    """Where the predictions went: the folder, its manifest and the global row count."""

    out_dir: Path
    manifest: Path
    rows: int
    parts: int


def _key_column(batch, key: str) -> np.ndarray:
    if key == "sample_id":
        return np.asarray(batch.ids, np.int64)
    return group_ids(batch, key)


def _outputs(model, batch, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not names:
        return {}
    found = model.named_outputs(batch)
    out = {}
    for name in names:
        if name not in found:
            raise ConfigError(
                f"predict_from_dataset: the model has no output {name!r} (named_outputs "
                f"gives {sorted(found)})"
            )
        value = found[name].detach().float().numpy()
        if value.ndim not in (1, 2) or value.shape[0] != len(batch):
            raise ConfigError(
                f"predict_from_dataset: output {name!r} has shape {value.shape}, expected "
                f"[{len(batch)}] or [{len(batch)}, d]"
            )
        out[name] = value
    return out


def _check_outputs(model, names: tuple[str, ...]) -> None:
    if names and not callable(getattr(model, "named_outputs", None)):
        raise ConfigError(
            f"predict_from_dataset: outputs={list(names)} but {type(model).__name__} has no "
            "named_outputs(batch) -> {name: tensor} method (see sparseps.worker.predict)"
        )


class _PartWriter:
    """Buffers this worker's columns and writes a Parquet part every ``rows_per_part``."""

    def __init__(self, out_dir: Path, rank: int, rows_per_part: int) -> None:
        self.out_dir, self.rank, self.rows_per_part = out_dir, rank, rows_per_part
        self.chunks: list[dict[str, np.ndarray]] = []
        self.buffered = 0
        self.files: list[Path] = []

    def add(self, columns: dict[str, np.ndarray]) -> None:
        n = len(next(iter(columns.values())))
        if not n:
            return
        self.chunks.append(columns)
        self.buffered += n
        if self.buffered >= self.rows_per_part:
            self.flush()

    def flush(self) -> None:
        if not self.chunks:
            return
        names = list(self.chunks[0])
        merged = {n: np.concatenate([c[n] for c in self.chunks]) for n in names}
        self.chunks, self.buffered = [], 0
        path = self.out_dir / f"part-{self.rank:05d}-{len(self.files):05d}.parquet"
        _write_table(path, merged)
        self.files.append(path)


def _arrow_table(columns: dict[str, np.ndarray]):
    import pyarrow as pa

    arrays, names = [], []
    for name, values in columns.items():
        if values.ndim == 2:
            flat = pa.array(np.ascontiguousarray(values, np.float32).reshape(-1))
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, values.shape[1]))
        else:
            arrays.append(pa.array(values))
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def _write_table(path: Path, columns: dict[str, np.ndarray]) -> None:
    import pyarrow.parquet as pq

    with replaced_atomically(path) as tmp:
        pq.write_table(_arrow_table(columns), tmp)


def predict_dataset(trainer, dataset, out_dir, *, key: str, outputs: tuple[str, ...],
                    unique_keys: bool, rows_per_part: int) -> PredictResult:  # fmt: skip
    """See :meth:`sparseps.Trainer.predict_from_dataset` (collective)."""
    if not isinstance(key, str) or not key:
        raise ConfigError(
            f"predict_from_dataset: key must be a slot name or 'sample_id', got {key!r}"
        )
    if isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise ConfigError(
            f"predict_from_dataset: rows_per_part must be an int >= 1, got {rows_per_part!r}"
        )
    model, loss = trainer.model, trainer.loss
    _check_outputs(model, outputs)
    clash = {key} & set(outputs)
    if clash:
        raise ConfigError(f"predict_from_dataset: {sorted(clash)} is both the key and an output")
    timeout = trainer.strategy.collective_timeout
    rank, out_dir = trainer.rank, Path(out_dir)
    if rank == 0:  # a previous (possibly incomplete) prediction into this folder goes
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
    collectives.barrier(timeout=timeout)
    tasks = loss.tasks
    pred_names = ["pred"] if len(tasks) == 1 else [f"pred_{t}" for t in tasks]
    writer = _PartWriter(out_dir, rank, rows_per_part)
    seen = np.empty(0, np.uint64 if key != "sample_id" else np.int64)
    for batch in trainer.forward_batches(dataset):
        keys = _key_column(batch, key)
        preds = loss(model, batch).predictions
        columns = {"key": keys}
        columns.update({name: preds[:, t] for t, name in enumerate(pred_names)})
        columns.update(_outputs(model, batch, outputs))
        if unique_keys:
            _, first = np.unique(keys, return_index=True)
            first = first[~np.isin(keys[first], seen, assume_unique=True)]
            first.sort()
            columns = {n: v[first] for n, v in columns.items()}
            seen = np.union1d(seen, columns["key"])
        writer.add(columns)
    writer.flush()
    if unique_keys:
        _drop_lower_rank_keys(writer.files, seen, rank, timeout)
    collectives.barrier(timeout=timeout)
    if rank == 0:
        _write_manifest(out_dir, key, pred_names, outputs, unique_keys)
    collectives.barrier(timeout=timeout)
    manifest = json.loads((out_dir / MANIFEST).read_text())
    log.info(
        "predictions: %d rows in %d parts under %s",
        manifest["rows"],
        len(manifest["parts"]),
        out_dir,
    )
    return PredictResult(out_dir, out_dir / MANIFEST, int(manifest["rows"]), len(manifest["parts"]))


def _drop_lower_rank_keys(files: list[Path], mine: np.ndarray, rank: int, timeout: float) -> None:
    """Rewrite this worker's parts without keys that a lower rank also kept."""
    import pyarrow.parquet as pq

    everyone = collectives.all_gather_arrays(mine, timeout=timeout)
    lower = np.unique(np.concatenate([everyone[r] for r in range(rank)] or [mine[:0]]))
    if not lower.size:
        return
    for path in files:
        table = pq.read_table(path)
        keep = ~np.isin(table.column("key").to_numpy(), lower)
        if keep.all():
            continue
        with replaced_atomically(path) as tmp:
            pq.write_table(table.filter(keep), tmp)


def _write_manifest(out_dir: Path, key: str, pred_names, outputs, unique_keys: bool) -> None:
    import pyarrow.parquet as pq

    parts, workers = [], set()
    for path in sorted(out_dir.glob("part-*.parquet")):
        rows = pq.ParquetFile(path).metadata.num_rows
        worker = int(path.name.split("-")[1])
        workers.add(worker)
        parts.append(
            {"file": path.name, "worker": worker, "rows": rows, "bytes": path.stat().st_size}
        )
    manifest = {
        "format": FORMAT, "version": 1, "key": key,
        "key_type": "int64" if key == "sample_id" else "uint64",
        "prediction_columns": list(pred_names), "outputs": list(outputs),
        "unique_keys": unique_keys, "workers": collectives.world_size(),
        "rows": sum(p["rows"] for p in parts), "parts": parts,
    }  # fmt: skip
    with replaced_atomically(out_dir / MANIFEST, sync=True) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def read_manifest(out_dir) -> dict:
    """The manifest of a complete prediction folder.

    Raises:
        CheckpointError: no manifest (incomplete), or a part missing or of another size.
    """
    out_dir = Path(out_dir)
    path = out_dir / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{out_dir}: no {MANIFEST}; not a complete prediction output")
    manifest = json.loads(path.read_text())
    for part in manifest["parts"]:
        file = out_dir / part["file"]
        if not file.is_file() or file.stat().st_size != part["bytes"]:
            raise CheckpointError(f"{file}: missing or not the size the manifest lists")
    return manifest


def read_predictions(out_dir, columns=None):
    """Every part of a complete prediction folder as one ``pyarrow.Table`` (manifest order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = read_manifest(out_dir)
    tables = [pq.read_table(Path(out_dir) / p["file"], columns=columns) for p in manifest["parts"]]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables)
