"""``MANIFEST.json``: what a model directory holds, written last and atomically.

A model directory (checkpoint or inference model) is valid only if its manifest exists
and every file it lists has the recorded size and checksum. The manifest is written to a
temporary file, fsynced and renamed into place, so a folder has either no manifest (it
reports as incomplete) or a complete one — never a manifest that points at half-written
files. Saves go one step further: they write into a hidden staging folder and move it to
its final path only once its manifest is written (:mod:`sparseps.checkpoint.staging`).

Layout (version 1) of a checkpoint (``trainer.save_checkpoint``)::

    {
      "format": "sparseps-checkpoint", "version": 1, "created": "2026-11-22T08:00:00Z",
      "files": {"deep_emb.shard-00000-of-00002.arrow":
                    {"size": 123, "sha256": "...", "xxh3_128": "..."}, ...},
      "tables": {"deep_emb": {
          "config": {...},                       # TableConfig.to_dict() when saved
          "layout": {"rule": "adagrad", "dim": 8, "state_dim": 8,
                     "state_columns": [["accumulator", 8]],
                     "stat_columns": ["show", "click", "delta_score", "unseen"]},
          "rows": 1000, "pending": 12, "servers": 2,
          "files": ["deep_emb.pending-00000-of-00002.arrow", ...],   # rows + pending shards
          "tombstones": {"file": "deep_emb.tombstones.arrow", "keys": 40}}},  # if any
      "dense": {"size": 1919, "rule": {...}, "file": "dense.npz"},
      "state": {"passes": 3, "mode": "sync", ...}   # plus what the caller passed
    }

Each file's record has its size, ``sha256`` and (saves since issue 30) ``xxh3_128``, the
checksums :func:`sparseps.files.shards.checksums_of` computes in one read. Verifying
(:func:`verify`, a server's load) checks ``xxh3_128`` when the record has it, else
``sha256``: a manifest written before has only ``sha256`` and still verifies.

``layout`` is what a load compares (:func:`sparseps.checkpoint.checkpoint.layout_of`);
``tombstones`` lists keys shrink deleted since the last inference save. An inference
save (``trainer.save_inference_model``) has ``"format": "sparseps-inference"``,
``kind`` (``base``/``delta``), ``sequence``, ``tables`` (``config``, ``rows``,
``tombstones`` as a count, ``files``), ``embeddings`` (head inputs, in order) and
``state`` (``passes``).

Every file name a manifest holds (the keys of ``files``, a table's ``files``, its
``tombstones.file``, ``dense.file``) is a path relative to the folder and must stay in
it: :func:`read_manifest` (and so :func:`verify`) rejects an absolute name, a ``..``
part, a NUL or other control character, and a name whose file is a symlink that resolves
outside the folder — a manifest is input, and a load sends these paths to the servers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ..core.atomic_file import replaced_atomically
from ..errors import CheckpointError
from .shards import CHECKSUMS, checksums_of, pick_checksum, sha256_of

__all__ = [
    "MANIFEST",
    "check_names",
    "entry_of",
    "file_record",
    "read_manifest",
    "sha256_of",
    "verify",
    "write_json_atomic",
    "write_manifest",
]

MANIFEST = "MANIFEST.json"
VERSION = 1
FORMATS = ("sparseps-checkpoint", "sparseps-inference")


def file_record(path: Path) -> dict:
    """The manifest record of a file: ``{"size", "sha256", "xxh3_128"}`` (one read)."""
    return {"size": path.stat().st_size, **checksums_of(path)}


def entry_of(record: dict) -> dict:
    """The manifest record of a file from the record its writer returned
    (:func:`sparseps.files.shards.write_shard`, a server's ``save``)."""
    return {"size": record["bytes"], **{k: record[k] for k in CHECKSUMS if k in record}}


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write JSON so readers see the old file or the whole new one, never a torn one."""
    with replaced_atomically(path, sync=True) as tmp:
        tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))


def write_manifest(directory: Path, fmt: str, files: dict[str, dict], **sections: object) -> dict:
    """Write the manifest last. ``files`` maps a name relative to ``directory`` to its record."""
    if fmt not in FORMATS:
        raise CheckpointError(f"unknown model directory format {fmt!r} (expected one of {FORMATS})")
    manifest = {
        "format": fmt,
        "version": VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": dict(sorted(files.items())),
        **sections,
    }
    write_json_atomic(Path(directory) / MANIFEST, manifest)
    return manifest


def read_manifest(directory: Path, *, fmt: str | None = None) -> dict:
    """Load the manifest (no checksum pass; see :func:`verify`).

    Raises:
        CheckpointError: no manifest (an incomplete save), unreadable, or the wrong format.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such model directory")
    if not path.is_file():
        raise CheckpointError(
            f"{directory}: no {MANIFEST} — the save did not complete, so this is not a valid "
            "model directory; use an earlier one"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest ({exc})") from None
    if manifest.get("version") != VERSION or manifest.get("format") not in FORMATS:
        raise CheckpointError(
            f"{path}: format {manifest.get('format')!r} version {manifest.get('version')!r} "
            f"is not one this sparseps reads (version {VERSION})"
        )
    if fmt is not None and manifest["format"] != fmt:
        raise CheckpointError(f"{directory}: is a {manifest['format']} directory, expected {fmt}")
    check_names(directory, manifest)
    return manifest


def check_names(directory: Path, manifest: dict) -> None:
    """Every file name in ``manifest`` stays inside ``directory`` (see the module doc).

    Raises:
        CheckpointError: naming the manifest, the entry and what is wrong with it.
    """
    path = Path(directory) / MANIFEST
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(r, dict) for r in files.values()):
        raise CheckpointError(
            f"{path}: 'files' must map file names to {{size, sha256[, xxh3_128]}} records"
        )
    root = Path(directory).resolve()
    for where, name in _file_names(manifest):
        problem = _name_problem(name)
        if problem is None and isinstance(name, str):  # always a str when there is no problem
            target = (root / name).resolve()  # follows symlinks, also of missing files' parents
            if not target.is_relative_to(root):
                problem = f"resolves to {target}, outside the folder (a symlink?)"
        if problem is not None:
            raise CheckpointError(
                f"{path}: {where} entry {name!r} {problem}; a manifest may only name files "
                f"inside {directory}"
            )


def _file_names(manifest: dict) -> Iterable[tuple[str, object]]:
    """``(where, name)`` of every file name the manifest holds."""
    for name in manifest["files"]:
        yield "files", name
    tables = manifest.get("tables")
    for table, entry in tables.items() if isinstance(tables, dict) else ():
        if not isinstance(entry, dict):
            continue
        for name in entry.get("files") or ():
            yield f"tables.{table}.files", name
        tombstones = entry.get("tombstones")
        if isinstance(tombstones, dict) and "file" in tombstones:
            yield f"tables.{table}.tombstones.file", tombstones["file"]
    dense = manifest.get("dense")
    if isinstance(dense, dict) and "file" in dense:
        yield "dense.file", dense["file"]


def _name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain relative file name, or None."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "holds a NUL or control character"
    if name.startswith(("/", "\\")) or os.path.isabs(name):
        return "is an absolute path"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "has a '..' part"
    if any(part in ("", ".") for part in parts):
        return "has an empty or '.' part"
    return None


def verify(
    directory: Path, manifest: dict | None = None, *, names: Iterable[str] | None = None
) -> dict:
    """Check size and checksum of every listed file (or of ``names``): ``xxh3_128`` where
    the record has it, else ``sha256``.

    Raises:
        CheckpointError: naming the first file that is missing, truncated or altered, or
            a file name that points outside ``directory``.
    """
    directory = Path(directory)
    if manifest:
        check_names(directory, manifest)
    else:
        manifest = read_manifest(directory)
    files = manifest["files"]
    for name in names if names is not None else files:
        record = files.get(name)
        if record is None:
            raise CheckpointError(f"{directory}: {name} is not listed in {MANIFEST}")
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {MANIFEST} but missing")
        size = path.stat().st_size
        if size != record["size"]:
            raise CheckpointError(f"{path}: size {size} bytes, manifest says {record['size']}")
        try:
            expected = pick_checksum(record)
        except CheckpointError as exc:
            raise CheckpointError(f"{directory / MANIFEST}: file {name}: {exc}") from None
        if expected is None:
            raise CheckpointError(
                f"{directory / MANIFEST}: file {name} has no checksum (expected one of "
                f"{', '.join(CHECKSUMS)}); the manifest is damaged"
            )
        kind, digest = expected
        if checksums_of(path, (kind,))[kind] != digest.lower():
            raise CheckpointError(
                f"{path}: checksum mismatch ({kind}: the file was altered or corrupted); "
                "restore it from a good copy or use an earlier save"
            )
    return manifest
