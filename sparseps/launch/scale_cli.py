"""``sparseps scale LOG_DIR --servers N [--workers M]``: resize a running launched job.

It reaches the job's launcher through the control store named in ``LOG_DIR/pids.json``
(``control``), asks for one scale and waits for the launcher's answer (the launcher's
side: :mod:`sparseps.launch.scaling`; docs/elastic.md). Python API: :func:`scale_job`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

from ..errors import ConfigError, SparsePSError
from .scale_error import ScaleError

__all__ = ["add_arguments", "run", "scale_job"]

DEFAULT_TIMEOUT_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("log_dir", metavar="LOG_DIR",
        help="the job's --log-dir (its pids.json names the launcher's control store)")  # fmt: skip
    add("--servers", type=int, default=None, metavar="N",
        help="live servers afterwards: new ranks start and take their share of the virtual "
             "shards; a shrink drains the highest ranks, then stops them")  # fmt: skip
    add("--workers", type=int, default=None, metavar="N",
        help="workers afterwards (jobs whose workers follow membership: sparseps online); "
             "new ranks start, ranks >= N leave at their next pass boundary")  # fmt: skip
    add("--timeout-s", dest="timeout_s", type=float, default=DEFAULT_TIMEOUT_S,
        help=f"how long to wait for the launcher's answer (default {DEFAULT_TIMEOUT_S:g})")  # fmt: skip
    add("--json", action="store_true", help="print the launcher's report as one JSON line")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _control(log_dir: Path) -> tuple[str, str]:
    """The control store's address and the job's key folder ("" when plain)."""
    path = log_dir / "pids.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise ScaleError(f"scale: {path} does not exist: no job was launched with "
                         f"--log-dir {log_dir}") from None  # fmt: skip
    except (OSError, ValueError) as exc:
        raise ScaleError(f"scale: cannot read {path} ({exc})") from None
    launcher = record.get("launcher")
    if not isinstance(launcher, int) or not _alive(launcher):
        raise ScaleError(f"scale: the job of {log_dir} is not running (its launcher, pid "
                         f"{launcher}, has exited); start it again with sparseps launch")  # fmt: skip
    control = record.get("control")
    if not isinstance(control, str):
        raise ScaleError(
            f"scale: {path} names no control store: scaling serves one-node local launches "
            "and --backend ray jobs (not multi-node launches, nor jobs launched by an older "
            "sparseps)"
        )
    return control, str(record.get("key_dir") or "")


def scale_job(log_dir: str | os.PathLike, *, servers: int | None = None,
              workers: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:  # fmt: skip
    """Resize the running job launched with ``--log-dir log_dir``; returns the launcher's
    report (``servers_before``, ``servers_after``, ``started``, ``stopped``,
    ``vshards_moved``, ``rows_moved``, ``seconds``, ``longest_cutover_s``; with workers
    ``workers_before``, ``workers_after``, ``workers_started``, and ``members``, ``left``
    once a worker died and left: the launch ranks that train, the dead ones).

    Raises:
        ConfigError: neither ``servers`` nor ``workers``, or a count < 1.
        ScaleError: the job is not running, another scale is running, or the launcher
            refused or failed the request (the message says why and how to fix it).
    """
    if servers is None and workers is None:
        raise ConfigError("scale: give --servers N and/or --workers N")
    for name, value in (("--servers", servers), ("--workers", workers)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"scale {name} {value}: a job needs at least one")
    from ..store.client import StoreClient

    control, key_dir = _control(Path(log_dir))
    security = None
    if key_dir:
        from ..rpc.security import JobKeys, Security

        security = Security(JobKeys.load(key_dir))
    try:
        store = StoreClient(control, timeout_s=10.0, setting="--timeout-s", what="control store",
                         security=security)  # fmt: skip
    except SparsePSError as exc:
        raise ScaleError(f"scale: the launcher's control store at {control} does not answer "
                         f"({exc}); is the job of {log_dir} still running?") from None  # fmt: skip
    try:
        if store.add("scale/busy", 1) != 1:
            store.add("scale/busy", -1)
            raise ScaleError(f"scale: another scale of the job of {log_dir} is running; wait "
                             "for it to finish (one scale at a time)")  # fmt: skip
        token = secrets.token_hex(8)
        request = {"id": token, "servers": servers, "workers": workers}
        try:
            store.set("scale/request", json.dumps(request).encode())
        except BaseException:
            store.add("scale/busy", -1)
            raise
        key = f"scale/result/{token}"
        deadline = time.monotonic() + timeout_s
        try:
            while not store.check([key]):
                if time.monotonic() > deadline:
                    raise ScaleError(f"scale: the launcher did not answer within {timeout_s:g} s "
                                     "(it goes on; see launcher.log); raise --timeout-s")  # fmt: skip
                time.sleep(0.1)
            result = json.loads(store.get(key))
            store.delete_key(key)
        except ScaleError:
            raise
        except SparsePSError as exc:
            raise ScaleError(f"scale: the launcher of {log_dir} stopped answering while it "
                             f"scaled (did the job end? see its launcher.log): {exc}") from None  # fmt: skip
    finally:
        store.close()
    if not result.get("ok"):
        raise ScaleError(str(result.get("error")))
    result.pop("ok", None)
    return result


def _describe(report: dict) -> str:
    lines = []
    if "servers_before" in report:
        lines.append(
            f"servers {report['servers_before']} -> {report['servers_after']}: "
            f"{report.get('vshards_moved', 0)} virtual shards and {report.get('rows_moved', 0)} "
            f"rows moved in {report.get('seconds', 0.0):.2f} s, longest cut-over "
            f"{report.get('longest_cutover_s', 0.0) * 1000:.1f} ms"
            + (f"; started servers {report['started']}" if report.get("started") else "")
            + (f"; stopped servers {report['stopped']}" if report.get("stopped") else "")
        )
    if "workers_before" in report:
        lines.append(f"workers {report['workers_before']} -> {report['workers_after']}"
                     + (f"; started workers {report['workers_started']}"
                        if report.get("workers_started") else "")
                     + (f"; members {report['members']} (left: {report['left']})"
                        if report.get("members") else ""))  # fmt: skip
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    report = scale_job(args.log_dir, servers=args.servers, workers=args.workers,
                       timeout_s=args.timeout_s)  # fmt: skip
    print(_describe(report))
    if args.json:
        print(json.dumps(report))
    sys.stdout.flush()
    return 0
