"""``with obj:`` closes what holds files, sockets or threads (sparseps.core.closing),
also when the block raises; shown on a tiered table, whose close deletes its disk file."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sparseps.config import TableConfig
from sparseps.core.closing import Closing
from sparseps.optim import Adagrad
from sparseps.table import SparseTable


class _Counted(Closing):
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_the_block_gets_the_object_and_its_end_closes_it_once():
    with _Counted() as thing:
        assert thing.closed == 0
    assert thing.closed == 1


def test_an_exception_in_the_block_still_closes_and_propagates():
    thing = _Counted()
    with pytest.raises(KeyError), thing:
        raise KeyError("inside")
    assert thing.closed == 1


def test_a_tiered_table_in_a_with_block_deletes_its_disk_file_at_the_end(tmp_path):
    config = TableConfig(name="t", dim=4, rule=Adagrad(lr=0.1), memory_rows=8)
    keys = np.arange(1, 201, dtype=np.uint64)
    with pytest.raises(RuntimeError), SparseTable(config, disk_dir=str(tmp_path)) as table:
        table.push(keys, np.ones((keys.size, 4), np.float32))
        path = table.disk_path
        assert path is not None and os.path.exists(path)
        raise RuntimeError("training failed")
    assert not os.path.exists(path)
