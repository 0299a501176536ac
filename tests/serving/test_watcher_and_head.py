"""In-process checks of the model swap and of the head formats.

- ``ModelWatcher.poll``: deltas make a new predictor and leave the old one unchanged
  (read-only arrays); a new base drops every reference to the old chain's tables (freed:
  a weak reference dies); a rewritten chain (saves deleted) is reloaded.
- the head: new saves hold ``head.pt2`` (torch.export) and no TorchScript; a save of the
  old format (``head.pt``, TorchScript) still loads and predicts the same; a broken one
  fails with a message that says what to do.
"""

from __future__ import annotations

import gc
import json
import shutil
import weakref

import numpy as np
import pytest
from _servetools import land

from sparseps.checkpoint import inference
from sparseps.checkpoint.predictor import Predictor
from sparseps.data import CRITEO, QueueDataset
from sparseps.errors import CheckpointError
from sparseps.files import manifest as mf
from sparseps.serving import ModelWatcher


@pytest.fixture(scope="module")
def dataset(chain):
    return QueueDataset([str(chain.test_file)], CRITEO, batch_size=100, threads=1)


def test_watcher_swaps_new_objects_and_frees_the_old_base(chain, tmp_path, dataset):
    model = tmp_path / "model"
    for name in chain.saves[:2]:
        land(chain.folder(name), model)
    watcher = ModelWatcher(model, poll_s=60)  # polled by hand here
    first = watcher.current
    before = first.predictor.predict(dataset)
    assert first.predictor.sequence == 1 and not watcher.poll()
    land(chain.folder("delta-00002"), model)
    land(chain.folder("delta-00003"), model)
    assert watcher.poll() and watcher.current.predictor.sequence == 3
    assert watcher.applied == 2
    # the old model is untouched, and cannot be written to
    np.testing.assert_array_equal(first.predictor.predict(dataset), before)
    table = first.predictor.tables["deep_emb"]
    with pytest.raises(ValueError, match="read-only"):
        table.parts[0][0, 0] = 1.0  # the base's rows: a map of its file
    with pytest.raises(ValueError, match="read-only"):
        table.overlay.rows[0, 0] = 1.0  # the delta's rows
    old_tables = weakref.ref(watcher.current.predictor.tables["deep_emb"])
    del first, table
    land(chain.folder("base-00014"), model)
    assert watcher.poll() and watcher.current.predictor.saves[0].name == "base-00014"
    gc.collect()
    assert old_tables() is None  # the old chain's rows are freed
    # a rewritten chain (the newer base deleted, as a restarted job does) is followed
    shutil.rmtree(model / "base-00014")
    assert watcher.poll()
    assert [f.name for f in watcher.current.predictor.saves][-1] == "delta-00003"
    np.testing.assert_array_equal(
        watcher.current.predictor.predict(dataset), Predictor(model).predict(dataset)
    )


def test_no_model_to_serve_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no complete base inference model"):
        ModelWatcher(tmp_path)


def test_saves_hold_an_exported_head(chain):
    for name in ("base-00000", "delta-00005"):
        manifest = mf.read_manifest(chain.folder(name))
        assert inference.HEAD_FILE in manifest["files"]
        assert inference.LEGACY_HEAD_FILE not in manifest["files"]
        head = {"format": "torch.export", "inputs": [[13], [26, 4], [26, 1]], "outputs": 1}
        assert manifest["head"] == head


def legacy_copy(chain, tmp_path, head_bytes: bytes):
    """``base-00014`` as an old sparseps wrote it: a TorchScript ``head.pt``."""
    folder = tmp_path / "legacy" / "base-00014"
    shutil.copytree(chain.folder("base-00014"), folder)
    (folder / inference.HEAD_FILE).unlink()
    (folder / inference.LEGACY_HEAD_FILE).write_bytes(head_bytes)
    manifest = json.loads((folder / mf.MANIFEST).read_text())
    files = manifest.pop("files")
    del files[inference.HEAD_FILE]
    files[inference.LEGACY_HEAD_FILE] = mf.file_record(folder / inference.LEGACY_HEAD_FILE)
    manifest.pop("head")
    for key in ("format", "version", "created"):
        manifest.pop(key)
    mf.write_manifest(folder, "sparseps-inference", files, **manifest)
    return folder.parent


def test_a_torchscript_head_still_loads(chain, tmp_path, dataset, caplog):
    # the chain job scripted base-00014's head: the same weights as its head.pt2
    legacy = legacy_copy(chain, tmp_path, chain.legacy_head.read_bytes())
    with caplog.at_level("WARNING"):
        old = Predictor(legacy)
    assert any("TorchScript head" in r.getMessage() for r in caplog.records)
    new = Predictor(chain.source, [chain.folder("base-00014")])
    got = old.predict(dataset)
    assert np.std(got) > 0.01
    np.testing.assert_allclose(got, new.predict(dataset), rtol=0, atol=1e-6)


def test_a_broken_torchscript_head_names_the_fix(chain, tmp_path):
    legacy = legacy_copy(chain, tmp_path, b"PK\x03\x04 not a torchscript archive")
    with pytest.raises(
        CheckpointError, match="cannot load this TorchScript head.*save the inference model again"
    ):
        Predictor(legacy)


def test_table_upsert_and_delete_against_a_dict():
    """The merge a delta does (searchsorted + insert) against a plain dict, random keys."""
    from sparseps.checkpoint.predictor import EmbeddingTable
    from sparseps.config import TableConfig

    rng = np.random.default_rng(5)
    table = EmbeddingTable.empty(TableConfig(name="t", dim=3))
    oracle: dict[int, np.ndarray] = {}
    for step in range(30):
        keys = rng.choice(np.arange(0, 2**64 - 1, 2**58, dtype=np.uint64), rng.integers(0, 20))
        rows = rng.normal(size=(keys.size, 3)).astype(np.float32)
        if step % 4 == 3:
            table = table.delete(keys)
            for k in keys.tolist():
                oracle.pop(k, None)
        else:
            table = table.upsert(keys, rows)
            for k, r in reversed(list(zip(keys.tolist(), rows, strict=True))):
                oracle[k] = r  # of a key repeated in one delta, the first wins
        assert table.keys.tolist() == sorted(oracle)
        expected = np.array([oracle[k] for k in sorted(oracle)]).reshape(-1, 3)
        np.testing.assert_array_equal(table.rows, expected)
        assert not table.keys.flags.writeable and not table.rows.flags.writeable
