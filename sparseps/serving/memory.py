"""What a service process holds in memory: ``GET /model``'s ``memory`` section.

The model's base rows are memory-mapped files (:mod:`sparseps.checkpoint.mapped_table`):
their pages are the page cache's, shared by every process that maps them, and only the
ones requests touch are resident. ``/proc/self/smaps`` tells, per mapping, how large it
is and how much of it is resident in this process; ``/proc/self/status`` the process's
whole resident set.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["memory_report"]


def memory_report(files: Iterable[Path]) -> dict[str, int]:
    """``{"rss_bytes", "mapped_bytes", "mapped_resident_bytes", "mapped_files"}``: this
    process's resident set, and of the mappings of ``files`` their size and resident
    part (all 0 where ``/proc`` is not there)."""
    wanted = {os.path.realpath(f) for f in files}
    mapped = resident = 0
    seen: set[str] = set()
    try:
        with open("/proc/self/smaps") as smaps:
            current = False
            for line in smaps:
                first = line.split(maxsplit=1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header
                    fields = line.split(maxsplit=5)
                    path = fields[5].strip() if len(fields) > 5 else ""
                    current = path in wanted
                    if current:
                        seen.add(path)
                elif current and first == "Size:":
                    mapped += int(line.split()[1]) << 10
                elif current and first == "Rss:":
                    resident += int(line.split()[1]) << 10
        rss = 0
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) << 10
    except OSError:
        return {"rss_bytes": 0, "mapped_bytes": 0, "mapped_resident_bytes": 0, "mapped_files": 0}
    return {
        "rss_bytes": rss,
        "mapped_bytes": mapped,
        "mapped_resident_bytes": resident,
        "mapped_files": len(seen),
    }
