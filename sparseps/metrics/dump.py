"""Debugging dumps (off by default): per-sample fields and chosen parameters, per pass.

Layout under the dump folder (one sub-folder per pass)::

    DIR/pass-00003/fields-worker-00000.parquet   per-sample fields of worker 0
    DIR/pass-00003/fields-worker-00001.parquet   ... of worker 1
    DIR/pass-00003/params.npz                    chosen parameters (dump_params)

A fields file is Parquet with one row per sample and one column per chosen field. A
column handed over as a 1-D array is a plain column; a 2-D ``[n, k]`` array becomes
``fixed_size_list<k>``; a jagged ``(values, offsets)`` pair (the batch layout of a slot:
sample ``i`` owns ``values[offsets[i]:offsets[i + 1]]``) becomes ``list<values type>``.
Parameters are a NumPy ``.npz`` archive, one array per name. Every file is written under
a temporary name and renamed when complete, so a reader never sees half a file.
:func:`read_dump` reads any of them back into the same shapes.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.atomic_file import replaced_atomically, temporary_name
from ..errors import ConfigError, InputError

__all__ = ["DumpConfig", "FieldDumper", "dump_params", "pass_dir", "read_dump"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]*$")  # safe as a column and zip member name
ROWS_PER_GROUP = 1 << 16


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{what} {name!r}: use letters, digits, '_', '.', ':' or '-'")
    return name


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ConfigError(f"{what} must be an int >= 0, got {value!r}")
    return int(value)


def pass_dir(directory: str | os.PathLike, pass_id: int) -> Path:
    """``directory/pass-{pass_id:05d}``."""
    return Path(directory) / f"pass-{_check_int(pass_id, 'pass_id'):05d}"


@dataclass(frozen=True)
class DumpConfig:
    """What to dump; dumping is off unless ``directory`` is set and something is chosen.

    Attributes:
        directory: the dump folder, or None (off).
        fields: per-sample fields to write each pass (e.g. ``("sample_id", "label",
            "pred", "C1")``).
        params: names of parameters to write each pass.
    """

    directory: str | None = None
    fields: tuple[str, ...] = ()
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for attr in ("fields", "params"):
            value = getattr(self, attr)
            if isinstance(value, str) or not isinstance(value, tuple | list):
                raise ConfigError(f"DumpConfig.{attr} must be a tuple of names, got {value!r}")
            object.__setattr__(
                self, attr, tuple(_check_name(n, f"DumpConfig.{attr}") for n in value)
            )
        if (self.fields or self.params) and not self.directory:
            raise ConfigError("DumpConfig: fields/params chosen but directory is not set")

    @property
    def dump_fields(self) -> bool:
        return bool(self.directory and self.fields)

    @property
    def dump_params(self) -> bool:
        return bool(self.directory and self.params)


def _to_arrow(name: str, column: object) -> pa.Array:
    if isinstance(column, tuple):
        if len(column) != 2:
            raise InputError(f"dump field {name!r}: a jagged column is (values, offsets)")
        values, offsets = np.asarray(column[0]), np.asarray(column[1])
        if offsets.ndim != 1 or offsets.size == 0 or offsets.dtype.kind not in "iu":
            raise InputError(f"dump field {name!r}: offsets must be a 1-D integer array of n + 1")
        if offsets[0] != 0 or offsets[-1] != values.size or (np.diff(offsets) < 0).any():
            raise InputError(
                f"dump field {name!r}: offsets must start at 0, not decrease and end at "
                f"len(values) = {values.size}"
            )
        array_type = pa.ListArray if values.size < 2**31 else pa.LargeListArray
        width = np.int32 if array_type is pa.ListArray else np.int64
        return array_type.from_arrays(pa.array(offsets.astype(width)), pa.array(values.ravel()))
    array = np.asarray(column)
    if array.dtype.kind == "O":
        raise InputError(f"dump field {name!r}: object arrays are not dumped; pass numbers or str")
    if array.ndim == 1:
        return pa.array(array)
    if array.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(array.ravel()), array.shape[1])
    raise InputError(
        f"dump field {name!r}: expected 1-D, 2-D or (values, offsets), got {array.shape}"
    )


def _atomic_target(path: Path) -> Path:
    """Where a pass file is written before it replaces ``path``: the temporary name of
    :mod:`sparseps.core.atomic_file` (the pass file's writer stays open across batches)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return temporary_name(path)


class FieldDumper:
    """Writes chosen per-sample fields of one worker, one Parquet file per pass.

    Usage::

        with FieldDumper("dump", ["sample_id", "label", "pred", "C1"], worker_rank=r) as d:
            d.begin_pass(3)
            for batch in ...:
                d.add(sample_id=ids, label=y, pred=p, C1=(values, offsets))
            d.end_pass()        # -> dump/pass-00003/fields-worker-0000r.parquet

    Rows are buffered and written in row groups of ``rows_per_group``.

    Args:
        directory: the dump folder.
        fields: the column names every :meth:`add` must give (no more, no fewer).
        worker_rank: this worker's rank (names the file).
        rows_per_group: rows buffered before a Parquet row group is written.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        fields: Sequence[str],
        *,
        worker_rank: int,
        rows_per_group: int = ROWS_PER_GROUP,
    ) -> None:
        if isinstance(fields, str) or not fields:
            raise ConfigError(
                f"FieldDumper: fields must be a non-empty list of names, got {fields!r}"
            )
        self.fields = tuple(_check_name(f, "FieldDumper field") for f in fields)
        if len(set(self.fields)) != len(self.fields):
            raise ConfigError(f"FieldDumper: duplicate field names in {self.fields}")
        self.directory = Path(directory)
        self.worker_rank = _check_int(worker_rank, "FieldDumper worker_rank")
        if _check_int(rows_per_group, "FieldDumper rows_per_group") == 0:
            raise ConfigError("FieldDumper rows_per_group must be >= 1")
        self.rows_per_group = rows_per_group
        self._pass: int | None = None
        self._schema: pa.Schema | None = None
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None  # the open pass file, renamed by end_pass()
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._rows = 0

    def path(self, pass_id: int) -> Path:
        """Where this worker's fields of ``pass_id`` go."""
        return pass_dir(self.directory, pass_id) / f"fields-worker-{self.worker_rank:05d}.parquet"

    def begin_pass(self, pass_id: int) -> None:
        if self._pass is not None:
            raise InputError(f"FieldDumper: pass {self._pass} is still open; call end_pass() first")
        self._pass = _check_int(pass_id, "pass_id")
        self._rows = 0

    def add(self, **columns: object) -> None:
        """Buffer one batch: one array (or ``(values, offsets)`` pair) per field, n rows each."""
        if self._pass is None:
            raise InputError("FieldDumper.add: call begin_pass(pass_id) first")
        if set(columns) != set(self.fields):
            raise InputError(
                f"FieldDumper.add: expected fields {sorted(self.fields)}, got {sorted(columns)}"
            )
        arrays = [_to_arrow(name, columns[name]) for name in self.fields]
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            sizes = {name: len(a) for name, a in zip(self.fields, arrays, strict=True)}
            raise InputError(f"FieldDumper.add: fields have different row counts {sizes}")
        batch = pa.RecordBatch.from_arrays(arrays, names=list(self.fields))
        if self._schema is None:
            self._schema = batch.schema
        elif batch.schema != self._schema:
            raise InputError(
                f"FieldDumper.add: column types changed from {self._schema} to {batch.schema}; "
                "give each field the same dtype in every batch"
            )
        self._buffer.append(batch)
        self._buffered += batch.num_rows
        self._rows += batch.num_rows
        if self._buffered >= self.rows_per_group:
            self._flush(self._pass)

    def _flush(self, pass_id: int) -> None:
        if not self._buffer:
            return
        if self._writer is None:
            self._tmp = _atomic_target(self.path(pass_id))
            self._writer = pq.ParquetWriter(self._tmp, self._schema)
        self._writer.write_table(pa.Table.from_batches(self._buffer), row_group_size=self._buffered)
        self._buffer, self._buffered = [], 0

    def end_pass(self) -> Path:
        """Write what is buffered and publish the pass file; returns its path.

        A pass without rows still gets a (zero-row) file, so readers see every worker.
        """
        if self._pass is None:
            raise InputError("FieldDumper.end_pass: no pass is open")
        target = self.path(self._pass)
        self._flush(self._pass)
        if self._writer is None:  # no rows this pass
            schema = self._schema or pa.schema([(f, pa.null()) for f in self.fields])
            self._tmp = _atomic_target(target)
            pq.write_table(schema.empty_table(), self._tmp)
        else:
            self._writer.close()
            self._writer = None
        tmp = self._tmp
        assert tmp is not None, "the pass file is opened with the writer or just above"
        os.replace(tmp, target)
        log.info("dumped %d rows of fields %s to %s", self._rows, list(self.fields), target)
        self._pass = None
        return target

    def close(self) -> None:
        """Finish an open pass (its file is published) and release the writer."""
        if self._pass is not None:
            self.end_pass()

    def __enter__(self) -> FieldDumper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dump_params(
    directory: str | os.PathLike,
    pass_id: int,
    named_arrays: Mapping[str, np.ndarray],
    *,
    worker_rank: int | None = None,
) -> Path:
    """Write chosen parameters of a pass to ``pass-{n:05d}/params.npz``; returns the path.

    Args:
        directory: the dump folder.
        pass_id: the pass number.
        named_arrays: name -> numeric array (e.g. ``{"mlp.0.weight": w, "emb.keys": k}``).
        worker_rank: give it when several workers dump different arrays (e.g. their own
            embedding rows): the file is then ``params-worker-{rank:05d}.npz``.
    """
    if not isinstance(named_arrays, Mapping) or not named_arrays:
        raise InputError("dump_params: named_arrays must be a non-empty dict of name -> array")
    arrays = {}
    for name, value in named_arrays.items():
        array = np.asarray(value)
        if array.dtype.kind not in "biufc":
            raise InputError(
                f"dump_params: {name!r} has dtype {array.dtype}; only numbers are dumped"
            )
        arrays[_check_name(name, "dump_params name")] = array
    file = (
        "params.npz"
        if worker_rank is None
        else (f"params-worker-{_check_int(worker_rank, 'worker_rank'):05d}.npz")
    )
    target = pass_dir(directory, pass_id) / file
    target.parent.mkdir(parents=True, exist_ok=True)
    # a file object keeps np.savez from appending ".npz"
    with replaced_atomically(target) as tmp, open(tmp, "wb") as f:
        # mypy matches the unpacked dict against savez's `allow_pickle: bool` keyword
        np.savez(f, **arrays)  # type: ignore[arg-type]
    log.info("dumped parameters %s to %s", sorted(arrays), target)
    return target


def _from_arrow(column: pa.ChunkedArray) -> object:
    array = column.combine_chunks()
    kind = array.type
    if pa.types.is_null(kind):
        return np.zeros(0, np.float64)
    if pa.types.is_fixed_size_list(kind):
        return array.flatten().to_numpy(zero_copy_only=False).reshape(len(array), kind.list_size)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = array.offsets.to_numpy().astype(np.int64)
        return array.flatten().to_numpy(zero_copy_only=False), offsets - offsets[0]
    return array.to_numpy(zero_copy_only=False)


def read_dump(path: str | os.PathLike) -> dict[str, object]:
    """Read a dump back: name -> array (2-D for fixed lists, ``(values, offsets)`` for jagged).

    Args:
        path: a ``fields-worker-*.parquet`` file, a ``params*.npz`` file, or a pass folder
            (all its ``fields-worker-*.parquet`` files, concatenated in rank order).

    Raises:
        InputError: the path does not exist or is not a dump.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("fields-worker-*.parquet"))
        if not files:
            raise InputError(f"read_dump: no fields-worker-*.parquet files in {path}")
        table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    elif path.suffix == ".parquet" and path.is_file():
        table = pq.read_table(path)
    elif path.suffix == ".npz" and path.is_file():
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    else:
        raise InputError(f"read_dump: {path} is not a pass folder, a .parquet or a .npz dump")
    return {name: _from_arrow(table.column(name)) for name in table.column_names}
