"""``sparseps gen-data``: synthetic Criteo-format TSV from a planted model.

Writes ``OUT/train/part-00000.tsv ...`` (``--files`` files), ``OUT/test/part-00000.tsv``
and ``OUT/meta.json``, and prints the planted model's AUC on what it wrote: the best AUC
any model can reach on that data (see :mod:`sparseps.data.synthetic`).

On a terminal a progress bar (tqdm, on stderr) counts the files done and the megabytes
written; it is off when stderr is not a TTY (logs, CI) and with ``--no-progress``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from .synthetic import LOGIT_SD, RARE_POWER, TARGET_CTR, ZIPF_MEAN


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, required=True, help="train rows")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--files", type=int, default=1, help="train files (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="planted model and rows (default 0)")
    parser.add_argument(
        "--test-rows", type=int, default=None, help="test rows (default max(rows // 10, 1000))"
    )
    parser.add_argument("--day", type=int, default=0, help="day of a drifting model (default 0)")
    parser.add_argument(
        "--drift", type=float, default=0.0, help="weight rotation per day, radians (default 0)"
    )
    knobs = parser.add_argument_group("data knobs (defaults: the 22%-CTR data of earlier versions)")
    knobs.add_argument(
        "--click-rate", type=float, default=TARGET_CTR,
        help=f"mean planted click probability, 0.001..0.6 (default {TARGET_CTR})",
    )  # fmt: skip
    knobs.add_argument(
        "--signal", type=float, default=LOGIT_SD,
        help=f"std of the planted logit, 0.2..4; higher: higher Bayes AUC (default {LOGIT_SD})",
    )  # fmt: skip
    knobs.add_argument(
        "--zipf", type=float, default=ZIPF_MEAN,
        help=f"mean Zipf exponent of id frequencies, 0.6..3 (default {ZIPF_MEAN})",
    )  # fmt: skip
    knobs.add_argument(
        "--rare-power", type=float, default=RARE_POWER,
        help="weight damping by frequency rank, 0..2; 0: rare ids carry as much signal as "
        f"frequent ones (default {RARE_POWER})",
    )  # fmt: skip
    knobs.add_argument(
        "--label-noise", type=float, default=0.0,
        help="share of labels drawn at the click rate whatever the features, 0..0.9 (default 0)",
    )  # fmt: skip
    knobs.add_argument(
        "--missing", type=float, default=1.0,
        help="factor on every feature's missing rate, 0..2 (default 1)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print meta.json as the last line")
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="a progress bar on stderr (default: only when stderr is a terminal)",
    )  # fmt: skip


def _written(out: Path) -> tuple[int, int]:
    """``(finished part files, bytes written)`` under ``out/train`` and ``out/test``."""
    done = size = 0
    for split in ("train", "test"):
        for path in (out / split).glob("part-*.tsv*"):
            try:
                size += path.stat().st_size
            except OSError:  # renamed between glob and stat
                continue
            done += path.suffix == ".tsv"
    return done, size


def _watch(out: Path, files: int, enabled: bool | None, stop: threading.Event) -> None:
    """Show the files done and the bytes written until ``stop`` is set."""
    from tqdm import tqdm

    before, _ = _written(out)  # parts of an earlier run are replaced, not counted
    with tqdm(
        total=files, unit="file", desc="gen-data", disable=None if enabled is None else not enabled
    ) as bar:
        while not stop.wait(0.2):
            done, size = _written(out)
            bar.n = min(max(done - before, 0), files)
            bar.set_postfix_str(f"{size / 1e6:.0f} MB", refresh=False)
            bar.refresh()
        bar.n = files
        bar.set_postfix_str(f"{_written(out)[1] / 1e6:.0f} MB", refresh=False)


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from .synthetic import DataKnobs, write_dataset

    if args.rows < 0:
        raise ConfigError(f"--rows: expected >= 0, got {args.rows}")
    knobs = DataKnobs(
        click_rate=args.click_rate, signal=args.signal, zipf=args.zipf,
        rare_power=args.rare_power, label_noise=args.label_noise, missing=args.missing,
    )  # fmt: skip
    start = time.perf_counter()
    stop = threading.Event()
    watcher = threading.Thread(
        target=_watch, args=(Path(args.out), args.files + 1, args.progress, stop), daemon=True
    )
    watcher.start()
    try:
        meta = write_dataset(
            args.out, args.rows, args.seed, files=args.files, test_rows=args.test_rows,
            day=args.day, drift=args.drift, knobs=knobs,
        )  # fmt: skip
    finally:
        stop.set()
        watcher.join(timeout=2.0)
    seconds = time.perf_counter() - start
    print(
        f"sparseps gen-data: wrote {meta['rows']} train rows in {args.files} files and "
        f"{meta['test_rows']} test rows to {args.out} in {seconds:.1f} s; CTR {meta['ctr_train']:.3f}; "
        f"planted model AUC {meta['bayes_auc_train']:.4f} on train, {meta['bayes_auc_test']:.4f} on test"
    )
    if args.json:
        print(json.dumps(meta))
    return 0
