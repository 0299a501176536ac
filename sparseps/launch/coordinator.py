"""How the launchers of one job agree on "all workers are done" and "someone failed".

On one node the launcher knows everything itself (:class:`LocalCoordinator`). Across
nodes each launcher only sees its own share, so they meet at a small key-value store
(:class:`StoreCoordinator`, a ``torch.distributed.TCPStore``) hosted by the launcher on
the master host at ``ClusterSpec.control_endpoint``:

- ``workers_done``: a counter each launcher adds its finished workers to; a node with
  servers stops them once it reaches the job's worker count.
- ``failed``: the first failure, as one line; every launcher polls it and stops its share.
- ``done/<node>``: the hosting launcher keeps the store up until every node has said it
  finished, so nobody loses the store mid-shutdown. It gives up on a node whose
  ``alive/<node>`` heartbeat counter (bumped twice a second while it runs) has not
  moved for ``timeout_s``: that launcher is gone.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Protocol

from ..env import parse_endpoint
from ..errors import TimeoutError_, UnavailableError

__all__ = ["Coordinator", "LocalCoordinator", "StoreCoordinator"]

log = logging.getLogger(__name__)


class Coordinator(Protocol):
    """What the supervisor needs to know about the rest of the job."""

    def report_workers_done(self, count: int) -> None:
        """This node's ``count`` workers all exited 0."""

    def all_workers_done(self) -> bool:
        """Every worker of the job exited 0 (time to stop this node's servers)."""

    def report_failure(self, text: str) -> None:
        """Tell the other launchers that this node failed (one line)."""

    def remote_failure(self) -> str | None:
        """The failure another launcher reported, if any (cheap; called every poll)."""

    def close(self) -> None:
        """This node is finished; release the coordination resources."""


class LocalCoordinator:
    """The whole job runs under this launcher."""

    def __init__(self, worker_num: int) -> None:
        self.worker_num = worker_num
        self._done = 0

    def report_workers_done(self, count: int) -> None:
        self._done += count

    def all_workers_done(self) -> bool:
        return self._done >= self.worker_num

    def report_failure(self, text: str) -> None:
        pass  # nobody else to tell

    def remote_failure(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class StoreCoordinator:
    """Launchers on several nodes, meeting at a TCPStore on the master host.

    Args:
        endpoint: ``host:port`` of the store (``ClusterSpec.control_endpoint``).
        host_it: True on the launcher that hosts the store.
        node: this launcher's host (names its heartbeat).
        peers: every launcher's host, this one included.
        job_id: prefixes the keys, so a stale store of another job cannot confuse this one.
        worker_num: number of workers in the job.
        timeout_s: how long to wait for the store to come up, and how long a silent
            launcher is waited for before the hosting launcher closes the store.

    Raises:
        UnavailableError: the hosting launcher cannot listen on the endpoint.
        TimeoutError_: no store answered at the endpoint within ``timeout_s``.
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
    ) -> None:
        import torch.distributed as dist  # heavy; only multi-node launches need it

        self.endpoint = endpoint
        self.host_it = host_it
        self.node = node
        self.peers = peers
        self.worker_num = worker_num
        self.timeout_s = timeout_s
        self._prefix = f"{job_id}/"
        self._reported_failure = False
        self._last_poll = 0.0
        host, port = parse_endpoint(endpoint, what="control endpoint")
        try:
            self._store = dist.TCPStore(
                host,
                port,
                is_master=host_it,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        except Exception as exc:  # torch raises DistNetworkError / RuntimeError
            if host_it:
                raise UnavailableError(
                    f"launcher control store: cannot listen on {endpoint} ({exc}); the port "
                    f"is --master's port + 1, choose another --master port",
                    op="launch",
                    role="launcher",
                    address=endpoint,
                ) from None
            raise TimeoutError_(
                f"launcher control store: no launcher answered at {endpoint} within "
                f"{timeout_s:.0f} s ({exc}); start the launcher on the master host "
                f"({host}) too, or raise --rendezvous-timeout-s",
                op="launch",
                role="launcher",
                address=endpoint,
                seconds=timeout_s,
                setting="--rendezvous-timeout-s",
            ) from None

    def _key(self, name: str) -> str:
        return self._prefix + name

    def report_workers_done(self, count: int) -> None:
        self._store.add(self._key("workers_done"), count)

    def all_workers_done(self) -> bool:
        try:
            return self._store.add(self._key("workers_done"), 0) >= self.worker_num
        except Exception:  # store gone: remote_failure() reports it
            return False

    def report_failure(self, text: str) -> None:
        self._reported_failure = True
        try:
            if not self._store.check([self._key("failed")]):
                self._store.set(self._key("failed"), text)
        except Exception as exc:
            log.warning("could not tell the other launchers about the failure: %s", exc)

    def remote_failure(self) -> str | None:
        """The failure another launcher reported (polled at most twice a second).

        Each poll also bumps this node's heartbeat.
        """
        now = time.monotonic()
        if self._reported_failure or now - self._last_poll < 0.5:
            return None
        self._last_poll = now
        try:
            self._store.add(self._key(f"alive/{self.node}"), 1)
            if self._store.check([self._key("failed")]):
                return self._store.get(self._key("failed")).decode("utf-8", errors="replace")
        except Exception as exc:
            return f"lost contact with the launcher control store at {self.endpoint}: {exc}"
        return None

    def close(self) -> None:
        """Say this node finished; the host then waits until every node has (see module doc)."""
        try:
            self._store.set(self._key(f"done/{self.node}"), "1")
            if self.host_it:
                self._wait_for_peers()
        except Exception as exc:
            log.warning("launcher control store: %s", exc)

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
