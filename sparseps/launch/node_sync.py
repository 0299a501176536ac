"""How the launchers of one job agree on "all workers are done" and "someone failed".

On one node the launcher knows everything itself (:class:`LocalCoordinator`). Across
nodes each launcher only sees its own share, so they meet at a small key-value store
(:class:`StoreCoordinator`, a :class:`~sparseps.store.client.StoreClient`) hosted by the
launcher on the master host at ``ClusterSpec.control_endpoint``, bound to that address
only and CURVE-secured when the job is:

- ``workers_done/<g>``: a counter each launcher adds its finished workers of worker-group
  generation ``g`` to; a node with servers stops them once it reaches the job's worker
  count (and no generation ``g + 1`` was asked for).
- ``failed``: the first failure, as one line; every launcher polls it and stops its share.
- ``restart/<g>``: a launcher whose worker failed with restarts left asks for generation
  ``g`` of the worker group (the value says why). Every launcher stops its workers, sets
  ``stopped/<g>/<node>``, and starts generation ``g`` only once every node that runs
  workers has: no worker of the new generation can meet one of the old (gloo cannot
  re-form around a survivor), and worker 0 can bind the rendezvous port again.
- ``done/<node>``: the hosting launcher keeps the store up until every node has said it
  finished, so nobody loses the store mid-shutdown. It gives up on a node whose
  ``alive/<node>`` heartbeat counter (bumped twice a second while it runs) has not
  moved for ``timeout_s``: that launcher is gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from ..core.closing import Closing
from ..env import parse_endpoint
from ..errors import DeadlineError, UnavailableError
from ..store.client import StoreClient, open_store

__all__ = ["Coordinator", "LocalCoordinator", "StoreCoordinator"]

log = logging.getLogger(__name__)


class Coordinator(Protocol):
    """What the supervisor needs to know about the rest of the job.

    ``generation`` is the worker group's restart generation this node runs (0 = the
    first start); :meth:`restart` moves to the next one.
    """

    generation: int

    def report_workers_done(self, count: int) -> None:
        """This node's ``count`` workers all exited 0."""

    def all_workers_done(self) -> bool:
        """Every worker of the job exited 0 (time to stop this node's servers)."""

    def report_failure(self, text: str) -> None:
        """Tell the other launchers that this node failed (one line)."""

    def remote_failure(self) -> str | None:
        """The failure another launcher reported, if any (cheap; called every poll)."""

    def remote_restart(self) -> str | None:
        """Why another launcher asked for the next worker generation, if it did (polled)."""

    def restart(self, reason: str | None, *, cancelled: Callable[[], bool] = bool) -> None:
        """Move to the next worker generation; this node's workers are already stopped.

        Args:
            reason: this node asks for the restart (one line: which worker failed), or
                None when it follows another launcher's request.
            cancelled: polled while waiting for the other nodes; True gives up (e.g. the
                launcher received SIGTERM).

        Raises:
            DeadlineError: a node with workers did not stop them in time.
            UnavailableError: another launcher failed meanwhile, the store is gone, or
                the wait was cancelled.
        """

    def close(self) -> None:
        """This node is finished; release the coordination resources."""


class LocalCoordinator(Closing):
    """The whole job runs under this launcher."""

    def __init__(self, worker_num: int) -> None:
        self.worker_num = worker_num
        self.generation = 0
        self._done = 0

    def report_workers_done(self, count: int) -> None:
        self._done += count

    def all_workers_done(self) -> bool:
        return self._done >= self.worker_num

    def report_failure(self, text: str) -> None:
        pass  # nobody else to tell

    def remote_failure(self) -> str | None:
        return None

    def remote_restart(self) -> str | None:
        return None

    def restart(self, reason: str | None, *, cancelled: Callable[[], bool] = bool) -> None:  # noqa: ARG002 - nobody else to tell or wait for
        self.generation += 1
        self._done = 0

    def close(self) -> None:
        pass


