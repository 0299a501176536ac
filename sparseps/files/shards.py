"""Arrow IPC shard files: one server's part of one sparse table, readable by other tools.

A save writes two files per server into the target directory::

    {table}.shard-{rank:05d}-of-{S:05d}.arrow    rows: the columns of export_rows()
    {table}.pending-{rank:05d}-of-{S:05d}.arrow  admission counters of keys not yet rows

Row columns: ``key: uint64``, ``embedding: fixed_size_list<float32>[dim]``,
``state: fixed_size_list<float32>[state_dim]``, ``show``, ``click``, ``delta_score``:
float32, ``unseen_days``: int32 (pending files: ``key``, ``show``, ``click``). A 2-D column
of width 0 (e.g. the state of plain SGD) is not stored, since Arrow has no zero-width
lists; the schema metadata key ``sparseps`` (JSON) records every column's width, the
table config, the writer's rank and server count, and the file kind, so a reader can
rebuild the exact arrays and check that the file belongs to the table it is loaded into.

The same writer makes the inference files (``{table}.base-…``/``{table}.delta-…``: ``key``
and ``embedding``) and the tombstone files (``{table}.tombstones.arrow``: ``key``) that
worker 0 writes; the metadata ``kind`` tells them apart, and a table load accepts only
``rows`` and ``pending``.

Each file is written under a temporary name and renamed into place, so a crash never
leaves a half-written file under the final name. The save returns, per file, its name,
size in bytes, two checksums of the whole file and row count; a load given those records
verifies the file.

Checksums (:data:`CHECKSUMS`): ``sha256`` (every save ever made has it; other tools check
it with ``sha256sum``) and ``xxh3_128`` (since issue 30; XXH3 128-bit, lowercase hex as
``xxhash.xxh3_128().hexdigest()`` and ``xxhsum -H2`` give). Both are computed in one read of
the new file, beside its fsync. A load verifies the fastest one the record has
(:func:`pick_checksum`): ``xxh3_128`` hashes at memory speed where SHA-256 runs 1-1.8 GB/s
on one core and capped a load at ~0.4x of reading the bytes; a record without it (a file
saved before) is verified by SHA-256. Both catch a changed byte; neither is a defence
against someone who can also rewrite the records.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import xxhash

from ..core.atomic_file import replaced_atomically
from ..errors import CheckpointError

__all__ = [
    "CHECKSUMS",
    "FORMAT_VERSION",
    "checksums_of",
    "file_name",
    "pick_checksum",
    "read_shard",
    "sha256_of",
    "verified_shard",
    "write_shard",
]

FORMAT_VERSION = 1
_META_KEY = b"sparseps"


class _Hasher(Protocol):
    def update(self, data: memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


def file_name(table: str, kind: str, rank: int, num_servers: int) -> str:
    """The shard file name; ``kind`` is ``"rows"`` or ``"pending"``."""
    stem = "shard" if kind == "rows" else "pending"
    return f"{table}.{stem}-{rank:05d}-of-{num_servers:05d}.arrow"


# name -> hasher factory; the order is a load's preference (fastest first)
CHECKSUMS: dict[str, Callable[[], _Hasher]] = {
    "xxh3_128": xxhash.xxh3_128,
    "sha256": hashlib.sha256,
}
_BLOCK = 1 << 20  # read size: stays in L2 between the read and the hashers


def checksums_of(
    path: str | os.PathLike, kinds: tuple[str, ...] = tuple(CHECKSUMS)
) -> dict[str, str]:
    """Hex digests of the whole file, every kind in ``kinds`` from one read of it.

    Both hashers release the GIL on each block, so this runs beside other threads.
    """
    hashers = [CHECKSUMS[kind]() for kind in kinds]
    block = bytearray(_BLOCK)
    view = memoryview(block)
    with open(path, "rb", buffering=0) as handle:
        while size := handle.readinto(block):
            data = view[:size]
            for hasher in hashers:
                hasher.update(data)
    return {kind: hasher.hexdigest() for kind, hasher in zip(kinds, hashers, strict=True)}


def sha256_of(path: str | os.PathLike) -> str:
    return checksums_of(path, ("sha256",))["sha256"]


def pick_checksum(record: dict) -> tuple[str, str] | None:
    """``(kind, hex digest)`` of the fastest checksum ``record`` holds, None if none.

    Raises:
        CheckpointError: a recorded checksum is not a string.
    """
    for kind in CHECKSUMS:
        if kind in record and record[kind] is not None:
            digest = record[kind]
            if not isinstance(digest, str):
                raise CheckpointError(f"checksum {kind!r} must be a hex string, got {digest!r:.80}")
            return kind, digest
    return None


def _to_arrow(columns: dict[str, np.ndarray]) -> tuple[pa.Table, dict]:
    """Arrow table + ``{name: [dtype, width]}`` (width None for 1-D columns)."""
    arrays, layout = {}, {}
    for name, values in columns.items():
        if values.ndim == 2:
            layout[name] = [values.dtype.name, int(values.shape[1])]
            if values.shape[1] == 0:
                continue
            flat = pa.array(np.ascontiguousarray(values).reshape(-1))
            arrays[name] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        elif values.ndim == 1:
            layout[name] = [values.dtype.name, None]
            arrays[name] = pa.array(values)
        else:
            raise CheckpointError(
                f"column {name!r}: only 1-D and 2-D arrays can be saved, got {values.shape}"
            )
    return pa.table(arrays), layout


def write_shard(
    directory: str | os.PathLike,
    name: str,
    columns: dict[str, np.ndarray],
    meta: dict,
) -> dict:
    """Write ``columns`` to ``directory/name`` atomically.

    Args:
        directory: target folder (created if missing).
        name: file name (see :func:`file_name`).
        columns: 1-D or 2-D numpy arrays of equal length.
        meta: JSON-serialisable facts stored in the schema metadata (kind, table, config...).

    Returns:
        ``{"name", "path", "bytes", "sha256", "xxh3_128", "rows", "kind"}``.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    table, layout = _to_arrow(columns)
    rows = len(next(iter(columns.values()))) if columns else 0
    info = {**meta, "format": FORMAT_VERSION, "columns": layout, "rows": rows}
    table = table.replace_schema_metadata({_META_KEY: json.dumps(info).encode()})
    final = folder / name
    try:
        digests = _write_arrow(table, rows, final)
    except OSError as exc:  # pyarrow's message names neither the file nor the way out
        full = exc.errno == errno.ENOSPC or "No space left" in str(exc)
        raise CheckpointError(
            f"cannot write {final}: {exc}"
            + (" - the disk is full: free space there, or save to another folder" if full else "")
        ) from exc
    return {
        "name": name,
        "path": str(final),
        "bytes": final.stat().st_size,
        **digests,
        "rows": rows,
        "kind": meta.get("kind"),
    }


