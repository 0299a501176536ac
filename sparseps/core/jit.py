"""``njit`` for sparseps' kernels: numba's, with each cached kernel compiled once per machine.

A kernel with ``cache=True`` is compiled on its first call with new argument types and
saved to numba's cache; later processes load it (milliseconds). But processes that start
together with a cold cache (a job's servers and workers on a fresh checkout, the test
suite's first jobs) all miss the cache at once and each compiles the same kernels: on 2
cores a cold 2-server, 2-worker job spent 50 CPU-s (35 of them compiling) against 15
warm, and the suite's first test file 465 CPU-s against 190.

Here a cached kernel's compile runs under an exclusive file lock per kernel (``flock``,
released by the kernel's end or the process's death): the first process compiles and
saves, the others wait, then find the kernel in the cache and load it (numba looks in the
cache first, under the lock). The cold job above: 32 CPU-s; the test file: 254.

Locks are taken after numba's own compiler lock, which every compile in a process
holds: one thread per process is ever inside, nested compiles (a kernel typing a kernel
it calls) re-enter their own locks, and since kernels never call each other in a cycle,
processes cannot wait on each other in one. Without ``fcntl`` or a writable lock folder
a kernel compiles as numba alone would.

:func:`load_cached_kernels` loads, ahead of their first call, every overload of this
process's cached kernels that the cache holds: the fork server (``sparseps.launch``) runs
it before each fork, so a forked server or worker starts with the kernels loaded instead
of loading them one by one on first use (about 0.7 CPU-s for a server's).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numba
from numba.core.compiler_lock import global_compiler_lock

try:
    import fcntl
except ImportError:  # not POSIX: no locks
    fcntl = None  # type: ignore[assignment]

__all__ = ["load_cached_kernels", "njit"]

log = logging.getLogger(__name__)

_LOCKS = Path(tempfile.gettempdir()) / f"sparseps-jit-locks-{os.getuid()}"
_held: dict[str, list[int]] = {}  # lock name -> [fd, depth]; guarded by numba's lock
_cached_kernels: list[Any] = []  # every dispatcher made with cache=True, for the preload


def njit(**options: Any) -> Callable[[Callable], Any]:
    """``numba.njit(**options)`` as a decorator; with ``cache=True`` the kernel's compiles
    are serialised across processes (module docstring)."""

    def decorate(function: Callable) -> Any:
        dispatcher = numba.njit(**options)(function)
        if options.get("cache") and fcntl is not None:
            compile_unlocked = dispatcher.compile
            name = _lock_name(function)

            def compile(signature):
                with global_compiler_lock, _locked(name):
                    return compile_unlocked(signature)

            # numba calls self.compile on a cache miss of its in-memory overloads
            dispatcher.compile = compile
        if options.get("cache"):
            _cached_kernels.append(dispatcher)
        return dispatcher

    return decorate


def load_cached_kernels() -> int:
    """Load every overload of the cached kernels defined so far that numba's cache holds
    for this machine and source and that is not loaded yet; returns how many were loaded.

    Only what is a cache hit is loaded, never compiled: a kernel the cache lacks compiles
    on its first call as before. Best effort: the cache index is numba's own format
    (its ``FunctionCache``, numba pinned in constraints.txt); anything unexpected skips
    the kernel.
    """
    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    loaded = 0
    for dispatcher in _cached_kernels:
        try:
            cache = vars(dispatcher)["_cache"]  # numba's FunctionCache; no public accessor
            for key in cache._cache_file._load_index():
                signature = key[0]
                if signature in dispatcher.overloads or cache._index_key(signature, codegen) != key:
                    continue  # loaded already, or another machine's or source's overload
                dispatcher.compile(signature)  # a hit: numba loads it from the cache
                loaded += 1
        except Exception as exc:  # noqa: BLE001 - an optimisation: the first call loads it
            log.debug("kernel %s not preloaded: %s", dispatcher.py_func.__qualname__, exc)
    return loaded


def _lock_name(function: Callable) -> str:
    where = f"{function.__code__.co_filename}:{function.__qualname__}"
    return hashlib.sha1(where.encode()).hexdigest()


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` (re-entrant in this process)."""
    held = _held.get(name)
    if held is not None:
        held[1] += 1
    else:
        try:
            _LOCKS.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(_LOCKS / name, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # no lock: compile as numba alone would
            log.debug("kernel compile lock %s unavailable (%s)", _LOCKS / name, exc)
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = _held[name] = [fd, 1]
    try:
        yield
    finally:
        held[1] -= 1
        if held[1] == 0:
            del _held[name]
            os.close(held[0])  # closing the last descriptor releases the flock