class StoreCoordinator(Closing):
    """Launchers on several nodes, meeting at a store on the master host.

    Args:
        endpoint: ``host:port`` of the store (``ClusterSpec.control_endpoint``).
        host_it: True on the launcher that hosts the store.
        node: this launcher's host (names its heartbeat).
        peers: every launcher's host, this one included.
        job_id: prefixes the keys, so a stale store of another job cannot confuse this one.
        worker_num: number of workers in the job.
        timeout_s: how long to wait for the store to come up, for every node to stop its
            workers before a restart, and for a silent launcher before the hosting
            launcher closes the store.
        worker_nodes: the hosts that run workers (default: every peer).
        security: the job's :class:`~sparseps.rpc.security.Security` (CURVE with the job
            key on the store and on every launcher's connection); None = plain TCP.

    Raises:
        UnavailableError: the hosting launcher cannot listen on the endpoint; the CURVE
            handshake with the store failed (this launcher lacks the job key).
        DeadlineError: no store answered at the endpoint within ``timeout_s``.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        host_it: bool,
        node: str,
        peers: tuple[str, ...],
        job_id: str,
        worker_num: int,
        timeout_s: float,
        worker_nodes: tuple[str, ...] | None = None,
        security=None,
    ) -> None:
        self.endpoint = endpoint
        self.host_it = host_it
        self.node = node
        self.peers = peers
        self.worker_nodes = tuple(peers if worker_nodes is None else worker_nodes)
        self.worker_num = worker_num
        self.timeout_s = timeout_s
        self.generation = 0
        self._prefix = f"{job_id}/"
        self._reported_failure = False
        self._last_poll = 0.0
        self._failure: str | None = None
        self._restart: str | None = None
        self._closed = False
        host, port = parse_endpoint(endpoint, what="control endpoint")
        self._store = open_store(
            endpoint,
            serve=(host, port) if host_it else None,
            timeout_s=timeout_s,
            setting="--rendezvous-timeout-s",
            what="launcher control store",
            client=StoreClient,
            security=security,
            cannot_listen=lambda exc: UnavailableError(
                f"launcher control store: cannot listen on {endpoint} ({exc}); the port "
                f"is --master's port + 1, choose another --master port",
                op="launch",
                role="launcher",
                address=endpoint,
            ),
            no_answer=lambda exc: DeadlineError(
                f"launcher control store: no launcher answered at {endpoint} within "
                f"{timeout_s:.0f} s ({exc}); start the launcher on the master host "
                f"({host}) too, or raise --rendezvous-timeout-s",
                op="launch",
                role="launcher",
                address=endpoint,
                seconds=timeout_s,
                setting="--rendezvous-timeout-s",
            ),
        )

    def _key(self, name: str) -> str:
        return self._prefix + name

    def _text(self, name: str) -> str:
        return self._store.get(self._key(name)).decode("utf-8", errors="replace")

    def report_workers_done(self, count: int) -> None:
        self._store.add(self._key(f"workers_done/{self.generation}"), count)

    def all_workers_done(self) -> bool:
        try:
            if self._store.check([self._key(f"restart/{self.generation + 1}")]):
                return False  # a new generation was asked for: its workers have work to do
            done = self._store.add(self._key(f"workers_done/{self.generation}"), 0)
            return done >= self.worker_num
        except Exception:  # store gone: remote_failure() reports it
            return False

    def report_failure(self, text: str) -> None:
        self._reported_failure = True
        try:
            if not self._store.check([self._key("failed")]):
                self._store.set(self._key("failed"), text)
        except Exception as exc:
            log.warning("could not tell the other launchers about the failure: %s", exc)

    def _poll(self) -> None:
        """Look at the store at most twice a second; each look bumps this node's heartbeat."""
        now = time.monotonic()
        if self._reported_failure or now - self._last_poll < 0.5:
            return
        self._last_poll = now
        try:
            self._store.add(self._key(f"alive/{self.node}"), 1)
            if self._store.check([self._key("failed")]):
                self._failure = self._text("failed")
            elif self._store.check([self._key(f"restart/{self.generation + 1}")]):
                self._restart = self._text(f"restart/{self.generation + 1}")
        except Exception as exc:
            self._failure = (
                f"lost contact with the launcher control store at {self.endpoint}: {exc}"
            )

    def remote_failure(self) -> str | None:
        """The failure another launcher reported (polled at most twice a second)."""
        self._poll()
        return None if self._reported_failure else self._failure

    def remote_restart(self) -> str | None:
        """Why another launcher asked for the next worker generation (polled as above)."""
        self._poll()
        return self._restart

    def restart(self, reason: str | None, *, cancelled: Callable[[], bool] = bool) -> None:
        """Ask for (or follow) generation + 1, say this node stopped its workers, and wait
        until every node with workers has (see the module doc and :class:`Coordinator`)."""
        target = self.generation + 1
        deadline = time.monotonic() + self.timeout_s
        keys = {n: self._key(f"stopped/{target}/{n}") for n in self.worker_nodes}
        problem: Exception | None = None
        try:
            if reason is not None and not self._store.check([self._key(f"restart/{target}")]):
                self._store.set(self._key(f"restart/{target}"), reason)
            self._store.set(self._key(f"stopped/{target}/{self.node}"), "1")
            while not self._store.check(list(keys.values())):
                problem = self._restart_problem(target, keys, deadline, cancelled)
                if problem is not None:
                    break
                self._store.add(self._key(f"alive/{self.node}"), 1)
                time.sleep(0.1)
        except Exception as exc:  # a store error: the hosting launcher is gone or silent
            raise UnavailableError(
                f"worker restart {target}: lost the launcher control store at "
                f"{self.endpoint} ({exc})",
                op="restart",
                role="launcher",
                address=self.endpoint,
            ) from None
        if problem is not None:
            raise problem
        self.generation = target
        self._restart = None

    def _restart_problem(
        self, target: int, keys: dict[str, str], deadline: float, cancelled: Callable[[], bool]
    ) -> Exception | None:
        """Why the wait for restart ``target`` must end now, if it must (store errors raise)."""
        if self._store.check([self._key("failed")]):
            return UnavailableError(
                f"worker restart {target} abandoned: another launcher reported: "
                f"{self._text('failed')}",
                op="restart",
                role="launcher",
                address=self.endpoint,
            )
        if cancelled():
            return UnavailableError(
                f"worker restart {target} cancelled while waiting for the other launchers",
                op="restart",
                role="launcher",
                address=self.endpoint,
            )
        if time.monotonic() > deadline:
            late = [n for n, k in keys.items() if not self._store.check([k])]
            return DeadlineError(
                f"worker restart {target}: the launchers on {', '.join(late)} did not "
                f"stop their workers within {self.timeout_s:.0f} s; check that they "
                f"run, or raise --rendezvous-timeout-s",
                op="restart",
                role="launcher",
                address=self.endpoint,
                seconds=self.timeout_s,
                setting="--rendezvous-timeout-s",
            )
        return None

    def close(self) -> None:
        """Say this node finished; the host then waits until every node has (see module doc)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._store.set(self._key(f"done/{self.node}"), "1")
            if self.host_it:
                self._wait_for_peers()
        except Exception as exc:
            log.warning("launcher control store: %s", exc)
        finally:
            self._store.close()  # the host's closes the server too

    def _wait_for_peers(self) -> None:
        now = time.monotonic()
        pending = {node: (-1, now) for node in self.peers if node != self.node}
        while pending:
            now = time.monotonic()
            for node, (count, since) in list(pending.items()):
                if self._store.check([self._key(f"done/{node}")]):
                    del pending[node]
                    continue
                beat = self._store.add(self._key(f"alive/{node}"), 0)
                if beat != count:
                    pending[node] = (beat, now)
                elif now - since > self.timeout_s:
                    log.warning(
                        "closing the control store: the launcher on %s has been silent for "
                        "%.0f s (--rendezvous-timeout-s)",
                        node,
                        now - since,
                    )
                    return
            time.sleep(0.2)
