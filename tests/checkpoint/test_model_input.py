"""Inference models record the data they were trained on; ``sparseps predict`` reads it.

Two local-mode jobs make the models: ``examples/paddle_port`` (PaddleRec's reader as the
pipe command, ``format="multislot"``, a schema with 13 ``dense_feature`` columns: the
job of issue 58) and ``jobs/input_job.py`` (Criteo TSV; a checkpoint, and a second
trainer that loads it and saves before it trains). Then:

- the save's manifest holds the schema, format, pipe command and the folder it ran in,
  and a checkpoint keeps them for a resumed job;
- ``sparseps predict`` with no flag reads the data as the model was trained, from
  another folder, and ``--schema``/``--format``/``--pipe-command`` override it;
- data that do not fit are reported as "this model expects ..." with the model's
  schema, never as the data's fault alone;
- a save that records nothing (made before) is read as Criteo, and the log says so;
- a trainer whose model cannot be exported says so when it is made, and
  ``save_inference_model`` refuses at once.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import sparseps as sps
from sparseps import cli
from sparseps.checkpoint.predictor import Predictor
from sparseps.data import CRITEO, CRITEO_SLOT, QueueDataset, Schema
from sparseps.data.synthetic import write_dataset
from sparseps.errors import CheckpointError, InputError
from sparseps.files import manifest as mf
from sparseps.testing.environ import clean_environ

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SLOT_SAMPLE = ROOT / "tests" / "fixtures" / "criteo_slot_sample.txt"
CRITEO_CSV = ROOT / "tests" / "fixtures" / "criteo_sample.csv"
PORT = ROOT / "examples" / "paddle_port"
SPARSE = tuple(str(i) for i in range(1, 27))
PORT_SCHEMA = Schema("click", ("dense_feature",) * 13, SPARSE, dense_transform="raw",
                     multislot_order=("click", *SPARSE, "dense_feature"))  # fmt: skip


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, env=clean_environ(), capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def port_model(tmp_path_factory) -> Path:
    """examples/paddle_port trained on PaddleRec's sample, run from a folder of its own."""
    work = tmp_path_factory.mktemp("port")
    _run([sys.executable, str(PORT / "train.py"), "--train", str(SLOT_SAMPLE), "--test",
          str(SLOT_SAMPLE), "--out", str(work)], cwd=work)  # fmt: skip
    return work / "infer"


