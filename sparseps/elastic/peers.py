"""One connection per server address, for the elastic client and the migration driver.

An elastic job's server list grows and shrinks, while a :class:`PSClient`'s is fixed:
each address gets a one-server client, and requests are routed here by placement (the
servers check it: :mod:`sparseps.server.elastic_ops`).
"""

from __future__ import annotations

import threading

import numpy as np

from ..core.closing import Closing
from ..core.placement import Placement
from ..errors import SparsePSError
from ..rpc.client import PSClient
from ..rpc.handle import Handle  # noqa: TC001 - the return annotation
from ..rpc.placed import is_placement_error

__all__ = ["Peers", "is_placement_error"]


class Peers(Closing):
    """``address -> PSClient([address])``, opened on first use; ``close()`` closes all."""

    def __init__(self, *, timeout: float = 30.0, job_id: str | None = None,
                 security=None) -> None:  # fmt: skip
        self.timeout = timeout
        self.job_id = job_id
        self.security = security
        self._clients: dict[str, PSClient] = {}
        self._lock = threading.Lock()

    def client(self, endpoint: str) -> PSClient:
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
        return self.client(endpoint).request(0, op, table, bufs, args)

    def call(self, endpoint: str, op: str, table: str | None = None, bufs=(),
             args: dict | None = None, timeout: float | None = None):  # fmt: skip
        return self.submit(endpoint, op, table, bufs, args).wait(timeout)

    def placement(self, endpoint: str) -> tuple[Placement | None, dict]:
        """The placement a server holds (None before any) and its tables' configs."""
        result, bufs = self.call(endpoint, "get_placement")
        if not result["version"]:
            return None, result["tables"]
        return Placement.from_wire(result, bufs[0]), result["tables"]

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
        return best

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
