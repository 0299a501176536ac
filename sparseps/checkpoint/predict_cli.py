"""``sparseps predict DIR --data FILE``: one prediction per line, without servers.

The data are read as the model was trained: with the schema, format and pipe command its
save records (:mod:`.model_input`; a pipe command runs in the folder it ran in during
training). Each can be overridden: ``--schema`` (a name or a JSON file of Schema fields),
``--format``, ``--pipe-command`` (run in the current folder; ``''``: none). A model trained
on a tabular format (``criteo_tsv``, ``csv``, ``parquet``) without a pipe command reads a
``.csv`` or ``.parquet`` file by its extension. A save that records no input (made before
inference models recorded it) is read as Criteo, as before, with a log line that says so.

Data that do not fit are reported as such: the message starts with what the model
expects ("this model expects format 'multislot' ...; label 'click'; ..."), then what
reading the data that way found. A head with several outputs (a multi-task model) prints
them tab-separated on each line. On a terminal, progress bars (stderr) count the saves
loaded and the rows predicted (``--progress``/``--no-progress`` force them on or off).

It predicts with the newest chain that verifies (:class:`~.predictor.Predictor`): a
corrupt save is skipped with a warning that names it and why, and the command fails only
when no chain loads.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..errors import InputError
from ..observe import progress
from .model_input import ModelInput, named_schema

log = logging.getLogger(__name__)

_TABULAR = ("criteo_tsv", "csv", "parquet")  # one schema in three containers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="inference model folder (trainer.save_inference_model)")
    parser.add_argument("--data", required=True, help="data file or folder to predict")
    parser.add_argument(
        "--format",
        default=None,
        help="criteo_tsv, csv, slot_text, parquet, multislot or multislot_string "
        "(default: the model's)",
    )
    parser.add_argument(
        "--schema",
        default=None,
        help="criteo, criteo_slot, avazu, or a JSON file of Schema fields (default: the model's)",
    )
    parser.add_argument(
        "--pipe-command",
        default=None,
        help="shell command each file goes through, run here ('': none; default: the model's)",
    )
    parser.add_argument("--batch-size", type=int, default=4096)
    progress.add_argument(parser)


def _guess_format(path: str) -> str | None:
    if path.endswith(".csv"):
        return "csv"
    if path.endswith(".parquet"):
        return "parquet"
    return None


def reading(recorded: ModelInput | None, args: argparse.Namespace) -> ModelInput:
    """How to read ``args.data``: the model's input with the command line's overrides."""
    from ..data import CRITEO

    if recorded is None:
        log.info(
            "%s records no input schema (saved before inference models recorded it): "
            "reading %s as Criteo; --schema, --format and --pipe-command read another",
            args.directory,
            args.data,
        )
        recorded = ModelInput(CRITEO)
    schema = recorded.schema if args.schema is None else named_schema(args.schema)
    pipe, pipe_dir = recorded.pipe_command, recorded.pipe_dir
    if args.pipe_command is not None:
        pipe, pipe_dir = args.pipe_command or None, None
    fmt = args.format
    if fmt is None:
        guessed = _guess_format(args.data) if recorded.format in _TABULAR and not pipe else None
        fmt = guessed or recorded.format
    return ModelInput(schema, fmt, pipe, pipe_dir)


def run(args: argparse.Namespace) -> int:
    from ..data import QueueDataset
    from . import inference
    from .predictor import Predictor

    newest = inference.chain(Path(args.directory))  # a big model loads save by save
    with progress.bar(args.progress, total=len(newest), unit="save", desc="load") as loading:
        # the newest chain that verifies: on a skipped save, fewer or more steps than total
        predictor = Predictor(args.directory, on_loaded=lambda _: loading.update(1))
    source = reading(predictor.input, args)
    given = args.schema is not None
    predictor.check_schema(
        source.schema, what=f"the schema given (--schema {args.schema})" if given else "its schema"
    )
    dataset = QueueDataset(
        [args.data], source.schema, batch_size=args.batch_size, format=source.format,
        pipe_command=source.command(), rank=0, world=1,
    )  # fmt: skip
    out = sys.stdout
    try:
        with progress.bar(args.progress, unit="row", desc="predict") as predicting:
            for batch in dataset:
                rows = predictor.predict_batch(batch).reshape(len(batch), -1)
                out.write("".join("\t".join(f"{p:.7f}" for p in row) + "\n" for row in rows))
                predicting.update(len(batch))
    except InputError as exc:
        raise InputError(f"{expectation(predictor.input, source)}; {args.data}: {exc}") from None
    return 0


def expectation(recorded: ModelInput | None, source: ModelInput) -> str:
    """What the model expects, and how the data were read when that differs."""
    if recorded is None:
        return (
            "this model records no input schema (saved before inference models recorded "
            f"it), so the data were read as {source.describe()}; give --schema, --format or "
            "--pipe-command to read them another way"
        )
    text = f"this model expects {recorded.describe()}"
    if source != recorded:
        text += f"; the data were read as {source.describe()}"
    return text