@pytest.fixture(scope="module")
def criteo_job(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("criteo")
    write_dataset(work / "data", rows=600, seed=4, files=1, test_rows=100)
    job = Path(__file__).parent / "jobs" / "input_job.py"
    _run([sys.executable, str(job), "--train", str(work / "data" / "train"), "--out",
          str(work)], cwd=work)  # fmt: skip
    return work


def _manifest(model: Path) -> dict:
    return json.loads((model / "base-00000" / mf.MANIFEST).read_text())


def _predict(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["predict", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _values(out: str) -> np.ndarray:
    return np.array([[float(x) for x in line.split("\t")] for line in out.splitlines()])


def _schema_record(label: str, dense: list, slots: list, transform: str, order) -> dict:
    """A schema as the manifest records it (docs/model_files.md, "The model's input")."""
    return {"label": label, "extra_labels": [], "dense": dense, "slots": slots,
            "dense_transform": transform, "id_column": None, "multislot_order": order}  # fmt: skip


def test_a_save_records_what_the_trainer_trained_on(port_model):
    from sparseps.checkpoint.model_input import ModelInput

    recorded = _manifest(port_model)["input"]
    assert recorded["schema"] == _schema_record(
        "click", ["dense_feature"] * 13, list(SPARSE), "raw", ["click", *SPARSE, "dense_feature"]
    )
    assert recorded["format"] == "multislot"
    assert recorded["pipe_command"] == f"python {PORT / 'reader.py'}"
    assert recorded["pipe_dir"] == str(port_model.parent)  # the job's working directory
    assert Predictor(port_model).input == ModelInput.from_dict(recorded)


def test_a_checkpoint_keeps_the_input_for_a_resumed_job(criteo_job):
    trained = _manifest(criteo_job / "infer")["input"]
    schema = _schema_record("label", list(CRITEO.dense), list(CRITEO.slots), "log1p", None)
    assert trained == {"schema": schema, "format": "criteo_tsv", "pipe_command": None,
                       "pipe_dir": None}  # fmt: skip
    checkpoint = json.loads((criteo_job / "ckpt" / mf.MANIFEST).read_text())
    assert checkpoint["input"] == trained
    # the second trainer loaded the checkpoint and saved before training
    assert _manifest(criteo_job / "resumed")["input"] == trained


def test_predict_reads_the_models_input_without_flags(port_model, capsys):
    code, out, err = _predict(capsys, str(port_model), "--data", str(SLOT_SAMPLE))
    assert code == 0, err
    got = _values(out)[:, 0]
    model = Predictor(port_model)
    source = model.input
    dataset = QueueDataset([str(SLOT_SAMPLE)], source.schema, 1000, format=source.format,
                           pipe_command=source.command(), rank=0, world=1)  # fmt: skip
    want = model.predict(dataset)
    assert got.shape == (80,)
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-7)  # printed with 7 decimals

    # the same rows read without the reader, as slot text, by flags
    code, out, err = _predict(
        capsys, str(port_model), "--data", str(SLOT_SAMPLE), "--pipe-command", "",
        "--format", "slot_text", "--schema", "criteo_slot",
    )  # fmt: skip
    assert code == 0, err
    np.testing.assert_array_equal(_values(out)[:, 0], got)


def test_predict_on_data_that_does_not_fit_names_the_expected_schema(port_model, capsys):
    # Criteo CSV through the model's reader: the reader fails on every line
    code, _, err = _predict(capsys, str(port_model), "--data", str(CRITEO_CSV))
    assert code == 1
    message = err.strip().splitlines()[0]
    assert message.startswith("sparseps predict: error: this model expects format 'multislot'")
    for part in ("pipe command", "label 'click'", "13 dense values ('dense_feature' x13, raw)",
                 "26 slots ('1', '2',", "multislot_order ('click', '1',"):  # fmt: skip
        assert part in message, message
    # a schema given that cannot feed the model: refused before any data is read
    code, _, err = _predict(capsys, str(port_model), "--data", str(CRITEO_CSV), "--schema",
                            "criteo", "--format", "csv", "--pipe-command", "")  # fmt: skip
    assert code == 1
    assert "error: this model expects format 'multislot'" in err
    assert "the schema given (--schema criteo)" in err and "it has no slot '1'" in err
    assert "no label" not in err


def test_a_save_without_input_is_read_as_criteo_and_says_so(criteo_job, tmp_path, capsys,
                                                             caplog):  # fmt: skip
    old = tmp_path / "old" / "base-00000"
    source = criteo_job / "infer" / "base-00000"
    shutil.copytree(source, old)
    manifest = json.loads((source / mf.MANIFEST).read_text())
    for key in ("input", "format", "version", "created"):  # as sparseps wrote it before
        manifest.pop(key)
    manifest["head"].pop("outputs")
    mf.write_manifest(old, "sparseps-inference", manifest.pop("files"), **manifest)
    test = next((criteo_job / "data" / "test").iterdir())
    with caplog.at_level(logging.INFO, logger="sparseps.checkpoint.predict_cli"):
        code, out, err = _predict(capsys, str(old.parent), "--data", str(test))
    assert code == 0, err
    assert "records no input schema" in caplog.text and "reading" in caplog.text
    got = _values(out)[:, 0]
    want = Predictor(criteo_job / "infer").predict(QueueDataset([str(test)], CRITEO, 1000))
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-7)
    # its data not Criteo: the message says the model records nothing and how to read it
    code, _, err = _predict(capsys, str(old.parent), "--data", str(SLOT_SAMPLE))
    assert code == 1
    assert "error: this model records no input schema" in err
    assert "give --schema, --format or --pipe-command" in err


class PlainModel(nn.Module):
    """A model that trains but is no SparseModel: its forward does everything."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = sps.nn.SparseEmbedding("plain_emb", 4, slots=("C1",))
        self.out = nn.Linear(4, 1)

    def forward(self, batch) -> torch.Tensor:
        return self.out(self.emb(batch).flatten(1)).reshape(-1)


def test_a_model_that_cannot_be_exported_is_reported_when_the_trainer_is_made(caplog):
    with caplog.at_level(logging.WARNING, logger="sparseps.checkpoint.inference_needs"):
        trainer = sps.Trainer(PlainModel())  # connects on first use: no server needed here
    warning = caplog.text
    assert "save_inference_model will refuse this model" in warning
    assert "PlainModel is not one: subclass sparseps.nn.SparseModel" in warning
    assert "docs/migrating-from-paddle.md" in warning
    start = time.monotonic()
    with pytest.raises(CheckpointError, match="PlainModel is not one"):
        trainer.save_inference_model("unused")  # refused before it asks a server anything
    assert time.monotonic() - start < 5

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparseps.checkpoint.inference_needs"):
        sps.Trainer(sps.models.DNN(CRITEO.slots, 13, emb_dim=4, hidden=(8,)))
    assert "save_inference_model" not in caplog.text


def test_the_input_record_round_trips_and_schemas_are_named(tmp_path):
    from sparseps.checkpoint.inference_needs import InferenceNeeds
    from sparseps.checkpoint.model_input import ModelInput, named_schema, schema_to_dict

    recorded = ModelInput(PORT_SCHEMA, "multislot", "python reader.py", str(tmp_path))
    assert ModelInput.from_dict(json.loads(json.dumps(recorded.to_dict()))) == recorded
    assert recorded.command() == f"cd {tmp_path} && python reader.py"  # where it ran
    moved = recorded.replace(pipe_dir=str(tmp_path / "gone"))
    with pytest.raises(InputError, match="give --pipe-command"):
        moved.command()
    assert named_schema("criteo_slot") == CRITEO_SLOT
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema_to_dict(PORT_SCHEMA)))
    assert named_schema(str(path)) == PORT_SCHEMA
    needs = InferenceNeeds()
    needs.trained_on([1, 2, 3])  # an iterable that is no dataset: nothing learned
    assert needs.input is None
