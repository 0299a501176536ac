"""A table's row matrix asks for transparent huge pages when it grows (issue 59): a
server's batch reads rows scattered over the whole matrix, and with 4 KB pages nearly
every row is a TLB miss. The hint is Linux's; the test reads the mapping's flags."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.core.hashing import mix64_array
from sparseps.table import SparseTable

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/self/smaps").exists(),
    reason="transparent huge pages are a Linux hint",
)


def _flags_over(address: int, nbytes: int) -> list[set[str]]:
    """The VmFlags of every mapping that overlaps ``[address, address + nbytes)``."""
    flags, overlaps = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            low, high = (int(x, 16) for x in head[0].split("-"))
            overlaps = low < address + nbytes and high > address
        elif overlaps and head[0] == "VmFlags:":
            flags.append(set(head[1:]))
    return flags


def test_grown_row_matrix_is_advised_huge_pages() -> None:
    table = SparseTable(TableConfig(name="t", dim=8, rule=optim.Adagrad(lr=0.1), seed=1))
    keys = mix64_array(np.arange(200_000, dtype=np.uint64))  # 200k rows x 80 B: 16 MB
    table.push(keys, np.zeros((keys.size, 8), np.float32))
    rows = table._storage.rows  # noqa: SLF001 - the storage's own matrix is what is checked
    flags = _flags_over(rows.ctypes.data, rows.nbytes)
    assert flags, "the row matrix is in no mapping of /proc/self/smaps"
    # the page-aligned interior (all but the allocator's header page) carries "hg"
    advised = [f for f in flags if "hg" in f]
    assert advised, f"no mapping under the rows is advised MADV_HUGEPAGE: {flags}"
