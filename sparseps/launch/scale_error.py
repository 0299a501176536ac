"""The error of a ``sparseps scale`` request that cannot be done.

Its own module because three modules raise it and none of them should import another
for it: the launcher's server side (:mod:`sparseps.launch.scaling`), its worker side
(:mod:`sparseps.launch.worker_scaling`, which the server side builds on) and the command
(:mod:`sparseps.launch.scale_cli`). :mod:`sparseps.launch.scaling` re-exports it.
"""

from __future__ import annotations

from ..errors import SparsePSError

__all__ = ["ScaleError"]


class ScaleError(SparsePSError):
    """A scale request that cannot be done; the message says what, where and how to fix."""
