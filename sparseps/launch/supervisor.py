"""Process supervision: start this node's servers and workers, watch them, fail fast.

Rules (DESIGN §1, "launcher"):

- how a child starts, where its output goes and ``LOG_DIR/pids.json``:
  :mod:`sparseps.launch.children`;
- when a worker exits non-zero and restarts are left, the whole worker *group* is
  restarted (below); when a child exits non-zero otherwise, every other child is stopped
  (SIGTERM, then SIGKILL after ``grace_s``) and the outcome names it;
- a server that exits before every worker of the job finished, with *any* code (a
  server that gets SIGTERM exits 0), fails the job at once: its tables are gone, so the
  workers could only wait out their RPC timeout, and a restarted worker group would
  train against a dead server. A server exit never restarts the worker group; the
  servers are checked before a worker's failure is taken as a reason to restart.
  With ``--replicas R`` a lost server is tolerated while every shard keeps a live copy,
  and replaced while ``max_restarts`` allows; the loss that leaves a shard without a copy
  fails the job (:mod:`sparseps.launch.server_loss`);
- when all workers of the job exited 0, this node's servers are asked to stop (the
  ``stop_servers`` callback, e.g. a ``stop`` RPC), then SIGTERM/SIGKILL as a fallback;
- SIGINT/SIGTERM to the launcher stop every child.

Why the whole group restarts: once the workers have formed their gloo group, a
single new worker cannot join it (gloo's full mesh is built once; the survivors'
collectives would wait for the dead peer until their timeout). So every worker is
stopped and all of them start again as generation ``k`` with a fresh rendezvous (the
``restart_env`` callback: a new master port on one node), while the servers keep
running: their tables survive, and a script that loads its last checkpoint resumes.
Across nodes the coordinator makes every launcher stop its workers before any starts
generation ``k`` (see ``node_sync.py``). ``max_restarts`` bounds the group restarts
of the whole job. Once ``sparseps scale --workers`` or a worker's leave changed the
workers (a one-node launch), a restart starts the *current members* only, as ranks
``0..n-1`` of a world of ``n`` (the new generation's rendezvous counts ``0..n-1``, and
an online job resumes on ``SPARSEPS_WORKER_NUM`` = n): workers shrunk away or dead are
not started again. Which workers those are (the members, the ones the job waits for, the
scale requests in flight) is :class:`~sparseps.launch.worker_world.WorkerWorld`'s to know;
this module decides when processes start and stop.

``sparseps_launcher_restarts_total`` counts the group restarts.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..env import MASTER, Role
from ..errors import SparsePSError
from .children import Child, Children
from .fork_server import ForkServer, fork_server_enabled
from .node_sync import Coordinator, LocalCoordinator
from .procutil import stop_groups, tail
from .records import SERVER_EXIT_NOTE, ChildSpec, Failure, Outcome, SupervisorConfig
from .server_loss import ServerLoss
from .worker_world import WorkerWorld

__all__ = ["ChildSpec", "Failure", "Outcome", "Supervisor", "SupervisorConfig"]

log = logging.getLogger(__name__)


def _exit_note(role: Role) -> str:
    if role is Role.HETER_WORKER:
        return SERVER_EXIT_NOTE.replace("a server exit", "a heter worker exit")
    return SERVER_EXIT_NOTE


def _exit_status(code: int) -> int:
    """A child's return code as a shell exit status (signal N -> 128+N)."""
    return 128 - code if code < 0 else code


