"""``sparseps demo``: the main job on its embedded default (DESIGN §2.1).

Makes (or reuses) a synthetic Criteo-format data set from a planted model, launches
1 server + 2 workers on this machine, trains wide&deep for one pass, evaluates global
test AUC and logloss, saves a checkpoint and an inference model when the model-file
support is present, and prints one summary (with ``--json``: the last stdout line is a
JSON object).

On a terminal progress bars (stderr) show the phases: ``generate`` (data files written),
``train`` (rows trained by all workers, read from their ``/metrics``) and ``evaluate,
save`` (from the end of every worker's training pass until the job exits); the job's
output scrolls above them. ``--progress``/``--no-progress`` force them on or off; off,
the job's output passes through untouched and no worker is scraped.
"""

from __future__ import annotations

import argparse
import codecs
import io
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

from . import env as sps_env
from .errors import SparsePSError
from .launch.config import LaunchConfig
from .launch.launch_cli import launch
from .launch.records import Outcome
from .observe import progress

DEFAULT_ROWS = 2_000_000
DEFAULT_SEED = 2026
DATA_FILES = 4  # synthetic train files (and one test file)
POLL_S = 0.5  # how often the bars read the workers' /metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="synthetic train rows")
    parser.add_argument(
        "--train", help="Criteo TSV file or folder to train on (instead of synthetic)"
    )
    parser.add_argument("--test", help="Criteo TSV file or folder to test on (with --train)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON last")
    parser.add_argument("--mode", default="async", choices=["sync", "async", "geo", "hybrid"])
    parser.add_argument(
        "--gpups", action="store_true",
        help="train in GPUPS mode: each pass's rows in device tables sharded over the "
        "workers (docs/training.md, GPUPS); the data is loaded into memory first",
    )  # fmt: skip
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cuda", "cpu"],
        help="with --gpups: where the pass's rows live (auto: a GPU when visible)",
    )  # fmt: skip
    parser.add_argument(
        "--gpups-passes", type=int, default=2,
        help="with --gpups: the train files cut into this many passes, each one's keys and "
        "rows prepared while the one before trains (the GPUPS pipeline)",
    )  # fmt: skip
    parser.add_argument("--server-num", type=int, default=1)
    parser.add_argument("--worker-num", type=int, default=2)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="synthetic data seed")
    parser.add_argument(
        "--memory-rows", type=int, default=0,
        help="rows of each table a server keeps in memory, the rest on disk (docs/table.md); "
        "0: every row in memory",
    )  # fmt: skip
    parser.add_argument(
        "--disk-dir", help="the servers' folder for rows beyond --memory-rows (default OUT/disk)"
    )
    parser.add_argument(
        "--cvm", action="store_true",
        help="give the model each slot's pooled show/click features (Paddle's cvm op)",
    )  # fmt: skip
    parser.add_argument(
        "--embedx-threshold", type=float, default=None,
        help="CTR accessor: store a feature's embedx part once its show/click score reaches "
        "this (docs/table.md, 'Accessor'); default: every row whole from its first push",
    )  # fmt: skip
    progress.add_argument(parser)


def _data(args, out: Path) -> tuple[str, str, float | None]:
    if args.train or args.test:
        if not (args.train and args.test):
            raise SparsePSError("give both --train and --test, or neither")
        return args.train, args.test, None
    from .data.synthetic import write_dataset

    folder = out / "data"
    meta_path = folder / "meta.json"
    files = DATA_FILES + 1
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("rows") == args.rows and meta.get("seed") == args.seed:
            with progress.bar(
                args.progress, total=files, unit="file", desc="demo: generate"
            ) as bar:
                bar.set_postfix_str("reused", refresh=False)
                bar.update(files)
            return str(folder / "train"), str(folder / "test"), meta.get("bayes_auc_test")
    with _FilesWritten(folder, files, args.progress):
        meta = write_dataset(folder, rows=args.rows, seed=args.seed, files=DATA_FILES)
    return str(folder / "train"), str(folder / "test"), meta.get("bayes_auc_test")


