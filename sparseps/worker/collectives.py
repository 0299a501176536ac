"""Moved to :mod:`sparseps.core.collectives` (the checkpoint code below the worker uses it).

This alias stays only while ``sparseps/jobs`` and ``sparseps/online/driver.py``, which
other changes are editing now, still import the old path; import the new one.
"""

from ..core.collectives import (  # noqa: F401
    all_gather_arrays,
    all_reduce_sum,
    barrier,
    broadcast_array,
    world_size,
)

__all__ = ["all_gather_arrays", "all_reduce_sum", "barrier", "broadcast_array", "world_size"]
