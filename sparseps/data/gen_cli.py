"""``sparseps gen-data``: synthetic Criteo-format TSV from a planted model.

Writes ``OUT/train/part-00000.tsv ...`` (``--files`` files), ``OUT/test/part-00000.tsv``
and ``OUT/meta.json``, and prints the planted model's AUC on what it wrote: the best AUC
any model can reach on that data (see :mod:`sparseps.data.synthetic`).
"""

from __future__ import annotations

import argparse
import json
import time

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
    meta = write_dataset(
        args.out, args.rows, args.seed, files=args.files, test_rows=args.test_rows,
        day=args.day, drift=args.drift, knobs=knobs,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    print(
        f"sparseps gen-data: wrote {meta['rows']} train rows in {args.files} files and "
        f"{meta['test_rows']} test rows to {args.out} in {seconds:.1f} s; CTR {meta['ctr_train']:.3f}; "
        f"planted model AUC {meta['bayes_auc_train']:.4f} on train, {meta['bayes_auc_test']:.4f} on test"
    )
    if args.json:
        print(json.dumps(meta))
    return 0
