"""Crash-safe folder swaps and the checkpoint layout check, without servers."""

from __future__ import annotations

import json

import pytest

import sparseps as sps
from sparseps.checkpoint import checkpoint as ck
from sparseps.checkpoint import staging
from sparseps.checkpoint.hooks import SaveHooks
from sparseps.errors import CheckpointError
from sparseps.files import manifest as mf


def _save(folder, value: str) -> None:
    (folder / "dense.npz").write_text(value)
    mf.write_manifest(
        folder, "sparseps-checkpoint", {"dense.npz": mf.file_record(folder / "dense.npz")}
    )


def _content(folder) -> str:
    mf.verify(folder)
    return (folder / "dense.npz").read_text()


def _hidden(parent) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("exchange", [True, False])
def test_commit_replaces_a_checkpoint_and_leaves_nothing_behind(tmp_path, exchange):
    target = tmp_path / "ckpt"
    first = staging.new_staging(target)
    _save(first, "old")
    staging.commit(first, target, exchange=exchange)
    second = staging.new_staging(target)
    _save(second, "new")
    assert _content(target) == "old"  # nothing changes at the path before the commit
    staging.commit(second, target, exchange=exchange)
    assert _content(target) == "new"
    assert _hidden(tmp_path) == []


def test_commit_refuses_a_folder_without_manifest(tmp_path):
    target = tmp_path / "ckpt"
    folder = staging.new_staging(target)
    (folder / "dense.npz").write_text("half")
    with pytest.raises(CheckpointError, match="MANIFEST"):
        staging.commit(folder, target)
    assert not target.exists()


def test_crash_between_the_fallback_renames_is_reported_and_recovered(tmp_path):
    target = tmp_path / "ckpt"
    old = staging.new_staging(target)
    _save(old, "old")
    staging.commit(old, target)
    new = staging.new_staging(target)
    _save(new, "new")

    class Crash(SaveHooks):
        def between_renames(self, target):
            raise KeyboardInterrupt("crash between the renames")

    with pytest.raises(KeyboardInterrupt):
        staging.commit(new, target, exchange=False, hooks=Crash())
    assert not target.exists()
    report = staging.missing_report(target)
    assert str(target) in report and ".ckpt.replaced-" in report and "rename" in report
    staging.recover(target)  # what the next save does first
    assert _content(target) == "old"


def test_interrupted_save_leftovers_are_named_then_removed(tmp_path):
    target = tmp_path / "ckpt"
    folder = staging.new_staging(target)
    (folder / "x.shard-00000-of-00001.arrow").write_bytes(b"half")
    report = staging.missing_report(target)
    assert "interrupted" in report and folder.name in report and "not loadable" in report
    staging.remove_stale(target)
    assert _hidden(tmp_path) == []
    assert staging.missing_report(target) == f"{target}: no such model directory"


def test_a_save_does_not_replace_a_folder_of_user_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="notes.txt"):
        ck.check_replaceable(tmp_path)
    half = tmp_path / "half"  # an old-style interrupted save: shards, no manifest
    half.mkdir()
    (half / "t.shard-00000-of-00001.arrow").write_bytes(b"x")
    ck.check_replaceable(half)


def _table(dim=4, rule=None):
    return sps.TableConfig(name="emb", dim=dim, rule=rule or sps.optim.Adagrad(lr=0.05))


def test_layout_check_ignores_hyper_parameters_and_names_what_differs(tmp_path):
    saved = {"emb": {"config": _table().to_dict(), "layout": ck.layout_of(_table())}}
    ck.check_tables(tmp_path, saved, {"emb": _table(rule=sps.optim.Adagrad(lr=0.5))})
    with pytest.raises(CheckpointError) as info:
        ck.check_tables(tmp_path, saved, {"emb": _table(dim=8)})
    message = str(info.value)
    assert "'emb'" in message
    assert "expects dim=8, rule=adagrad, state=accumulator[8]" in message
    assert "holds dim=4, rule=adagrad, state=accumulator[4]" in message
    with pytest.raises(CheckpointError, match="rule=rowwise_adagrad.*rule=adagrad"):
        ck.check_tables(tmp_path, saved, {"emb": _table(rule=sps.optim.RowwiseAdagrad())})
    # a manifest written before layouts were recorded: the layout comes from its config
    del saved["emb"]["layout"]
    ck.check_tables(tmp_path, saved, {"emb": _table(rule=sps.optim.Adagrad(lr=0.5))})
    assert json.loads(json.dumps(ck.layout_of(_table()))) == {
        "rule": "adagrad",
        "dim": 4,
        "state_dim": 4,
        "state_columns": [["accumulator", 4]],
        "stat_columns": ["show", "click", "delta_score", "unseen"],
    }


def test_server_load_checks_the_shard_layout_not_hyper_parameters():
    from sparseps.server.file_ops import _check_compatible
    from sparseps.table import SparseTable

    table = SparseTable(_table())
    other_lr = _table(rule=sps.optim.Adagrad(lr=0.5)).to_dict()
    rows = {"kind": "rows", "config": other_lr, "columns": {"state": ["float32", 4]}}
    _check_compatible("a.arrow", rows, table)
    _check_compatible("p.arrow", {"kind": "pending", "config": other_lr, "columns": {}}, table)
    with pytest.raises(CheckpointError, match="b.arrow: optimizer state is 1 floats wide.* 4"):
        _check_compatible("b.arrow", {**rows, "columns": {"state": ["float32", 1]}}, table)
    with pytest.raises(CheckpointError, match="c.arrow: saved dim=8 .* dim=4"):
        _check_compatible("c.arrow", {**rows, "config": _table(dim=8).to_dict()}, table)
    with pytest.raises(CheckpointError, match="t.arrow: is a 'tombstones' file"):
        _check_compatible("t.arrow", {"kind": "tombstones", "table": "emb"}, table)
