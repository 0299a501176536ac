"""Observability: Prometheus metrics of every role, the job status page, hang diagnosis.

- :mod:`~sparseps.observe.registry`: the metric families of servers, workers and the
  launcher (one registry per process) and the HTTP endpoint serving them.
- :mod:`~sparseps.observe.child`: how the launcher starts every role (stack dumps on
  ``SIGUSR1``, ``/metrics`` on the role's port), then runs the user's script.
- :mod:`~sparseps.observe.stacks` and :mod:`~sparseps.observe.diagnose`: the stack dumps
  and ``sparseps diagnose LOG_DIR`` (who waits on whom).
- :mod:`~sparseps.observe.status`: the status page the launcher serves (``--status-port``).

Nothing starts at import time. See docs/observability.md.
"""

from __future__ import annotations

__all__: list[str] = []
