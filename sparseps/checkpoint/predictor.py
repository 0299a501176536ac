"""``sparseps.Predictor``: predictions from an inference model, without servers.

Loads the chain of saves (newest complete base, then its deltas in order; see
:mod:`sparseps.checkpoint.inference`), verifies every manifest, serves each table's base
rows from its memory-mapped Arrow files through a sorted-key index
(:mod:`.mapped_table`: lookups are one ``searchsorted``, the rows stay in the page cache)
with the deltas' rows in memory over them, and runs the exported head of the last save. A key the model does not hold gets what a pull
of an unknown key gives during training: its deterministic initial value when the
table admits every key, zeros otherwise — so predictions match the trainer's.

``Predictor(directory)`` starts from the newest chain that verifies: a save that does
not verify or load (a flipped byte, a truncated shard, a head that fails) is skipped and
logged, with why; a base that fails makes it try the chain of the base before it, a delta
that fails ends the chain before it. Only when no chain loads is it refused, naming every
save it tried. So one corrupt save does not stop a restart (``sparseps serve``,
``sparseps predict``) from serving what the last good chain holds.

A ``Predictor`` is an immutable value: :meth:`Predictor.then` returns a *new* predictor
with one more save applied (a delta on top, or a base that replaces everything) and
leaves the old one as it was, its arrays read-only. A service can therefore swap one
reference to follow a growing chain while requests in flight finish on the model they
started with (:mod:`sparseps.serving`); a table a delta does not touch is shared, and
what only the old predictor holds is freed with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from ..config import TableConfig
from ..core.lookup import SlotLookup, build_lookup
from ..core.pooling import pool_bags, slot_outputs
from ..errors import CheckpointError, ConfigError, InputError
from ..files import manifest as mf
from ..files import shards
from . import inference
from .embedding_table import EmbeddingTable
from .mapped_table import MappedTable, RowIndex, index_name, remove_stale_indexes
from .model_input import ModelInput, describe_schema, schema_mismatch

if TYPE_CHECKING:
    from ..data.schema import Batch, Schema

__all__ = ["EmbeddingTable", "Predictor", "SkippedSave"]

log = logging.getLogger(__name__)


Table = EmbeddingTable | MappedTable


def _applied(
    tables: Mapping[str, Table], folder: Path, manifest: dict, index_dir: Path | None = None
) -> dict[str, Table]:
    """``tables`` with the save in ``folder`` applied (new tables; the inputs unchanged).

    A base's tables map its files (:class:`MappedTable`; ``index_dir``: where their
    sorted-key indexes are shared, None: in memory); a delta's rows are merged in memory.

    Raises:
        CheckpointError: the manifest lacks a section, or a table's dim changed.
    """
    try:
        kind, entries = manifest["kind"], manifest["tables"]
        if kind == "base":
            return {
                name: _mapped_base(folder, name, entry, manifest["files"], index_dir)
                for name, entry in entries.items()
            }
        result = dict(tables)
        for name, entry in entries.items():
            config = TableConfig.from_dict(entry["config"])
            table = result.get(name)
            if table is None:
                table = EmbeddingTable.empty(config)
            elif table.config.dim != config.dim:
                raise CheckpointError(
                    f"{folder}: table {name!r} has dim {config.dim}, the chain before it "
                    f"{table.config.dim}; a delta cannot change a table's dim"
                )
            # tombstones first: a key deleted by shrink and pushed again later is in the rows
            files = sorted(entry["files"], key=lambda f: not f.endswith(".tombstones.arrow"))
            for file_name in files:
                meta, columns = shards.read_shard(folder / file_name)
                if meta.get("kind") == "tombstones":
                    table = table.delete(columns["key"])
                else:
                    rows = columns["embedding"].reshape(-1, config.pull_dim)
                    table = table.upsert(columns["key"], rows)
            result[name] = table
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(
            f"{folder}: malformed inference manifest or shard ({type(exc).__name__}: {exc})"
        ) from exc
    return result


def _mapped_base(
    folder: Path, name: str, entry: dict, records: dict, index_dir: Path | None
) -> MappedTable:
    """One table of a base, its files memory-mapped (read-only views, no copy)."""
    config = TableConfig.from_dict(entry["config"])
    files = [folder / f for f in sorted(entry["files"]) if not f.endswith(".tombstones.arrow")]
    columns = [shards.read_shard(path, copy=False)[1] for path in files]
    index = None
    if index_dir is not None:
        mine = {f.name: records.get(f.name) for f in files}
        stem = index_name(folder, name, mine)
        try:
            index = RowIndex.shared([c["key"] for c in columns], index_dir, stem)
        except OSError as exc:  # a folder the service cannot write: each process its own
            log.warning("%s: cannot keep the row index there (%s); built in memory", index_dir,
                        exc)  # fmt: skip
        else:
            remove_stale_indexes(index_dir, folder.parent)
    return MappedTable.of_files(config, files, columns, index)


class SkippedSave(NamedTuple):
    """A save a predictor did not load, and why (the error it gave)."""

    folder: Path
    reason: str


class Predictor:
    """Predict click probabilities from an inference model directory.

    Args:
        directory: the folder ``trainer.save_inference_model`` wrote into.
        saves: the save folders to load, a base then its deltas in order; any that fails
            is an error. Default: the newest chain of the directory that verifies
            (:func:`sparseps.checkpoint.inference.chains`; see the module docstring),
            what it skipped in :attr:`skipped`.
        on_loaded: called with each save's folder once it is applied (progress).
        check: called with each candidate model (the chain up to each save); a
            ``CheckpointError`` it raises skips that save as if it did not verify (the
            service's one-row warm-up request). Only with the default ``saves``.
        index_dir: a folder where the bases' sorted-key indexes are kept and shared by
            every process that serves them (:mod:`.mapped_table`); None: each predictor
            builds its own in memory. A base's rows are memory-mapped either way.

    Raises:
        CheckpointError: no complete base, or no chain that verifies (naming each save
            tried and why); with ``saves`` given, a save that does not verify or a head
            that does not load (each names the folder).
    """

    directory: Path
    saves: tuple[Path, ...]
    tables: Mapping[str, Table]
    embeddings: tuple[dict, ...]
    manifest: dict  # the last save's
    head: Callable[..., torch.Tensor]
    skipped: tuple[SkippedSave, ...]  # saves of newer chains that did not verify

    def __init__(
        self,
        directory: str | Path,
        saves: Sequence[Path] | None = None,
        *,
        on_loaded: Callable[[Path], None] | None = None,
        check: Callable[[Predictor], object] | None = None,
        index_dir: str | Path | None = None,
    ) -> None:
        self.index_dir = None if index_dir is None else Path(index_dir)
        if not saves:
            newest = _newest_verified(Path(directory), on_loaded, check, self.index_dir)
            newest._copy_to(self)
            return
        folders = [Path(f) for f in saves]
        tables: dict[str, Table] = {}
        manifest: dict = {}
        for i, folder in enumerate(folders):
            manifest = _verified(folder)
            if (manifest["kind"] == "base") != (i == 0):
                raise CheckpointError(
                    f"{folder}: a chain is one base then deltas; this {manifest['kind']} is "
                    f"save {i} of {[f.name for f in folders]}"
                )
            tables = _applied(tables, folder, manifest, self.index_dir)
            if on_loaded is not None:
                on_loaded(folder)
        head = inference.load_head(folders[-1], manifest)
        self._set(Path(directory), tuple(folders), tables, manifest, head)

    def _set(self, directory, folders, tables, manifest, head, skipped=()) -> None:
        self.directory = directory
        self.saves = folders
        self.tables = MappingProxyType(dict(tables))
        self.embeddings = tuple(manifest["embeddings"])
        self.manifest = manifest
        self.head = head  # an exported program's module runs as exported (eval mode)
        self.skipped = tuple(skipped)

    def _copy_to(self, other: Predictor) -> None:
        other.index_dir = self.index_dir
        other._set(self.directory, self.saves, self.tables, self.manifest, self.head, self.skipped)

    def then(self, folder: Path) -> Predictor:
        """A new predictor: this one with the save in ``folder`` applied (a delta on top,
        or a base that replaces everything). ``self`` is unchanged.

        Raises:
            CheckpointError: ``folder`` does not verify or does not load.
        """
        folder = Path(folder)
        manifest = _verified(folder)
        if manifest["kind"] == "base":
            return Predictor(self.directory, [folder], index_dir=self.index_dir)
        tables = _applied(self.tables, folder, manifest)
        head = inference.load_head(folder, manifest)
        successor = object.__new__(Predictor)
        successor.index_dir = self.index_dir
        successor._set(self.directory, (*self.saves, folder), tables, manifest, head)
        return successor

    @property
    def sequence(self) -> int:
        """Sequence number of the last applied save."""
        return int(self.manifest["sequence"])

    @property
    def passes(self) -> int | None:
        passes = self.manifest.get("state", {}).get("passes")
        return int(passes) if passes is not None else None

    @property
    def input(self) -> ModelInput | None:
        """The data the model was trained on, as its last save records it (None: a save
        made before inference models recorded it, or a trainer that did not learn it).

        Raises:
            CheckpointError: the record is malformed (names the save).
        """
        record = self.manifest.get("input")
        if record is None:
            return None
        try:
            return ModelInput.from_dict(record)
        except ConfigError as exc:
            raise CheckpointError(f"{self.saves[-1]}: malformed input record ({exc})") from None

    @property
    def dense_width(self) -> int | None:
        """Dense values per row the head takes (None: a save that does not record it)."""
        inputs = self.manifest.get("head", {}).get("inputs")
        return int(inputs[0][0]) if inputs else None

    def check_schema(self, schema: Schema, *, what: str = "the data") -> None:
        """Raises:
        InputError: ``schema`` cannot feed this model (no slot its embeddings read, or
            another dense width), starting "this model expects ..." and naming ``what``.
        """
        slots = tuple(s for e in self.embeddings if e["slots"] for s in e["slots"])
        problem = schema_mismatch(schema, tuple(dict.fromkeys(slots)), self.dense_width)
        if problem is None:
            return
        recorded = self.input
        expects = (
            recorded.describe()
            if recorded is not None
            else f"slots {sorted(set(slots))} and {self.dense_width} dense values"
        )
        raise InputError(
            f"this model expects {expects}; {what} ({describe_schema(schema)}) does not fit: "
            f"{problem}"
        )

    def predict_batch(self, batch: Batch) -> np.ndarray:
        """Probabilities for one :class:`sparseps.data.Batch`: ``[B]``, or ``[B, T]`` for a
        head with ``T > 1`` outputs per row (e.g. a multi-task model's)."""
        pooled = []
        lookups: dict[tuple[str, ...], SlotLookup] = {}
        for spec in self.embeddings:
            slots = tuple(spec["slots"]) if spec["slots"] is not None else tuple(batch.slots)
            lookup = lookups.get(slots) or lookups.setdefault(slots, build_lookup(batch, slots))
            rows = torch.from_numpy(self.tables[spec["table"]].lookup(lookup.keys))
            bags = pool_bags(rows, lookup, spec["pooling"] or "sum")
            config = self.tables[spec["table"]].config
            pooled.append(slot_outputs(bags, len(slots), config.accessor,
                                       cvm=bool(spec.get("cvm")), slots=slots))  # fmt: skip
        dense = torch.from_numpy(np.ascontiguousarray(batch.dense, np.float32))
        with torch.no_grad():
            logits = self.head(dense, *pooled)
        logits = logits.flatten(1) if logits.dim() > 1 else logits[:, None]  # [B, outputs]
        if logits.shape[1] == 1:
            logits = logits[:, 0]
        return torch.sigmoid(logits).numpy().astype(np.float32)

    def predict(self, dataset: Iterable[Batch]) -> np.ndarray:
        """Probabilities for every sample of an iterable of batches (a dataset)."""
        parts = [self.predict_batch(batch) for batch in dataset]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    @property
    def outputs(self) -> int:
        """Predictions per row (1 unless the head has several outputs)."""
        return int(self.manifest.get("head", {}).get("outputs", 1))

    def rows(self) -> dict[str, int]:
        """Keys served per table (counted, not listed: ``GET /model`` asks on every call)."""
        return {name: t.row_count for name, t in self.tables.items()}

    def nbytes(self) -> int:
        """Bytes of every table's keys and rows (mapped and in memory)."""
        return sum(t.nbytes for t in self.tables.values())

    def mapped_files(self) -> list[Path]:
        """The files whose maps hold the rows (the base's, the shared indexes)."""
        return [f for t in self.tables.values() if isinstance(t, MappedTable)
                for f in t.mapped_files]  # fmt: skip


def _newest_verified(
    directory: Path,
    on_loaded: Callable[[Path], None] | None,
    check: Callable[[Predictor], object] | None,
    index_dir: Path | None,
) -> Predictor:
    """The newest chain of ``directory`` that loads (see the module docstring).

    Raises:
        CheckpointError: no complete base; or no base that verifies, naming each.
    """
    candidates = inference.chains(directory)
    if not candidates:
        inference.chain(directory)  # raises: no complete base, named as it always was
    verify = check or (lambda predictor: None)
    skipped: list[SkippedSave] = []
    for folders in candidates:
        try:
            model = Predictor(directory, folders[:1], on_loaded=on_loaded, index_dir=index_dir)
            verify(model)
        except CheckpointError as exc:
            skipped.append(SkippedSave(folders[0], str(exc)))
            log.warning("%s: skipping %s, it does not load: %s", directory, folders[0].name, exc)
            continue
        for i, folder in enumerate(folders[1:], start=1):
            try:
                following = model.then(folder)
                verify(following)
            except CheckpointError as exc:
                skipped.append(SkippedSave(folder, str(exc)))
                log.warning(
                    "%s: skipping %s, it does not load: %s; the chain ends before it (%d "
                    "later deltas wait for the next base)",
                    directory,
                    folder.name,
                    exc,
                    len(folders) - i - 1,
                )
                break
            model = following
            if on_loaded is not None:
                on_loaded(folder)
        if skipped:
            log.warning(
                "%s: loaded %s + %d deltas (sequence %d), the newest chain that verifies; "
                "skipped %s",
                directory,
                model.saves[0].name,
                len(model.saves) - 1,
                model.sequence,
                [s.folder.name for s in skipped],
            )
        model._set(model.directory, model.saves, model.tables, model.manifest, model.head, skipped)
        return model
    tried = "; ".join(f"{s.folder.name}: {s.reason}" for s in skipped)
    raise CheckpointError(f"{directory}: no inference chain verifies ({tried})")


def _verified(folder: Path) -> dict:
    """The manifest of an inference save, every file checked."""
    manifest = mf.verify(folder, mf.read_manifest(folder, fmt="sparseps-inference"))
    if manifest.get("kind") not in ("base", "delta"):
        raise CheckpointError(f"{folder}: inference manifest kind {manifest.get('kind')!r}")
    return manifest
