"""A restart after a corrupt save: the service, ``Predictor`` and ``sparseps predict``
start from the newest chain that verifies, say what they skipped and why, and refuse only
when nothing verifies.

The folder holds the session's chain: ``base-00000`` + thirteen deltas, then
``base-00014`` with one byte flipped in a shard, then ``delta-00015`` (written on that
base, so it cannot apply without it). The newest chain that verifies is ``base-00000`` +
``delta-00001..00013``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from _servetools import land

from sparseps import cli
from sparseps.checkpoint.predictor import Predictor
from sparseps.data import CRITEO, QueueDataset
from sparseps.errors import CheckpointError, UnavailableError
from sparseps.serving import ModelWatcher, ServeProcess, criteo_request_rows

GOOD = ["base-00000", *(f"delta-{i:05d}" for i in range(1, 14))]


def flip_a_byte(folder: Path) -> Path:
    """One byte of a shard of ``folder`` inverted (its manifest left as it was)."""
    shard = next(folder.glob("deep_emb.*.arrow"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


def copy_chain(chain, model: Path, corrupt: tuple[str, ...]) -> Path:
    for name in chain.saves:
        land(chain.folder(name), model)
    for name in corrupt:
        flip_a_byte(model / name)
    return model


@pytest.fixture
def corrupt_base(chain, tmp_path) -> Path:
    return copy_chain(chain, tmp_path / "model", ("base-00014",))


@pytest.fixture(scope="module")
def dataset(chain):
    return QueueDataset([str(chain.test_file)], CRITEO, batch_size=100, threads=1)


def good_predictions(model: Path, dataset) -> np.ndarray:
    """The newest chain that verifies, loaded save by save as given."""
    return Predictor(model, [model / name for name in GOOD]).predict(dataset)


def test_predictor_starts_from_the_previous_verified_chain(corrupt_base, dataset, caplog):
    with caplog.at_level("WARNING"):
        predictor = Predictor(corrupt_base)
    assert [f.name for f in predictor.saves] == GOOD
    assert predictor.sequence == 13
    skipped = {folder.name: reason for folder, reason in predictor.skipped}
    assert list(skipped) == ["base-00014"] and "checksum mismatch" in skipped["base-00014"]
    np.testing.assert_array_equal(
        predictor.predict(dataset), good_predictions(corrupt_base, dataset)
    )
    # an explicit chain is loaded as given, or refused
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        Predictor(corrupt_base, [corrupt_base / "base-00014"])


def test_sparseps_predict_starts_from_the_previous_verified_chain(
    corrupt_base, chain, dataset, capsys
):
    capsys.readouterr()
    code = cli.main(["predict", str(corrupt_base), "--data", str(chain.test_file)])
    out = capsys.readouterr().out
    assert code == 0
    got = np.array([float(line) for line in out.split()], np.float32)
    np.testing.assert_allclose(got, good_predictions(corrupt_base, dataset), rtol=0, atol=5e-7)


def test_service_restarts_on_the_previous_verified_chain(corrupt_base, chain, dataset):
    rows = criteo_request_rows(chain.test_file)
    with (
        ServeProcess(corrupt_base, poll_s=0.05) as service,
        httpx.Client(base_url=service.url, timeout=60) as client,
    ):
        model = client.get("/model").json()
        assert [model["base"], *model["deltas"]] == GOOD
        assert model["sequence"] == 13
        assert model["reloads"]["refused"] == 1
        assert model["last_refusal"].startswith("base-00014: ")
        assert "checksum mismatch" in model["last_refusal"]
        got = client.post("/predict", json={"rows": rows})
        assert got.status_code == 200 and got.json()["sequence"] == 13
        np.testing.assert_allclose(
            np.float32(got.json()["predictions"]),
            good_predictions(corrupt_base, dataset),
            rtol=0,
            atol=1e-7,
        )
    # closed: its working folder (ready file, default log) is gone, its log still readable
    assert not service.ready_file.parent.exists()
    assert "base-00014" in service.log()


def test_the_skipped_base_is_not_read_again_until_it_is_rewritten(corrupt_base, chain):
    """The watcher counts the skipped base as refused once; polls leave it alone (a big
    corrupt base is not re-read every poll) until a new copy of it lands."""
    watcher = ModelWatcher(corrupt_base, poll_s=60)  # polled by hand here
    assert [f.name for f in watcher.current.predictor.saves] == GOOD
    assert watcher.refused == 1 and watcher.last_refusal.startswith("base-00014: ")
    assert not watcher.poll() and not watcher.poll()
    assert watcher.refused == 1 and watcher.current.predictor.sequence == 13
    shutil.rmtree(corrupt_base / "base-00014")
    land(chain.folder("base-00014"), corrupt_base)  # a good copy: a new manifest
    assert watcher.poll()
    assert [f.name for f in watcher.current.predictor.saves] == ["base-00014", "delta-00015"]


def test_a_corrupt_delta_is_skipped_with_those_after_it(chain, tmp_path, dataset):
    model = copy_chain(chain, tmp_path / "model", ("delta-00005",))
    predictor = Predictor(model, on_loaded=None)
    assert [f.name for f in predictor.saves] == ["base-00014", "delta-00015"]  # not affected
    shutil.rmtree(model / "base-00014")
    shutil.rmtree(model / "delta-00015")
    predictor = Predictor(model)
    assert [f.name for f in predictor.saves] == GOOD[:5]
    assert [folder.name for folder, _ in predictor.skipped] == ["delta-00005"]


def test_nothing_verifies_is_refused_naming_every_save(chain, tmp_path, capsys):
    model = copy_chain(chain, tmp_path / "model", ("base-00000", "base-00014"))
    with pytest.raises(CheckpointError) as refused:
        Predictor(model)
    message = str(refused.value)
    assert "no inference chain verifies" in message
    assert "base-00014" in message and "base-00000" in message
    capsys.readouterr()
    assert cli.main(["predict", str(model), "--data", str(chain.test_file)]) == 1
    assert "no inference chain verifies" in capsys.readouterr().err
    with pytest.raises(UnavailableError, match="exited with code 1"):
        ServeProcess(model, start_timeout=120)
