"""``sparseps predict DIR --data FILE``: one prediction per line, without servers.

The data file is read with the schema and format of the Criteo family: ``.csv`` files
are Criteo CSV with a header (as in the shared samples), ``.parquet`` Parquet, anything
else Criteo TSV; ``--format`` overrides the guess.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="inference model folder (trainer.save_inference_model)")
    parser.add_argument("--data", required=True, help="data file or folder to predict")
    parser.add_argument(
        "--format",
        default=None,
        help="criteo_tsv, csv, slot_text or parquet (default: by extension)",
    )
    parser.add_argument("--batch-size", type=int, default=4096)


def _guess_format(path: str) -> str:
    if path.endswith(".csv"):
        return "csv"
    if path.endswith(".parquet"):
        return "parquet"
    return "criteo_tsv"


def run(args: argparse.Namespace) -> int:
    from ..data import CRITEO, QueueDataset
    from .predictor import Predictor

    predictor = Predictor(args.directory)
    fmt = args.format or _guess_format(args.data)
    dataset = QueueDataset(
        [args.data], CRITEO, batch_size=args.batch_size, format=fmt, rank=0, world=1
    )
    out = sys.stdout
    for batch in dataset:
        out.write("\n".join(f"{p:.7f}" for p in predictor.predict_batch(batch)) + "\n")
    return 0
