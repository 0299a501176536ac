"""The connections of the migration driver (and of tools) to an elastic job's servers.

An elastic job's server list grows and shrinks, while a :class:`PSClient`'s is fixed, and
the driver sends raw ops to one server at a time. :class:`Peers` keeps one channel to the
job's servers **in rank order** (learned from the placements it reads or is given:
:meth:`Peers.learn`), so that an error names the server it is about by its rank in the
job and its address. The channel notices a dropped connection (``detect_loss``, as a
replicated job's clients do): a server that dies while the driver waits for it, or
before a call to it, fails that call at once with an
:class:`~sparseps.errors.UnavailableError` instead of after the timeout. A lost server
stays lost for this ``Peers``: a new one (each ``sparseps scale`` makes its own)
connects again.

An address called before any placement named it (its rank is not known yet) gets a
connection of its own, where it is rank 0.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from .. import env
from ..core.closing import Closing
from ..core.placement import Placement
from ..errors import InputError, SparsePSError
from ..rpc.channel import Channel
from ..rpc.client import DEFAULT_MAX_IN_FLIGHT, PSClient
from ..rpc.handle import Handle
from ..rpc.protocol import Limits
from ..rpc.security import security_from_env
from .routing import is_placement_error

__all__ = ["Peers", "is_placement_error"]


def _answer(replies: list) -> tuple:
    return replies[0].result, replies[0].bufs


class Peers(Closing):
    """Raw ops to an elastic job's servers by address; ``close()`` closes every connection.

    Args:
        timeout: seconds a call waits for its answer (a dropped connection fails it at once).
        job_id: the job's id, if its servers check one (default ``SPARSEPS_JOB_ID``).
        security: the job's CURVE keys (default: from the environment, as ``PSClient``).
        endpoints: the job's servers in rank order, if known (else learned from the first
            placement read or installed).
    """

    def __init__(self, *, timeout: float = 30.0, job_id: str | None = None, security=None,
                 endpoints: Sequence[str] | None = None) -> None:  # fmt: skip
        self.timeout = timeout
        self.job_id = job_id if job_id is not None else env.job_id_setting()
        self.security = security if security is not None else security_from_env()
        self._ranked: Channel | None = None  # the job's servers, index = rank
        self._unranked: dict[str, Channel] = {}  # addresses whose rank is not known yet
        self._clients: dict[str, PSClient] = {}
        self._lock = threading.Lock()
        if endpoints is not None:
            self.learn(endpoints)

    def _channel(self, endpoints: Sequence[str]) -> Channel:
        return Channel(
            list(endpoints), timeout=self.timeout, timeout_setting="Peers(timeout=...)",
            max_in_flight=DEFAULT_MAX_IN_FLIGHT, limits=Limits(), security=self.security,
            job_id=self.job_id, detect_loss=True,
        )  # fmt: skip

    def learn(self, endpoints: Sequence[str]) -> None:
        """The job's servers in rank order (a placement's ``endpoints``): calls to them go
        over the ranked channel, whose errors name each by its rank.

        Raises:
            InputError: ``endpoints`` disagree with those learned before (another job's).
        """
        endpoints = [str(e) for e in endpoints]
        with self._lock:
            ranked = self._ranked
            if ranked is None:
                self._ranked = self._channel(endpoints)
                return
            known = list(ranked.endpoints)
            common = min(len(known), len(endpoints))
            if known[:common] != endpoints[:common]:
                rank = next(r for r in range(common) if known[r] != endpoints[r])
                raise InputError(
                    f"Peers: server {rank} is {endpoints[rank]} in {endpoints}, but "
                    f"{known[rank]} in the endpoints learned before ({known}); a job's "
                    "servers keep their ranks (use one Peers per job)"
                )
        if len(endpoints) > len(known):
            ranked.grow(endpoints)  # new servers of the job: the next ranks

    def _route(self, endpoint: str) -> tuple[Channel, int]:
        with self._lock:
            ranked = self._ranked
            if ranked is not None and endpoint in ranked.endpoints:
                return ranked, ranked.endpoints.index(endpoint)
            found = self._unranked.get(endpoint)
            if found is None:
                found = self._unranked[endpoint] = self._channel([endpoint])
            return found, 0

    def client(self, endpoint: str) -> PSClient:
        """A one-server :class:`PSClient` of ``endpoint`` for table calls (tools, tests)."""
        with self._lock:
            found = self._clients.get(endpoint)
            if found is None:
                found = PSClient([endpoint], timeout=self.timeout, job_id=self.job_id,
                                 security=self.security, follow_placement=False)  # fmt: skip
                self._clients[endpoint] = found
            return found

    def submit(self, endpoint: str, op: str, table: str | None = None, bufs=(),
               args: dict | None = None) -> Handle:  # fmt: skip
        """Send one raw op; ``wait()`` -> ``(result, bufs)``."""
        channel, rank = self._route(endpoint)
        return Handle(channel, [channel.submit(rank, op, table, tuple(bufs), args)], _answer)

    def call(self, endpoint: str, op: str, table: str | None = None, bufs=(),
             args: dict | None = None, timeout: float | None = None):  # fmt: skip
        return self.submit(endpoint, op, table, bufs, args).wait(timeout)

    def placement(self, endpoint: str) -> tuple[Placement | None, dict]:
        """The placement a server holds (None before any) and its tables' configs."""
        result, bufs = self.call(endpoint, "get_placement")
        if not result["version"]:
            return None, result["tables"]
        placement = Placement.from_wire(result, bufs[0])
        self.learn(placement.endpoints)
        return placement, result["tables"]

    def newest(self, endpoints, timeout: float | None = None) -> Placement | None:
        """The newest placement any of ``endpoints`` holds (asked in parallel). A server
        that does not answer (stopped after a drain) is skipped while another answers.

        Raises:
            SparsePSError: no server answered (the first server's error).
        """
        handles = [self.submit(e, "get_placement") for e in endpoints]
        best, answered, first_error = None, False, None
        for handle in handles:
            try:
                result, bufs = handle.wait(timeout)
            except SparsePSError as exc:
                first_error = first_error or exc
                continue
            answered = True
            if result["version"] and (best is None or result["version"] > best.version):
                best = Placement.from_wire(result, np.array(bufs[0]))
        if not answered and first_error is not None:
            raise first_error
        if best is not None:
            self.learn(best.endpoints)
        return best

    def close(self) -> None:
        with self._lock:
            channels = [*self._unranked.values(), *([self._ranked] if self._ranked else [])]
            clients = list(self._clients.values())
            self._ranked, self._unranked, self._clients = None, {}, {}
        for client in clients:
            client.close()
        for channel in channels:
            channel.close()
