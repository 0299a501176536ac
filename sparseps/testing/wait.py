"""Wait for a condition another thread or process brings about, against one deadline.

A test that sleeps a guessed time before it looks is slow where the machine is quick and
flaky where it is loaded. :func:`wait_until` polls a predicate instead and fails naming
what it waited for. Where the waited-for code can set a ``threading.Event``, wait on the
event; this is for conditions only polling can see (a file, a process, a server's stats).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float, what: str = "a condition", interval: float = 0.02
) -> T:
    """Call ``predicate`` every ``interval`` s until it returns a true value (returned);
    raise ``AssertionError`` naming ``what`` once ``timeout`` s have passed. The predicate
    may raise (an ``AssertionError`` that a process it waits on died, say): that ends the
    wait at once."""
    if timeout < 0 or interval <= 0:
        raise ValueError(f"timeout must be >= 0 and interval > 0, not {timeout} and {interval}")
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
