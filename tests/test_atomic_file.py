"""``sparseps.core.atomic_file``: a write replaces its target whole or not at all, and a
failed write (a full disk) leaves no partial temporary behind taking the disk's space."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from sparseps.core.atomic_file import replaced_atomically, temporary_name
from sparseps.errors import CheckpointError
from sparseps.files import shards
from sparseps.files.dense_file import load_dense_file, save_dense_file


def _disk_full(path, written: bytes = b"x" * 4096):
    """Write a part of a file, then fail as a full disk does."""
    with open(path, "wb") as f:
        f.write(written)
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("sync", [False, True])
def test_a_write_replaces_the_target_whole(tmp_path, sync):
    target = tmp_path / "state.json"
    target.write_text("old")
    with replaced_atomically(target, sync=sync) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".state.json.tmp-")
        tmp.write_text("new")
        assert target.read_text() == "old"  # readers see the old file until the end
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_write_keeps_the_target_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(OSError) as info, replaced_atomically(target) as tmp:
        _disk_full(tmp)
    assert info.value.errno == errno.ENOSPC  # the error goes on, unchanged
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert not temporary_name(target).exists()


def test_a_shard_that_fills_the_disk_leaves_no_partial_file(tmp_path, monkeypatch):
    """The server-side writer of checkpoints (a 2 MB partial shard was left in the staging
    folder of a save that hit a full disk, keeping the disk full for the next try)."""
    columns = {"key": np.arange(10, dtype=np.uint64), "w": np.ones((10, 4), np.float32)}
    monkeypatch.setattr(shards.feather, "write_feather", lambda table, path, **_: _disk_full(path))
    with pytest.raises(CheckpointError, match="No space left") as info:
        shards.write_shard(tmp_path, "emb.shard-00000-of-00001.arrow", columns, {"kind": "rows"})
    assert list(tmp_path.iterdir()) == []
    # what, where and how to fix it
    assert f"cannot write {tmp_path / 'emb.shard-00000-of-00001.arrow'}" in str(info.value)
    assert "the disk is full: free space there, or save to another folder" in str(info.value)
    monkeypatch.undo()  # with room on the disk the same write succeeds
    record = shards.write_shard(tmp_path, "emb.shard-00000-of-00001.arrow", columns, {})
    assert record["rows"] == 10 and [p.name for p in tmp_path.iterdir()] == [record["name"]]


def test_a_dense_file_that_fills_the_disk_leaves_no_partial_file(tmp_path, monkeypatch):
    arrays = {"values": np.arange(6, dtype=np.float32)}
    save_dense_file(tmp_path, arrays)
    monkeypatch.setattr(np, "savez", lambda f, **_: _disk_full(f.name))
    with pytest.raises(OSError, match="No space left"):
        save_dense_file(tmp_path, {"values": np.zeros(6, np.float32)})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["dense.npz"]
    np.testing.assert_array_equal(
        load_dense_file(tmp_path / "dense.npz")["values"], arrays["values"]
    )
