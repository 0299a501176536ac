"""``sparseps serve`` takes its request columns from the model (issue 58).

The model is ``examples/paddle_port``'s (PaddleRec's reader as a pipe command, 26 integer
slots ``1``..``26`` and 13 ``dense_feature`` columns, sent as one list column): served
with no ``--schema``, it answers what ``sparseps.Predictor`` predicts for the same rows,
and ``/model`` says what it expects. A later save that records another schema is refused
(the service keeps serving); ``--schema`` still picks the columns. The decoding of a
repeated dense name is checked in-process for every body shape.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from sparseps.checkpoint.predictor import Predictor
from sparseps.data import CRITEO, CRITEO_SLOT, QueueDataset
from sparseps.errors import CheckpointError
from sparseps.files import manifest as mf
from sparseps.serving import ModelWatcher, ServeProcess, batch_from_body
from sparseps.serving.requests import ARROW_STREAM, RequestError
from sparseps.testing.environ import clean_environ

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SLOT_SAMPLE = ROOT / "tests" / "fixtures" / "criteo_slot_sample.txt"


@pytest.fixture(scope="module")
def port_model(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("port")
    argv = [sys.executable, str(ROOT / "examples" / "paddle_port" / "train.py"), "--train",
            str(SLOT_SAMPLE), "--test", str(SLOT_SAMPLE), "--out", str(work)]  # fmt: skip
    done = subprocess.run(argv, cwd=work, env=clean_environ(), capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return work / "infer"


def request_rows(model: Path) -> tuple[list[dict], np.ndarray]:
    """The sample's rows as a client sends them to this model (the reader's ids and dense
    values), and what the predictor predicts for them."""
    predictor = Predictor(model)
    source = predictor.input
    dataset = QueueDataset([str(SLOT_SAMPLE)], source.schema, 1000, format=source.format,
                           pipe_command=source.command(), rank=0, world=1)  # fmt: skip
    batch = next(iter(dataset))
    rows = []
    for i in range(len(batch)):
        row: dict = {"dense_feature": [float(x) for x in batch.dense[i]]}
        for name, slot in batch.slots.items():
            row[name] = [int(v) for v in slot.values[slot.offsets[i] : slot.offsets[i + 1]]]
        rows.append(row)
    return rows, predictor.predict_batch(batch)


def test_serve_takes_the_models_columns_without_flags(port_model):
    rows, want = request_rows(port_model)
    with ServeProcess(port_model, poll_s=60) as service:
        answer = httpx.post(service.url + "/predict", json={"rows": rows}, timeout=60)
        assert answer.status_code == 200, answer.text
        np.testing.assert_array_equal(np.float32(answer.json()["predictions"]), want)
        described = httpx.get(service.url + "/model", timeout=60).json()
        wrong = httpx.post(service.url + "/predict", json={"rows": [{"I1": 3}]}, timeout=60)
    assert described["request_columns"]["dense"] == ["dense_feature"]
    assert described["request_columns"]["dense_lists"] == {"dense_feature": 13}
    assert described["request_columns"]["slots"] == [str(i) for i in range(1, 27)]
    assert described["input"]["format"] == "multislot"
    assert described["input"]["schema"]["label"] == "click"
    assert wrong.status_code == 400 and wrong.json()["error"].startswith("I1: not a column")


def _with_input(source: Path, target: Path, record: dict | None) -> Path:
    """A copy of the save ``source`` at ``target`` whose manifest records ``record``."""
    shutil.copytree(source, target)
    manifest = json.loads((target / mf.MANIFEST).read_text())
    for key in ("format", "version", "created"):
        manifest.pop(key)
    manifest["input"] = record
    manifest["sequence"] = int(target.name.split("-")[1])
    mf.write_manifest(target, "sparseps-inference", manifest.pop("files"), **manifest)
    return target


def test_a_save_that_records_another_schema_is_refused(port_model, tmp_path):
    from sparseps.serving.request_schema import RequestSchema

    served = tmp_path / "served"
    shutil.copytree(port_model / "base-00000", served / "base-00000")
    columns = RequestSchema(None)
    with ModelWatcher(served, poll_s=60, warmup=columns.warm_up) as watcher:
        assert columns.fix(watcher.current.predictor).slots[0] == "1"
        other = watcher.current.predictor.input.to_dict()
        other["schema"]["dense_transform"] = "log1p"  # the same columns, read otherwise
        _with_input(port_model / "base-00000", served / "base-00001", other)
        assert not watcher.poll()
        assert watcher.current.predictor.sequence == 0 and watcher.refused == 1
        assert "base-00001" in watcher.last_refusal
        assert "the model now expects format 'multislot'" in watcher.last_refusal
        assert "restart sparseps serve" in watcher.last_refusal
        # the same columns recorded again (or none, as an old save): served
        same = watcher.current.predictor.input.to_dict()
        _with_input(port_model / "base-00000", served / "base-00002", same)
        assert watcher.poll() and watcher.current.predictor.sequence == 2


def test_a_schema_given_that_does_not_feed_the_model_is_refused(port_model):
    from sparseps.serving.request_schema import RequestSchema

    given = RequestSchema(CRITEO)  # sparseps serve --schema criteo
    with pytest.raises(CheckpointError, match="this model expects format 'multislot'") as caught:
        ModelWatcher(port_model, poll_s=60, warmup=given.warm_up)
    assert "no inference chain verifies" in str(caught.value)
    assert "the service's request columns" in str(caught.value)


def _arrow(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_repeated_dense_name_is_one_column_of_lists():
    dense = [[float(i + j) for j in range(13)] for i in range(3)]
    dense[1] = None  # a null row: every value missing
    bodies = [
        (json.dumps({"rows": [{"dense_feature": d, "1": 7} for d in dense]}), "application/json"),
        (json.dumps({"columns": {"dense_feature": dense, "1": [7, 7, 7]}}), "application/json"),
        (_arrow(pa.table({"dense_feature": pa.array(dense, pa.list_(pa.float32())),
                          "1": pa.array([7, 7, 7], pa.uint64())})), ARROW_STREAM),
    ]  # fmt: skip
    for body, kind in bodies:
        payload = body.encode() if isinstance(body, str) else body
        batch = batch_from_body(payload, kind, CRITEO_SLOT, max_rows=10)
        assert batch.dense.shape == (3, 13)
        np.testing.assert_array_equal(batch.dense[0], np.arange(13, dtype=np.float32))
        np.testing.assert_array_equal(batch.dense[1], np.zeros(13, np.float32))
        np.testing.assert_array_equal(batch.dense[2], np.arange(2, 15, dtype=np.float32))
    for rows, message in (
        (
            [{"dense_feature": [1.0, 2.0]}],
            "dense_feature: row 0 holds 2 values; the model takes 13",
        ),
        ([{"dense_feature": 1.0}], "dense_feature: the model takes 13 dense values of this name"),
        ([{"dense_feature": ["1"] * 12 + ["x"]}], "dense_feature: row 0 value 12 holds .x."),
        ([{"dense_feature": [1.0] * 12 + [1e39]}], "dense_feature: row 0 value 12 holds 1e+39"),
    ):
        with pytest.raises(RequestError, match=message.replace("+", r"\+")) as caught:
            batch_from_body(json.dumps({"rows": rows}).encode(), "", CRITEO_SLOT, max_rows=10)
        assert caught.value.status == 400
