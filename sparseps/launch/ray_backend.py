"""``sparseps launch --backend ray``: the job's processes placed and started by Ray.

Ray places, starts, supervises and wires the roles; the data plane stays zmq. The driver
(this module, run by ``sparseps launch`` on any machine of the cluster, or as the
entrypoint of ``ray job submit``):

1. reserves one placement-group bundle per role (``SPREAD``; ``ray_placement.py``);
2. creates a :class:`~sparseps.launch.ray_actor.RoleActor` in each bundle; each checks on
   its node that the script, the working folder and ``--file-root`` folders exist, and
   picks its ports there (server port, worker 0's rendezvous, ``/metrics``);
3. builds the job's :class:`~sparseps.launch.spec.ClusterSpec` from the gathered
   endpoints, so every role gets exactly the local launcher's environment contract, and
   starts the servers, the heter workers, then the workers;
4. polls every actor (its child's exit code and new log bytes, appended to
   ``LOG_DIR/{role}.{rank}.log`` here; worker 0's also to the console) with the local
   launcher's rules: fail fast on a non-zero exit or a server exit while workers run,
   ``--max-restarts`` whole-group worker restarts and per-heter-worker restarts in place
   (docs/heterps.md), heter workers and servers stopped once every worker exited 0,
   SIGINT/SIGTERM stop everything.

``sparseps scale LOG_DIR --servers N`` resizes the running job, and ``--workers N`` an
online async job's workers (``ray_scale.py``: a new placement group and actor per added
server or worker; the migration and the workers' membership are ``scaling.py``'s, shared
with the local launcher). The driver re-reads its roles every round: an added worker is
waited for, and the job completes once every worker ever started exited 0 (a worker
above the new count exits 0 by itself). A worker ``r > 0`` of an online job that may
leave (``elastic/leave_on_death``) and dies is recorded as a leave, as by the local
launcher: the job goes on without it.

The actors are not detached: Ray ends them when the driver exits or dies, and their
children die with them (``ray_actor.py``). ``LOG_DIR/pids.json`` lists every process
(``node`` names the host it runs on).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ..env import Role
from ..errors import ConfigError
from .config import LaunchConfig
from .ray_job import RayJob
from .ray_placement import check_config
from .records import Outcome

__all__ = ["RayBackend", "run"]


class RayBackend:
    """``ray``: the job's roles placed, started and supervised on a Ray cluster (:func:`run`)."""

    name = "ray"

    def launch(self, config: LaunchConfig) -> Outcome:
        return run(config)


def run(config: LaunchConfig) -> Outcome:
    """``sparseps launch --backend ray``: how the job ended (the outcome's exit code is the
    command's). SIGINT/SIGTERM stop the job when this runs on the main thread (the handlers
    are restored afterwards)."""
    from .logsetup import LauncherLog

    config = config.replace(metrics=config.metrics is not False)  # on by default
    script = check_config(config)
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--backend ray needs Ray on this machine: pip install 'sparseps[ray]' "
            "(or use the default --backend local)"
        ) from None
    log_dir = Path(os.path.abspath(config.log_dir))
    log_dir.mkdir(parents=True, exist_ok=True)
    out = LauncherLog(log_dir / "launcher.log")
    began = time.monotonic()
    ray.init(address=config.address, log_to_driver=False, logging_level=logging.WARNING)
    connected = time.monotonic()
    job = RayJob(config, script, out)
    service = None
    previous = {}
    if threading.current_thread() is threading.main_thread():  # signals reach only it
        previous = {
            s: signal.signal(s, lambda signum, frame: setattr(job, "signum", signum))  # noqa: ARG005
            for s in (signal.SIGINT, signal.SIGTERM)
        }
    try:
        job.place()
        placed = time.monotonic()
        job.wire()
        out.say(job.banner(), sys.stdout)
        from .ray_scale import scale_service

        service = scale_service(job)  # sparseps scale LOG_DIR (before pids.json is written)
        job.start([r for r in job.roles if r.role is Role.SERVER])
        job.start([r for r in job.roles if r.role is Role.HETER_WORKER])
        job.start([r for r in job.roles if r.role is Role.WORKER])
        # where a job's start-up goes (Ray's connection, its actors, the role processes)
        out.say(f"start-up: connected to Ray in {connected - began:.1f} s, {len(job.roles)} "
                f"role actors placed and ready in {placed - connected:.1f} s, their processes "
                f"started in {time.monotonic() - placed:.1f} s")  # fmt: skip
        outcome = job.supervise()
        if outcome.failure is not None:
            text = f"sparseps launch: job {job.job_id} failed: {outcome.failure.describe()}"
            out.say(text, sys.stderr)
        elif outcome.reason == "interrupted":
            out.say(f"sparseps launch: job {job.job_id} interrupted; every process stopped",
                    sys.stderr)  # fmt: skip
        else:
            out.say(f"sparseps launch: job {job.job_id} completed", sys.stdout)
        return outcome
    except ConfigError as exc:
        out.say(f"sparseps launch: error: {exc}")
        raise
    finally:
        if service is not None:
            service.close()
        job.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        ray.shutdown()
        out.close()
