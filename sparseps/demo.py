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
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from . import env as sps_env
from .errors import SparsePSError
from .observe import progress

DEFAULT_ROWS = 2_000_000
DEFAULT_SEED = 2026
DATA_FILES = 4  # synthetic train files (and one test file)
POLL_S = 0.5  # how often the bars read the workers' /metrics
STOP_GRACE_S = 30.0  # an interrupted demo waits this long for the launcher to stop the job


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


def _launch(command: list[str], env: dict, log_dir: Path, total: int | None, enabled) -> int:
    """Run the launcher; with the bars on, they follow its workers and its output is
    printed above them (line by line, to the same stream as before).

    The launcher dies with this process (it gets SIGTERM when we exit, however we exit,
    and stops every process of the job as for any SIGTERM); interrupted here (Ctrl-C),
    we ask it to stop the job and wait for it, SIGKILL only after ``STOP_GRACE_S``.
    """
    from .launch.procutil import die_with_parent_hook

    train = progress.bar(enabled, total=total, unit="row", unit_scale=True, desc="demo: train")
    bars = not train.disable
    piped: dict = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    with subprocess.Popen(
        command, env=env, preexec_fn=die_with_parent_hook(), **(piped if bars else {})
    ) as proc:
        pumps = [
            threading.Thread(target=_pump, args=(stream, target), daemon=True)
            for stream, target in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))
            if bars
        ]
        for pump in pumps:
            pump.start()
        phase = train
        try:
            while True:
                try:
                    code = proc.wait(timeout=POLL_S if bars else None)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if phase is train and (seen := _worker_progress(log_dir)) is not None:
                    workers, rows, done = seen
                    train.n = rows
                    train.refresh()
                    if workers and done == workers:
                        train.close()
                        phase = progress.bar(
                            enabled, desc="demo: evaluate, save", bar_format="{desc} ({elapsed})"
                        )
        except BaseException:
            _stop(proc)
            raise
        finally:
            for pump in pumps:
                pump.join(timeout=2.0)
            phase.close()
            train.close()
    return code


def _stop(proc: subprocess.Popen) -> None:
    """Ask the launcher to stop the job (SIGTERM: it stops its children), then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _pump(stream, target) -> None:
    for line in stream:
        progress.write(line.rstrip("\n"), file=target)


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
        sys.executable, "-m", "sparseps.cli", "launch",
        "--server-num", str(args.server_num), "--worker-num", str(args.worker_num),
        "--log-dir", str(out / "log"), str(job),
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
    env = dict(sps_env.process_environ())
    if args.memory_rows < 0:
        raise SparsePSError(f"--memory-rows must be >= 0, got {args.memory_rows}")
    if args.memory_rows > 0:  # servers read their disk dir from the environment
        command += ["--memory-rows", str(args.memory_rows)]
        env[sps_env.DISK_DIR] = str(Path(args.disk_dir or out / "disk").resolve())
    elif args.disk_dir:
        raise SparsePSError("--disk-dir needs --memory-rows N (N > 0)")
    start = time.perf_counter()
    rows = None if args.train else args.rows
    code = _launch(command, env, out / "log", rows, args.progress)
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
