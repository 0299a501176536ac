"""The parameter server: key routing, op handlers and the server process.

Start one with ``python -m sparseps.server --rank R --endpoints h:p,h:p``, from the
launcher's environment with :func:`run_from_env`, or in-process with :func:`serve`.
"""

from __future__ import annotations

from ..core.routing import dense_server_of, server_of
from .main import DEFAULT_THREADS, run_from_env, serve

__all__ = ["DEFAULT_THREADS", "dense_server_of", "run_from_env", "serve", "server_of"]
