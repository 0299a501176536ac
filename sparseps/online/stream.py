"""Synthetic time-partitioned streams: days of splits from a drifting planted model.

Writes ``root/YYYYMMDD/HHMM/part-00000.tsv`` (Criteo TSV) per split and then the
done-marker, like a producer would. Day ``d`` of the stream uses the planted model of
day ``d`` of :mod:`sparseps.data.synthetic` (weights rotate ``drift`` radians per day),
so a model frozen on the first day gets worse while one trained online keeps up.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import numpy as np

from ..data.synthetic import generate, planted_model, to_table
from ..errors import ConfigError

__all__ = ["write_stream"]


def write_stream(
    root: str | os.PathLike, *, start_day: str, days: int, splits_per_day: int,
    rows_per_split: int, seed: int = 0, drift: float = 0.5, split_minutes: int = 5,
    pattern: str = "{day}/{hhmm}", done_marker: str = "_SUCCESS", files_per_split: int = 1,
    skip: tuple[tuple[str, int], ...] = (),
) -> dict:  # fmt: skip
    """Write ``days`` days of ``splits_per_day`` splits each.

    Args:
        root: the stream's root folder.
        start_day: ``YYYYMMDD`` of the first day.
        rows_per_split: samples per split (split over ``files_per_split`` files).
        seed, drift: the planted model and its rotation per day (radians).
        skip: ``(day, split)`` pairs written without a done-marker (an incomplete split).

    Returns:
        ``{"splits": n, "rows": n, "bayes_auc": {day: exact AUC of the planted model}}``.
    """
    import pyarrow.csv as pacsv

    from ..metrics.functions import exact_auc

    if rows_per_split < 1 or days < 1 or splits_per_day < 1 or files_per_split < 1:
        raise ConfigError(
            "write_stream: days, splits_per_day, rows_per_split, files_per_split >= 1"
        )
    if splits_per_day * split_minutes > 24 * 60:
        raise ConfigError(
            f"write_stream: {splits_per_day} splits of {split_minutes} min exceed a day"
        )
    model = planted_model(seed, drift=drift)
    start = dt.datetime.strptime(start_day, "%Y%m%d").date()
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    splits = rows = 0
    bayes_auc: dict[str, float] = {}
    for d in range(days):
        day = (start + dt.timedelta(days=d)).strftime("%Y%m%d")
        labels, probs = [], []
        for split in range(splits_per_day):
            hour, minute = divmod(split * split_minutes, 60)
            folder = Path(root) / pattern.format(
                day=day, hhmm=f"{hour:02d}{minute:02d}", year=day[:4], month=day[4:6],
                dd=day[6:], hour=f"{hour:02d}", minute=f"{minute:02d}",
            )  # fmt: skip
            folder.mkdir(parents=True, exist_ok=True)
            sizes = np.diff(np.linspace(0, rows_per_split, files_per_split + 1).astype(int))
            for part, size in enumerate(sizes):
                data = generate(
                    int(size), seed, part=(d * splits_per_day + split) * files_per_split + part,
                    day=d, model=model,
                )  # fmt: skip
                path = folder / f"part-{part:05d}.tsv"
                pacsv.write_csv(to_table(data), str(path), write_options=options)
                labels.append(data.label)
                probs.append(data.prob)
            if (day, split) not in skip:
                (folder / done_marker).touch()  # last: the split is complete
            splits += 1
            rows += rows_per_split
        bayes_auc[day] = exact_auc(np.concatenate(probs), np.concatenate(labels))
    return {"splits": splits, "rows": rows, "bayes_auc": bayes_auc}
