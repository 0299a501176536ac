"""``sparseps inspect DIR``: what a model directory holds, and whether it verifies.

Exit code 0 only if every save in ``DIR`` has a manifest and every listed file has its
recorded size and checksum; otherwise one line per problem names the folder or file.

Checking a big model reads every byte of it: on a terminal a progress bar (stderr) counts
the bytes verified (``--progress``/``--no-progress`` force it on or off).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..observe import progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "directory", help="a checkpoint, an inference save, or an inference model folder"
    )
    progress.add_argument(parser)


def _describe(folder: Path, manifest: dict) -> list[str]:
    lines = [
        f"{folder}: {manifest['format']} ({manifest.get('kind', 'checkpoint')}), created {manifest['created']}"
    ]
    for name, table in sorted(manifest.get("tables", {}).items()):
        config = table["config"]
        # inference saves count tombstones; checkpoints point at the file of pending ones
        tombstones = table.get("tombstones") or 0
        count = tombstones["keys"] if isinstance(tombstones, dict) else tombstones
        extra = f", {count} tombstones" if count else ""
        lines.append(
            f"  table {name}: {table['rows']} rows, dim {config['dim']}, rule {config['rule'].get('name')}{extra}"
        )
    if "dense" in manifest:
        lines.append(
            f"  dense: {manifest['dense']['size']} parameters, rule {manifest['dense']['rule'].get('name')}"
        )
    if "embeddings" in manifest:
        lines.append(
            f"  head inputs: dense + {', '.join(e['table'] for e in manifest['embeddings'])}"
        )
    size = sum(f["size"] for f in manifest["files"].values())
    lines.append(
        f"  files: {len(manifest['files'])}, {size / 1e6:.2f} MB; state: {manifest.get('state', {})}"
    )
    return lines


def run(args: argparse.Namespace) -> int:
    from ..errors import CheckpointError
    from ..files import manifest as mf
    from . import inference, staging

    root = Path(args.directory)
    if not root.is_dir():
        # names the hidden folders an interrupted save left beside it, if any
        print(f"sparseps inspect: {staging.missing_report(root)}")
        return 1
    folders = [root] if (root / mf.MANIFEST).exists() else [p for _, _, p in inference.saves(root)]
    if not folders:
        print(
            f"sparseps inspect: {root}: not a model directory (no {mf.MANIFEST}, no base-/delta- saves)"
        )
        return 1
    manifests: dict[Path, dict | CheckpointError] = {}
    for folder in folders:
        try:
            manifests[folder] = mf.read_manifest(folder)
        except CheckpointError as exc:
            manifests[folder] = exc
    total = sum(
        int(record.get("size", 0))
        for manifest in manifests.values()
        if isinstance(manifest, dict)
        for record in manifest["files"].values()
    )
    problems = 0
    with progress.bar(
        args.progress, total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="inspect"
    ) as bar:
        for folder in folders:
            try:
                manifest = _verified(folder, manifests[folder], bar)
            except CheckpointError as exc:
                problems += 1
                progress.write(f"INVALID {exc}")
                continue
            progress.write("\n".join(_describe(folder, manifest)))
            progress.write(f"  verified: {len(manifest['files'])} files match {mf.MANIFEST}")
    if len(folders) > 1 or folders[0] != root:
        try:
            usable = inference.chain(root)
            progress.write(f"{root}: serving chain = {', '.join(p.name for p in usable)}")
        except CheckpointError as exc:
            problems += 1
            progress.write(f"INVALID {exc}")
    return 1 if problems else 0


def _verified(folder: Path, manifest, bar) -> dict:
    """``manifest`` after checking every file's size and checksum, one file at a time
    (the bar advances by each file's bytes).

    Raises:
        CheckpointError: the manifest could not be read, or a file does not match.
    """
    from ..errors import CheckpointError
    from ..files import manifest as mf

    if isinstance(manifest, CheckpointError):
        raise manifest
    for name, record in manifest["files"].items():
        # the names were checked when the manifest was read; this checks one file
        mf.verify(folder, {"files": {name: record}}, names=[name])
        bar.update(int(record.get("size", 0)))
    return manifest
