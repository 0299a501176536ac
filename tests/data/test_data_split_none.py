"""``split="none"``: every worker reads every file, as a Paddle job does when it does not
split its file list with ``fleet.util.get_file_shard`` (PaddleRec's
``split_file_list: False``) (issue 58)."""

from __future__ import annotations

import pytest
from test_data_datasets import write_files  # the test folder is on sys.path

from sparseps.data import CRITEO, InMemoryDataset, QueueDataset
from sparseps.data.schema import ID_FILE_SHIFT
from sparseps.errors import ConfigError


def test_every_worker_reads_every_file_once_per_pass(tmp_path):
    files = write_files(tmp_path / "d", [3, 4, 5])
    every = [(f << ID_FILE_SHIFT) | r for f, rows in enumerate([3, 4, 5]) for r in range(rows)]
    for rank in range(2):
        ds = QueueDataset(str(tmp_path / "d"), CRITEO, 4, rank=rank, world=2, split="none")
        assert ds.files == files
        assert sorted(i for b in ds for i in b.ids.tolist()) == every
        assert ds.stats().files == 3 and ds.stats().rows == 12
        static = QueueDataset(str(tmp_path / "d"), CRITEO, 4, rank=rank, world=2)
        assert static.files == files[rank::2]  # the default still splits
    memory = InMemoryDataset(str(tmp_path / "d"), CRITEO, 4, rank=1, world=2, split="none")
    memory.load_into_memory()
    assert len(memory) == 12


def test_split_none_refuses_a_journal_and_a_bad_split_names_the_choices(tmp_path):
    write_files(tmp_path / "d", [2])
    with pytest.raises(ConfigError, match="journal: with split='none' every worker reads"):
        QueueDataset(str(tmp_path / "d"), CRITEO, 4, split="none", journal=str(tmp_path / "j"))
    with pytest.raises(ConfigError, match="split='all' is not one of static, steal, none"):
        QueueDataset(str(tmp_path / "d"), CRITEO, 4, split="all")