class _FilesWritten:
    """The ``generate`` bar: part files finished under ``folder`` (a watcher thread)."""

    def __init__(self, folder: Path, files: int, enabled: bool | None) -> None:
        self._bar = progress.bar(enabled, total=files, unit="file", desc="demo: generate")
        self._folder, self._files = folder, files
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _done(self) -> int:
        return sum(1 for split in ("train", "test") for _ in (self._folder / split).glob("*.tsv"))

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self._bar.n = min(self._done(), self._files)
            self._bar.refresh()

    def __enter__(self) -> _FilesWritten:
        if not self._bar.disable:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if exc[0] is None:
            self._bar.n = self._files
        self._bar.close()


def _worker_progress(log_dir: Path) -> tuple[int, int, int] | None:
    """``(workers, rows trained, workers done with their training pass)`` from every
    worker's ``/metrics`` (ports in ``LOG_DIR/pids.json``); None before they serve it."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        record = json.loads((log_dir / "pids.json").read_text())
    except (OSError, ValueError):
        return None
    latest = {}
    for child in record.get("children", []):
        if child.get("role") == "worker" and child.get("metrics_port"):
            latest[child["rank"]] = child  # a restarted worker: its newest attempt
    rows = done = 0
    for child in latest.values():
        try:
            url = f"http://127.0.0.1:{int(child['metrics_port'])}/metrics"
            with urllib.request.urlopen(url, timeout=1.0) as reply:  # noqa: S310 - loopback
                text = reply.read().decode()
        except (OSError, ValueError):
            return None  # not serving yet (or gone): no reading this time
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "sparseps_worker_samples_total":
                    rows += int(sample.value)
                elif sample.name == "sparseps_worker_pass" and sample.labels == {"phase": "train"}:
                    done += 1
    return len(latest), rows, done


def _launch(config: LaunchConfig, total: int | None, enabled) -> Outcome:
    """Run the job in this process (:func:`sparseps.launch.launch_cli.launch`); with the
    bars on, a thread follows its workers and the launcher's output (its lines, worker 0's
    echo, log records on stderr) is printed above them.

    On the main thread the launcher's supervisor takes SIGINT/SIGTERM for as long as it
    runs (and gives them back): either stops every process of the job. Then SIGINT raises
    ``KeyboardInterrupt`` here (``sparseps demo: interrupted``, exit 130) and SIGTERM ends
    this process as SIGTERM would have.
    """
    train = progress.bar(enabled, total=total, unit="row", unit_scale=True, desc="demo: train")
    if train.disable:
        outcome = launch(config)
    else:
        done = threading.Event()
        phases = [train]
        follower = threading.Thread(
            target=_follow, args=(Path(config.log_dir), train, phases, done, enabled), daemon=True
        )
        follower.start()
        try:
            with _AboveTheBars():
                outcome = launch(config)
        finally:
            done.set()
            follower.join(timeout=5.0)
            phases[-1].close()
            train.close()
    if outcome.reason == "interrupted":
        if outcome.exit_code == 128 + signal.SIGTERM:  # end as SIGTERM ends a process
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        raise KeyboardInterrupt
    return outcome


def _follow(log_dir: Path, train, phases: list, done: threading.Event, enabled) -> None:
    """The ``train`` bar from the workers' ``/metrics``, then the ``evaluate, save`` phase
    once every worker ended its training pass (``phases[-1]`` is the bar that is up)."""
    while not done.wait(POLL_S):
        if (seen := _worker_progress(log_dir)) is None:
            continue
        workers, rows, finished = seen
        train.n = rows
        train.refresh()
        if workers and finished == workers:
            train.close()
            phases.append(
                progress.bar(enabled, desc="demo: evaluate, save", bar_format="{desc} ({elapsed})")
            )
            return


class _Lines(io.TextIOBase):
    """A console stream whose lines go through :func:`progress.write` to ``target`` (the
    bars stay below them); ``buffer`` takes bytes (worker 0's echo)."""

    def __init__(self, target) -> None:
        self._target = target
        self._partial = ""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lock = threading.Lock()
        self.buffer = _LineBytes(self)

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            progress.write(line, file=self._target)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            line, self._partial = self._partial, ""
        if line:
            progress.write(line, file=self._target)

    def fileno(self) -> int:
        return self._target.fileno()


class _LineBytes:
    def __init__(self, lines: _Lines) -> None:
        self._lines = lines

    def write(self, data: bytes) -> int:
        self._lines.write(self._lines.decoder.decode(data))
        return len(data)

    def flush(self) -> None:
        pass  # a line is written once it is whole


class _AboveTheBars:
    """For the launch: ``sys.stdout``/``sys.stderr`` and the logging handlers that write
    to the console print their lines above the bars (as the lines of the launcher's process did
    before the launch ran in this one)."""

    def __enter__(self) -> _AboveTheBars:
        self._saved = sys.stdout, sys.stderr
        out, err = _Lines(sys.stdout), _Lines(sys.stderr)
        self._handlers = [
            (h, h.stream)
            for h in logging.getLogger().handlers
            if isinstance(h, logging.StreamHandler) and h.stream in self._saved
        ]
        for handler, stream in self._handlers:
            handler.setStream(err if stream is self._saved[1] else out)
        sys.stdout, sys.stderr = out, err
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = self._saved
        for handler, stream in self._handlers:
            handler.setStream(stream)


def run(args: argparse.Namespace) -> int:
    if not args.train and args.rows < 1:
        raise SparsePSError(f"--rows must be >= 1, got {args.rows}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train, test, bayes_auc = _data(args, out)
    result_path = out / "result.json"
    result_path.unlink(missing_ok=True)
    job = Path(__file__).resolve().parent / "jobs" / "wide_deep_job.py"
    command = [
        "--train", train, "--test", test, "--result", str(result_path),
        "--mode", "gpups" if args.gpups else args.mode, "--device", args.device,
        "--checkpoint", str(out / "checkpoint"), "--inference-model", str(out / "inference_model"),
    ]  # fmt: skip
    if args.gpups:
        if args.gpups_passes < 1:
            raise SparsePSError(f"--gpups-passes must be >= 1, got {args.gpups_passes}")
        command += ["--passes", str(args.gpups_passes)]
    if args.cvm:
        command.append("--cvm")
    if args.embedx_threshold is not None:
        if args.embedx_threshold < 0:
            raise SparsePSError(f"--embedx-threshold must be >= 0, got {args.embedx_threshold}")
        command += ["--embedx-threshold", repr(args.embedx_threshold)]
    settings: dict[str, str] = {}  # every child's environment besides its role
    if args.memory_rows < 0:
        raise SparsePSError(f"--memory-rows must be >= 0, got {args.memory_rows}")
    if args.memory_rows > 0:  # servers read their disk dir from their settings
        command += ["--memory-rows", str(args.memory_rows)]
        settings[sps_env.DISK_DIR] = str(Path(args.disk_dir or out / "disk").resolve())
    elif args.disk_dir:
        raise SparsePSError("--disk-dir needs --memory-rows N (N > 0)")
    config = LaunchConfig(
        script=str(job), script_args=tuple(command), server_num=args.server_num,
        worker_num=args.worker_num, log_dir=str(out / "log"), env=settings,
    )  # fmt: skip
    start = time.perf_counter()
    rows = None if args.train else args.rows
    code = _launch(config, rows, args.progress).exit_code
    if code != 0 or not result_path.is_file():
        raise SparsePSError(
            f"the demo job failed (exit code {code}); see the logs in {out / 'log'}"
        )
    summary = json.loads(result_path.read_text())
    if not summary["rows"]:  # a model trained on nothing is no result to report
        raise SparsePSError(
            f"the demo job trained 0 rows: {train} holds no rows it could read (see the "
            f"bad-line counts in {out / 'log'})"
        )
    summary.update(
        wall_s=round(time.perf_counter() - start, 1),
        bayes_auc=bayes_auc,
        test_data=test,
        train_data=train,
        checkpoint=summary.get("checkpoint"),
        inference_model=summary.get("inference_model"),
    )
    gap = "" if bayes_auc is None else f" (planted model: {bayes_auc:.4f})"
    if args.gpups:
        gap += f", GPUPS on {summary['device']} (build {summary['build_s']} s per pass)"
    print(
        f"sparseps demo: {summary['rows']} rows in {summary['train_s']:.1f} s "
        f"({summary['samples_per_s']:.0f} samples/s), test AUC {summary['test_auc']:.4f}{gap}, "
        f"logloss {summary['test_logloss']:.4f}, table rows {summary['table_rows']}"
    )
    if args.json:
        print(json.dumps(summary))
    return 0
