"""``sparseps online CONFIG.yaml``: run a streaming-training job end to end.

Validates the config, then starts the job through the launcher in this process
(:func:`sparseps.launch.launch_cli.launch` of its
:class:`~sparseps.launch.config.LaunchConfig`: ``job.server_num`` servers and
``job.worker_num`` workers, each running :mod:`sparseps.online.job`: on this machine, or
with ``job.backend: ray`` placed on a Ray cluster, docs/cluster.md). Re-running the same command after a crash resumes after the
last checkpointed pass (see docs/online.md). Only one job runs on a model directory at a
time: this process holds its lock (:mod:`sparseps.online.lock`) for the whole job, and a
second ``sparseps online`` on the same folder exits 1 at once, naming the holder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..launch.config import LaunchConfig

__all__ = ["add_arguments", "launch_argv", "launch_config", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="the job's YAML config (see docs/online.md)")
    parser.add_argument(
        "--check", action="store_true", help="validate the config and print it; start nothing"
    )
    parser.add_argument(
        "--status-port", type=int, default=None, metavar="P",
        help="serve the job's status page (roles, samples/s, AUC, tables, the running pass) "
        "on this port (0: a free one; default: none; docs/observability.md)",
    )  # fmt: skip


def launch_config(
    config, config_path: str | Path, *, script: str | Path | None = None, script_args=(),
    status_port: int | None = None, job_id: str | None = None,
) -> LaunchConfig:  # fmt: skip
    """The :class:`~sparseps.launch.config.LaunchConfig` that runs the job of ``config``.

    ``script``: run this instead of :mod:`sparseps.online.job` (a script that calls
    ``job.main([CONFIG], on_phase=...)``), with ``script_args`` after the config path.
    ``status_port``: the launcher serves the status page there (None: no page).
    """
    from ..launch.config import LaunchConfig

    job = config.job
    ray = job.backend == "ray"
    script = Path(script) if script is not None else Path(__file__).with_name("job.py")
    values: dict[str, object] = {
        **(job.launch or {}),  # the launcher's other settings (job.launch)
        "script": str(script.resolve()),
        "script_args": (str(Path(config_path).resolve()), *map(str, script_args)),
        "server_num": job.server_num,
        "worker_num": job.worker_num,
        "log_dir": str(config.log_dir),
        "job_id": job_id or job.job_id or None,
        "heter_worker_num": job.heter_worker_num or None,
        "heter_device": job.heter_device if job.heter_worker_num else None,
        "backend": job.backend,
        "address": job.ray_address if ray else None,
        "server_resources": _json(job.server_resources) if ray else None,
        "worker_resources": _json(job.worker_resources) if ray else None,
        "status_port": status_port,
    }
    return LaunchConfig.from_dict(values, where="job.launch")


def launch_argv(config, config_path: str | Path, **options) -> list[str]:
    """The ``sparseps launch`` command line of :func:`launch_config` (for a launcher run as
    a process: the tests kill it)."""
    return launch_config(config, config_path, **options).argv()


def _json(resources) -> str | None:
    return None if resources is None else json.dumps(resources)


def run(args: argparse.Namespace) -> int:
    from ..launch.launch_cli import launch
    from ..launch.spec import new_job_id
    from .config import load_config
    from .ledger import Ledger, LedgerError
    from .lock import ModelDirLock
    from .model_dir import ModelDir

    config = load_config(args.config)
    if args.check:
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    if args.status_port is not None and config.job.backend == "ray":
        from ..errors import ConfigError

        raise ConfigError(
            "--status-port: not served for job.backend: ray (the Ray driver has no status "
            "page; see LOG_DIR/pids.json and the role logs in LOG_DIR)"
        )
    # worker 0 accepts the lock held here by the job id it runs under (lock.py): it may not
    # descend from this process (a Ray actor; a fork server a zygote forked), so this
    # process names the id
    job_id = config.job.job_id or new_job_id("sps-ray" if config.job.backend == "ray" else "sps")
    launched = launch_config(config, args.config, status_port=args.status_port, job_id=job_id)
    model = ModelDir(config.model_dir)
    # before anything in the folder is touched (the launcher writes MODEL_DIR/log)
    with ModelDirLock(config.model_dir, job_id=job_id):
        # this run's status from now on: a failure below never shows an earlier run's error
        model.write_status("starting", job=job_id)
        try:
            Ledger.of(config.model_dir).records()  # a damaged ledger: stop before starting
        except LedgerError as exc:
            model.write_status("failed", job=job_id, error=str(exc))
            raise
        code = launch(launched).exit_code
        if code != 0:
            status = _status(model)
            error = status.get("error") if status.get("state") == "failed" else None
            if not error:  # worker 0 did not record why (it was killed, or never ran the job)
                error = (f"the job failed (sparseps launch exited with code {code}) before "
                         "worker 0 recorded why; see the launcher's message above and the "
                         f"role logs in {config.log_dir}")  # fmt: skip
                model.write_status("failed", job=job_id, error=error)
            print(f"sparseps online: error: {error}", file=sys.stderr)
            return code
    print(f"sparseps online: done; ledger {config.model_dir / 'ledger.jsonl'}", flush=True)
    return code


def _status(model) -> dict:
    """``status.json`` of ``model`` ({} if absent or unreadable)."""
    try:
        status = json.loads(model.status_path.read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}
