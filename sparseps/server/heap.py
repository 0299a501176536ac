"""Large freed arrays go back to the system at once, so a server's RSS follows its tables.

glibc's ``malloc`` serves blocks above its mmap threshold (128 KiB) with ``mmap`` and
returns them to the system on ``free``, but after the first such free it raises the
threshold to that block's size (up to 32 MiB): later arrays of that size (a request's
keys, rows and scratch) then come from the heap, and the heap keeps what they free.
Measured on a server process holding a tiered table of 2M rows (bench/tier.py): 20 MB of
freed scratch stayed resident after filling it. Fixing the threshold turns off that
adjustment. Servers with a disk dir call this: their memory budget is a promise.
"""

from __future__ import annotations

import ctypes

__all__ = ["return_large_frees"]

_M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
THRESHOLD_BYTES = 128 * 1024  # glibc's initial value


def return_large_frees(threshold: int = THRESHOLD_BYTES) -> bool:
    """Fix malloc's mmap threshold at ``threshold`` bytes; False where the C library has
    no ``mallopt`` (not glibc), where nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))
