"""Moved to :mod:`sparseps.core.collectives` (the checkpoint code below the worker uses it).

This alias stays only while ``sparseps/jobs/wide_deep_job.py``, which another change is
editing now, still imports the old path; import the new one. Remove it once jobs/ moves.
"""

from ..core.collectives import (  # noqa: F401
    all_gather_arrays,
    all_reduce_sum,
    barrier,
    broadcast_array,
    world_size,
)

__all__ = ["all_gather_arrays", "all_reduce_sum", "barrier", "broadcast_array", "world_size"]