@dataclass
class Supervisor:
    """Runs a set of children to completion or first failure.

    Args:
        children: this node's processes; servers are started first.
        config: supervision knobs.
        coordinator: shares "workers done" / "failed" with other nodes' launchers
            (default: this launcher is the whole job).
        stop_servers: asks this node's servers to exit (called once all workers are done);
            SIGTERM follows for any server still running after ``server_stop_s``.
        pids_path: where to write the pid list (default ``<first log dir>/pids.json``).
        job_id: recorded in the pid list.
        node: this node's address, named in failures reported to other launchers.
        restart_env: extra environment for the workers of restart generation ``k``
            (e.g. ``{"SPARSEPS_MASTER": <a fresh port>}``). Every worker gets
            ``SPARSEPS_RESTART_COUNT`` = its generation.
        extra_record: more top-level fields of ``pids.json`` (the launcher's ports).
        worker_left: asked when worker ``rank`` exits with a non-zero ``code``: records
            its death as a leave and returns "" (the others go on without it: no failure,
            no restart), or says why the job cannot go on without it, or None when the
            job's workers do not follow membership (both: it fails or restarts as usual). Set by :class:`sparseps.launch.scaling.ScaleService` for
            jobs that follow membership (an online job's workers: docs/elastic.md).
    """

    children: list[ChildSpec]
    config: SupervisorConfig = field(default_factory=SupervisorConfig)
    coordinator: Coordinator | None = None
    stop_servers: Callable[[], None] | None = None
    pids_path: Path | None = None
    job_id: str = ""
    node: str = ""
    restart_env: Callable[[int], Mapping[str, str]] | None = None
    extra_record: Mapping[str, object] = field(default_factory=dict)
    worker_left: Callable[[int, int], str | None] | None = None

    def __post_init__(self) -> None:
        from ..observe.registry import launcher_metrics

        self._metrics = launcher_metrics()
        self._lock = threading.RLock()  # starts from a scale request's thread; pids.json
        # (role, rank) of servers stopped by a scale-down: a planned exit, not a failure
        self.retired: set[tuple[str, int]] = set()
        # with replicas, a lost server may be tolerated and replaced (server_loss.py)
        self._loss = ServerLoss(self.config.replicas, self.config.server_num,
                                self.config.max_restarts, self._replace_server)  # fmt: skip
        self._signal: int | None = None
        self._heter_restarts: dict[int, int] = {}  # heter worker rank: restarts used
        workers = sum(1 for c in self.children if c.role is Role.WORKER)
        if self.coordinator is None:
            self.coordinator = LocalCoordinator(workers)
        self._coordinator: Coordinator = self.coordinator
        # which workers the job counts (members, the ones it waits for, scale requests in
        # flight); it edits self.children in place
        self._world = WorkerWorld(self.children, self._lock, self._coordinator)
        if self.pids_path is None and self.children:
            self.pids_path = self.children[0].log_path.parent / "pids.json"
        self._children = Children(self._lock, self.pids_path, self.job_id, self.extra_record)

    # -- starting ----------------------------------------------------------------------

    def _start(self, spec: ChildSpec, attempt: int) -> Child:
        return self._children.start(spec, attempt)

    # -- a running job's changes (sparseps scale: sparseps.launch.scaling) -------------
    # the workers' part is the WorkerWorld's (sparseps.launch.worker_world)

    def add_child(self, spec: ChildSpec) -> Child:
        """Start one more process while the job runs (a new server, or a new worker: it
        joins the workers the job waits for, and a worker group restart restarts it)."""
        with self._lock:  # joined and started as one step for the supervision loop
            if spec.role is Role.WORKER:
                self._world.join(spec)
            return self._start(
                spec, self._coordinator.generation if spec.role is Role.WORKER else 0
            )

    def begin_change(self) -> str:
        """A scale request starts (:class:`sparseps.launch.scaling.ScaleService`): ""
        when it may go on (the job does not complete until :meth:`end_change`), else why
        not: the job is finishing (every worker exited 0) or finished."""
        return self._world.begin_change()

    def end_change(self) -> None:
        """The scale request that :meth:`begin_change` admitted is done."""
        self._world.end_change()

    @property
    def members(self) -> list[int]:
        """The launch ranks of the job's current workers (sorted): the launch's workers
        until a scale or a leave changed them."""
        return self._world.members

    def set_world(self, count: int) -> None:
        """The job's worker count is now ``count``: the lowest ``count`` members stay
        (workers of higher ranks exit 0 by themselves; the job completes when every worker
        ever started exited 0)."""
        self._world.set_world(count)

    def retire(self, role: Role, rank: int) -> None:
        """Plan the exit of a process (a drained server): it neither fails the job nor is
        asked to stop at the end."""
        self.retired.add((role.value, rank))

    def wait_retired(self, timeout: float) -> None:
        """Wait for the retired processes to exit; SIGTERM/SIGKILL the ones still running."""
        procs = [c.proc for c in list(self._children.running) if self._is_retired(c)]
        deadline = time.monotonic() + timeout
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        stop_groups([p for p in procs if p.poll() is None], self.config.grace_s)

    def worker_env(self) -> dict[str, str]:
        """The environment of a running worker of the current generation (empty if none)."""
        return self._children.worker_env()

    def _is_retired(self, child: Child) -> bool:
        return (child.spec.role.value, child.spec.rank) in self.retired

    def roles(self) -> list[dict]:
        """Every role of this node as it stands now (the status page's rows:
        :meth:`Children.roles <sparseps.launch.children.Children.roles>`)."""
        return self._children.roles()

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> Outcome:
        """Start every child and supervise until the job completes, fails or is interrupted."""
        previous = self._install_signal_handlers()
        if self.children and fork_server_enabled(self.children[0].env):
            # from this thread, which outlives every child: the kernel ties the fork
            # server's death signal to it (procutil.die_with_parent_hook)
            self._children.fork_server = ForkServer(self.children[0].env)
        try:
            for spec in sorted(self.children, key=lambda c: c.role is Role.WORKER):
                self._start(spec, 0)
            return self._loop()
        finally:
            stop_groups([c.proc for c in self._children.running], self.config.grace_s)
            if self._children.fork_server is not None:
                self._children.fork_server.close()
            for child in self._children.running:
                child.pump.join(timeout=2.0)
            self._coordinator.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum, frame):  # noqa: ARG001 - signal handler signature
            self._signal = signum

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        return previous

    def _loop(self) -> Outcome:
        world = self._world
        world.begin_generation()
        reported = False
        while True:
            if self._signal is not None:
                return self._interrupted(self._signal)
            if (server := self._exited_server()) is not None:
                return self._fail(server)
            restart: tuple[Child | None, str] | None = None
            for child in list(self._children.running):
                if child.spec.role is not Role.WORKER or child.exit_code is not None:
                    continue
                code = child.proc.poll()
                if code is None:
                    continue
                child.exit_code = code
                if code == 0:
                    world.finished(child.spec.rank)
                    log.info("worker %d finished", child.spec.rank)
                elif (server := self._exited_server(settle=True)) is not None:
                    return self._fail(server)  # the worker failed because a server died
                elif world.leave(child.spec, child.proc.pid, code, self.worker_left):
                    continue
                elif self._restarts_left():
                    restart = (child, "")
                    break
                else:
                    return self._fail(child)
            remote = self._coordinator.remote_failure()
            if remote:
                log.error("stopping: %s", remote)
                text = f"another launcher of this job reported: {remote}"
                return Outcome(1, "failed", Failure("launcher", -1, 0, 1, "", remote=text))
            if restart is None and (reason := self._coordinator.remote_restart()):
                restart = (None, reason)
            if restart is not None:
                failed = self._restart_workers(*restart)
                if failed is not None:
                    return failed
                world.begin_generation()
                reported = False
                continue
            # once no worker is waited for: a scale request in flight finishes first (it
            # may add workers to wait for); once finishing, new ones are refused
            if not reported and not world.waiting and (count := world.finish()) is not None:
                self._coordinator.report_workers_done(count)
                reported = True
            if reported and self._coordinator.all_workers_done():
                self._stop_servers()
                return Outcome(0, "completed")
            self._warn_quiet()
            self.roles()  # keeps sparseps_launcher_role_up current
            time.sleep(self.config.poll_s)

    def _interrupted(self, signum: int) -> Outcome:
        name = signal.Signals(signum).name
        log.warning("received %s: stopping every process of this job", name)
        self._coordinator.report_failure(
            f"the launcher on {self.node or 'another node'} received {name}"
        )
        return Outcome(128 + signum, "interrupted")

    def _exited_server(self, *, settle: bool = False) -> Child | None:
        """The first of this node's servers that has exited (None while all run).

        Args:
            settle: look twice, ``poll_s`` apart: a worker that failed because a server
                died may be seen before the server's exit is.
        """
        for attempt in range(2 if settle else 1):
            if attempt:
                time.sleep(self.config.poll_s)
            for child in list(self._children.running):  # a lost server may be replaced meanwhile
                if child.spec.role is Role.WORKER:  # servers and heter workers serve the job
                    continue
                if child.exit_code is None:
                    child.exit_code = child.proc.poll()
                if child.exit_code is not None and self._is_retired(child):
                    continue  # drained by a scale-down and stopped: planned
                if child.exit_code is not None and self._restarted_heter_worker(child):
                    continue
                if child.exit_code is not None and not self._loss.tolerated(child):
                    return child
        return None

    def _restarted_heter_worker(self, child: Child) -> bool:
        """Start a heter worker that exited again, in place, while ``max_restarts`` allows
        (its own count per rank): the dense state is the servers', its trainers wait for it
        and count the steps they had in flight to it as lost (docs/heterps.md)."""
        rank = child.spec.rank
        used = self._heter_restarts.get(rank, 0)
        if child.spec.role is not Role.HETER_WORKER or used >= self.config.max_restarts:
            return False
        self._heter_restarts[rank] = used + 1
        self._metrics.restarts.inc()
        log.warning(
            "%s (pid %d) exited with code %s: restarting it (heter worker restart %d of %d; "
            "its trainers lose the steps they had in flight to it)",
            child.spec.name, child.proc.pid, child.exit_code, used + 1, self.config.max_restarts,
        )  # fmt: skip
        self._children.running.remove(child)
        self._start(child.spec, used + 1)
        return True

    @property
    def lost_servers(self) -> set[int]:
        """Ranks of servers lost and tolerated (replicas): left out of the final stop."""
        return self._loss.lost

    def _replace_server(self, lost: Child, spec: ChildSpec, attempt: int) -> None:
        self._children.running.remove(lost)
        self._start(spec, attempt)

    def _restarts_left(self) -> bool:
        return self._coordinator.generation < self.config.max_restarts

    def _restart_workers(self, failed: Child | None, remote: str) -> Outcome | None:
        """Stop every worker of this node and start the group again as the next generation.

        Args:
            failed: this node's worker whose failure caused the restart, or None when
                another launcher asked for it (``remote`` says why).

        Returns:
            None when the new generation runs, else the outcome of the failed restart.
        """
        k, limit = self._coordinator.generation + 1, self.config.max_restarts
        self._metrics.restarts.inc()
        where = f" on {self.node}" if self.node else ""
        if failed is not None:
            reason = (
                f"{failed.spec.name} (pid {failed.proc.pid}){where} exited with code "
                f"{failed.exit_code}"
            )
            log.warning(
                "%s: restarting all workers (restart %d of %d; servers keep running)",
                reason, k, limit,
            )  # fmt: skip
        else:
            log.warning("restarting this node's workers (restart %d of %d): %s", k, limit, remote)
        old = [c for c in self._children.running if c.spec.role is Role.WORKER]
        stop_groups([c.proc for c in old], self.config.grace_s)  # survivors and leftovers
        for c in old:
            c.pump.join(timeout=2.0)
            c.exit_code = c.proc.returncode
        self._children.running = [
            c for c in self._children.running if c.spec.role is not Role.WORKER
        ]
        try:
            self._coordinator.restart(
                reason if failed is not None else None,
                cancelled=lambda: self._signal is not None,
            )
        except SparsePSError as exc:
            if self._signal is not None:
                return self._interrupted(self._signal)
            log.error("%s", exc)
            self._coordinator.report_failure(f"{self.node or 'a launcher'}: {exc}")
            return Outcome(1, "failed", Failure("launcher", -1, 0, 1, "", remote=str(exc)))
        if (server := self._exited_server()) is not None:
            return self._fail(server)  # never start a generation against a dead server
        extra = dict(self.restart_env(k)) if self.restart_env else {}
        specs = self._world.restart_specs()
        for spec in specs:
            self._start(replace(spec, env={**spec.env, **extra}), k)
        if specs:
            log.info(
                "worker group restart %d of %d: started worker(s) %s, rendezvous %s",
                k, limit, ",".join(str(c.rank) for c in specs),
                extra.get(MASTER, specs[0].env.get(MASTER, "-")),
            )  # fmt: skip
        return None

    def _fail(self, child: Child) -> Outcome:
        spec, exit_code = child.spec, child.exit_code
        assert exit_code is not None, "a child fails once it has exited"
        child.pump.join(timeout=2.0)  # the last lines are in the log before the tail is read
        server = spec.role is not Role.WORKER  # a server or a heter worker
        failure = Failure(
            role=spec.role.value,
            rank=spec.rank,
            pid=child.proc.pid,
            exit_code=exit_code,
            log_path=str(spec.log_path),
            tail=tuple(tail(spec.log_path, self.config.tail_lines)),
            note=(child.note or _exit_note(spec.role)) if server else "",
        )
        used = (
            f" (no restarts left: {self._coordinator.generation} of {self.config.max_restarts} used)"
            if spec.role is Role.WORKER and self.config.max_restarts
            else ""
        )
        log.error(
            "%s (pid %d) %s%s%s: stopping the job",
            spec.name,
            child.proc.pid,
            failure.how(),
            f" {failure.note}" if server else "",
            used,
        )
        self._coordinator.report_failure(
            f"{spec.name} on {self.node or 'another node'} {failure.how()}"
            f"{f' {failure.note}' if server else ''}; see {spec.log_path} there"
        )
        return Outcome(_exit_status(exit_code) or 1, "failed", failure)

    def _stop_servers(self) -> None:
        """Stop the servers (their stop op) and the heter workers (SIGTERM: they exit 0)."""
        for child in self._children.running:
            if child.spec.role is Role.HETER_WORKER and child.proc.poll() is None:
                child.proc.terminate()
        servers = [
            c
            for c in self._children.running
            if c.spec.role is not Role.WORKER and c.proc.poll() is None and not self._is_retired(c)
        ]
        if not servers:
            return
        if self.stop_servers is not None:
            try:
                self.stop_servers()
            except Exception as exc:  # the SIGTERM fallback below still stops them
                log.warning("stop request to the servers failed (%s); sending SIGTERM", exc)
        deadline = time.monotonic() + self.config.server_stop_s
        for child in servers:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("server %d still running after the stop request", child.spec.rank)

    def _warn_quiet(self) -> None:
        for child, quiet in self._children.newly_quiet(self.config.quiet_warn_s):
            log.warning(
                "%s (pid %d) has produced no output for %.0f s (--quiet-warn-s)",
                child.spec.name,
                child.proc.pid,
                quiet,
            )
