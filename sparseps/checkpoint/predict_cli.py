"""``sparseps predict DIR --data FILE``: one prediction per line, without servers.

The data file is read with the schema and format of the Criteo family: ``.csv`` files
are Criteo CSV with a header (as in the shared samples), ``.parquet`` Parquet, anything
else Criteo TSV; ``--format`` overrides the guess. On a terminal, progress bars (stderr)
count the saves loaded and the rows predicted (``--progress``/``--no-progress`` force
them on or off).

It predicts with the newest chain that verifies (:class:`~.predictor.Predictor`): a
corrupt save is skipped with a warning that names it and why, and the command fails only
when no chain loads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..observe import progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="inference model folder (trainer.save_inference_model)")
    parser.add_argument("--data", required=True, help="data file or folder to predict")
    parser.add_argument(
        "--format",
        default=None,
        help="criteo_tsv, csv, slot_text or parquet (default: by extension)",
    )
    parser.add_argument("--batch-size", type=int, default=4096)
    progress.add_argument(parser)


def _guess_format(path: str) -> str:
    if path.endswith(".csv"):
        return "csv"
    if path.endswith(".parquet"):
        return "parquet"
    return "criteo_tsv"


def run(args: argparse.Namespace) -> int:
    from ..data import CRITEO, QueueDataset
    from . import inference
    from .predictor import Predictor

    newest = inference.chain(Path(args.directory))  # a big model loads save by save
    with progress.bar(args.progress, total=len(newest), unit="save", desc="load") as loading:
        # the newest chain that verifies: on a skipped save, fewer or more steps than total
        predictor = Predictor(args.directory, on_loaded=lambda _: loading.update(1))
    fmt = args.format or _guess_format(args.data)
    dataset = QueueDataset(
        [args.data], CRITEO, batch_size=args.batch_size, format=fmt, rank=0, world=1
    )
    out = sys.stdout
    with progress.bar(args.progress, unit="row", desc="predict") as predicting:
        for batch in dataset:
            out.write("\n".join(f"{p:.7f}" for p in predictor.predict_batch(batch)) + "\n")
            predicting.update(len(batch))
    return 0