def _write_arrow(table: pa.Table, rows: int, final: Path) -> dict:
    """Write ``table`` to ``final`` atomically, synced; returns its checksums."""
    with replaced_atomically(final) as temporary:
        # Arrow IPC (Feather v2), uncompressed: about memcpy speed, where Parquet's
        # encoding of fixed-size-list columns wrote ~30x slower (bench/save.py); pyarrow,
        # polars, pandas and DuckDB read it directly.
        # One record batch (feather's default cuts every 64k rows): a load then maps each
        # column as one buffer instead of copying the pieces together.
        feather.write_feather(table, temporary, compression="uncompressed",
                              chunksize=max(1, rows))  # fmt: skip
        # the checksums read the new file from the page cache while its fsync waits on the
        # disk
        with ThreadPoolExecutor(1, thread_name_prefix="sparseps-fsync") as pool:
            synced = pool.submit(_fsync, temporary)
            digests = checksums_of(temporary)
            synced.result()
    return digests


def _fsync(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _column(table: pa.Table, name: str, dtype: str, width: int | None, copy: bool) -> np.ndarray:
    rows = table.num_rows
    if width == 0:
        return np.zeros((rows, 0), dtype=dtype)
    if name not in table.column_names:
        raise CheckpointError(f"column {name!r} is missing")
    chunked = table.column(name)
    # one record batch (what write_shard makes): its buffer as is, since combine_chunks
    # copies even a single chunk (a second pass over every byte of the file)
    column = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
    if width is None:
        values = column.to_numpy(zero_copy_only=False)
    else:
        values = column.flatten().to_numpy(zero_copy_only=False).reshape(rows, width)
    if not copy and values.dtype == np.dtype(dtype) and values.flags.c_contiguous:
        return values  # a read-only view of the file's map
    # A fresh, writable, contiguous array of the recorded dtype (Arrow buffers are read-only).
    return np.array(values, dtype=dtype, order="C", copy=True)


def read_shard(
    path: str | os.PathLike,
    *,
    sha256: str | None = None,
    xxh3_128: str | None = None,
    copy: bool = True,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Read one shard file back into numpy columns (bit-exact with what was written).

    Args:
        path: the file.
        sha256, xxh3_128: the file's recorded checksums, if known; the file must match
            ``xxh3_128`` when given, else ``sha256`` when given.
        copy: fresh writable arrays (default); False: read-only views of the memory-mapped
            file where the stored dtype is the recorded one (a load that only reads them).

    Returns:
        ``(meta, columns)``: the metadata written by :func:`write_shard` and the arrays.

    Raises:
        CheckpointError: the file is missing, unreadable, not a sparseps shard, or its
            checksum does not match.
    """
    with verified_shard(path, sha256=sha256, xxh3_128=xxh3_128, copy=copy) as (meta, columns):
        return meta, columns


@contextlib.contextmanager
def verified_shard(
    path: str | os.PathLike,
    *,
    sha256: str | None = None,
    xxh3_128: str | None = None,
    copy: bool = False,
) -> Iterator[tuple[dict, dict[str, np.ndarray]]]:
    """:func:`read_shard` whose checksum is computed *while the block uses the columns*.

    A load imports the columns into a table built aside, so the file needs to be proven
    intact only before that table is adopted, not before the import starts: hashing
    (both hashers release the GIL) then runs beside the compiled import instead of ahead
    of it (SHA-256 alone was 40% of a load). One checksum is computed: ``xxh3_128`` when
    given (several times faster), else ``sha256`` (files saved before ``xxh3_128`` was
    recorded). Leaving the block waits for it; a mismatch raises CheckpointError, also in
    place of an error the block raised (a corrupt file is reported as such first,
    whatever else it breaks).

    Yields:
        ``(meta, columns)`` as :func:`read_shard` (read-only views by default).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"shard file {path} does not exist")
    expected = pick_checksum({"sha256": sha256, "xxh3_128": xxh3_128})
    if expected is None:
        yield _read_columns(path, copy)
        return
    kind, digest = expected
    with ThreadPoolExecutor(1, thread_name_prefix=f"sparseps-{kind}") as pool:
        computed = pool.submit(checksums_of, path, (kind,))
        try:
            yield _read_columns(path, copy)
        finally:
            if computed.result()[kind] != digest.lower():
                raise CheckpointError(
                    f"shard file {path}: {kind} does not match the saved record (the file "
                    "changed or is corrupt); restore it from a good copy or use an earlier save"
                )


def _read_columns(path: Path, copy: bool) -> tuple[dict, dict[str, np.ndarray]]:
    try:
        table = feather.read_table(path, memory_map=True)
    except Exception as exc:
        raise CheckpointError(
            f"shard file {path} is not a readable Arrow IPC file: {exc}"
        ) from None
    raw = (table.schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise CheckpointError(
            f"shard file {path} has no sparseps metadata (not written by a sparseps server)"
        )
    meta = json.loads(raw)
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"shard file {path}: format {meta.get('format')!r} is not supported ({FORMAT_VERSION})"
        )
    try:
        columns = {
            name: _column(table, name, dtype, width, copy)
            for name, (dtype, width) in meta["columns"].items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"shard file {path}: columns do not match its metadata ({exc})"
        ) from None
    return meta, columns
