"""Helpers for the transport-security tests: key folders and in-process servers."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from sparseps.rpc.client import PSClient
from sparseps.rpc.security import JobKeys, Security, write_job_keys
from sparseps.rpc.transport import free_port
from sparseps.server import serve


def job_security(folder: Path) -> Security:
    """Fresh job keys written to ``folder`` and loaded back (the path a job takes)."""
    write_job_keys(folder)
    return Security(JobKeys.load(folder))


@contextlib.contextmanager
def server(security: Security | None) -> Iterator[str]:
    """One in-process server (secure when ``security`` is given); yields its endpoint."""
    endpoint = f"127.0.0.1:{free_port()}"
    ready = threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(0, [endpoint]),
        kwargs={"ready": ready, "security": security, "threads": 1},
        daemon=True,
    )
    thread.start()
    assert ready.wait(20), "the server did not bind within 20 s"
    try:
        yield endpoint
    finally:
        with PSClient([endpoint], timeout=10, security=security) as client:
            client.stop_servers()
        thread.join(10)
        assert not thread.is_alive(), "the server did not stop"
