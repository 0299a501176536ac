"""The workers' rendezvous store, for the layers below :mod:`sparseps.role` that need it.

:func:`sparseps.init` connects a worker of a job of several workers to the store worker 0
hosts (``SPARSEPS_MASTER``) and registers it here; stopping the role unregisters it. Data
(a work-stealing dataset claims files with the store's atomic ``add``) reads it from here,
so it need not import the role layer above it. None: no job of several workers (local
mode, a server, before init).
"""

from __future__ import annotations

import threading

__all__ = ["current", "register"]

_lock = threading.Lock()
_store = None


def register(store) -> None:
    """Set (a ``torch.distributed.Store``) or clear (None) the job's worker store."""
    global _store
    with _lock:
        _store = store


def current():
    """The registered worker store, or None."""
    with _lock:
        return _store
