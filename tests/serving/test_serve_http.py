"""``sparseps serve`` over loopback HTTP: predictions equal ``sparseps predict``, bad and
oversized requests refused with the field named, the model and metrics routes.

The session's service (conftest: a real ``sparseps serve`` child process, uvicorn on a
free loopback port) serves ``served``; each check compares with what is in that folder
when it runs.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from _servetools import WORKERS, samples

from sparseps import cli
from sparseps.checkpoint.predictor import Predictor
from sparseps.serving import criteo_request_rows
from sparseps.testing import wait_until

ARROW = "application/vnd.apache.arrow.stream"


def offline(served: Path, data: Path, capsys) -> np.ndarray:
    """``sparseps predict DIR --data FILE``, the real command, its stdout parsed."""
    capsys.readouterr()
    assert cli.main(["predict", str(served), "--data", str(data)]) == 0
    return np.array([float(line) for line in capsys.readouterr().out.split()], np.float32)


def test_predictions_equal_sparseps_predict(chain, served, client, capsys):
    rows = criteo_request_rows(chain.test_file)
    expected = offline(served, chain.test_file, capsys)
    assert expected.size == len(rows) == 200
    sequence = Predictor(served).sequence
    got = client.post("/predict", json={"rows": rows})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["sequence"] == sequence and body["rows"] == 200
    # sparseps predict prints 7 decimals; the service sends float32 values
    np.testing.assert_allclose(np.array(body["predictions"]), expected, rtol=0, atol=5e-7)
    assert np.std(expected) > 0.01  # a model that predicts, not a constant

    # the same rows as columns and as an Arrow stream give the same float32 values
    columns = {name: [row.get(name) for row in rows] for name in rows[0]}
    by_columns = client.post("/predict", json={"columns": columns}).json()["predictions"]
    table = pa.table(columns)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    arrow = client.post(
        "/predict", content=sink.getvalue(), headers={"content-type": ARROW, "accept": ARROW}
    )
    assert arrow.status_code == 200
    assert arrow.headers["x-sparseps-model-sequence"] == str(sequence)
    by_arrow = pa.ipc.open_stream(arrow.content).read_all().column("prediction").to_numpy()
    assert by_arrow.dtype == np.float32
    np.testing.assert_array_equal(np.float32(by_columns), np.float32(body["predictions"]))
    np.testing.assert_array_equal(by_arrow, np.float32(body["predictions"]))


def test_sparseps_predict_shows_its_bars_only_when_asked(chain, served, capsys):
    """Loading the chain save by save, then the rows predicted; off when not a terminal."""
    saves = len(Predictor(served).saves)
    assert saves > 1, "a chain of a base and deltas"
    capsys.readouterr()
    assert cli.main(["predict", str(served), "--data", str(chain.test_file), "--progress"]) == 0
    out, shown = capsys.readouterr()
    assert len(out.split()) == 200
    assert "load: 100%" in shown and f"{saves}/{saves}" in shown, shown
    assert "predict: 200row" in shown, shown
    assert cli.main(["predict", str(served), "--data", str(chain.test_file)]) == 0
    quiet = capsys.readouterr().err
    assert "\r" not in quiet and "\x1b" not in quiet and "load:" not in quiet, quiet


def test_ids_as_integers_and_lists(client):
    """The model's slots given as ids: an id, a list of ids, a negative (uint64 bits)."""
    one = client.post("/predict", json={"rows": [{"I1": 2, "C1": 5}, {"C1": 5}]}).json()
    assert one["predictions"][0] != one["predictions"][1]  # I1 differs
    listed = client.post("/predict", json={"rows": [{"C1": [5]}, {"C1": []}]}).json()
    assert listed["predictions"][0] == one["predictions"][1]
    assert listed["predictions"][1] != one["predictions"][1]  # no id is not id 5
    neg = client.post("/predict", json={"rows": [{"C2": [-1, 7]}]})
    assert neg.status_code == 200, neg.text


@pytest.mark.parametrize(
    ("body", "status", "names"),
    [
        (b"{not json", 400, "body: not valid JSON"),
        (json.dumps({"rowz": []}).encode(), 400, "'rows' or 'columns'"),
        (json.dumps({"rows": {"I1": 1}}).encode(), 400, "rows: expected a list"),
        (json.dumps({"rows": [{"I1": 1}, 3]}).encode(), 400, "rows[1]: expected an object"),
        (json.dumps({"rows": [{"I1": 1, "C99": "a"}]}).encode(), 400, "C99: not a column"),
        (json.dumps({"rows": [{"I1": 1}, {"I1": "x"}]}).encode(), 400, "rows[*].I1"),
        (json.dumps({"rows": [{"I1": "1"}, {"I1": "x"}]}).encode(), 400, "I1: row 1 holds 'x'"),
        (json.dumps({"rows": [{"C1": 1.5}]}).encode(), 400, "C1: a slot column"),
        (
            json.dumps({"rows": [{"C1": 2**64}]}).encode(),
            400,
            "rows[*].C1: an integer does not fit",
        ),
        (json.dumps({"rows": []}).encode(), 400, "rows: the request holds no rows"),
        (json.dumps({"columns": {"I1": [1, 2], "C1": ["a"]}}).encode(), 400, "columns: the lists"),
        (json.dumps({"rows": [{"I1": 1}] * 1001}).encode(), 413, "rows: 1001 rows"),
    ],
)
def test_bad_requests_get_4xx_naming_the_field(client, body, status, names):
    got = client.post("/predict", content=body, headers={"content-type": "application/json"})
    assert got.status_code == status, got.text
    assert names in got.json()["error"]


def test_oversized_and_wrong_type_refused(client, served):
    big = b"x" * (600 << 10)
    got = client.post("/predict", content=big, headers={"content-type": "application/json"})
    assert got.status_code == 413 and "body: " in got.json()["error"]

    def chunks():  # no Content-Length: refused while reading
        for _ in range(20):
            yield b" " * (64 << 10)

    got = client.post("/predict", content=chunks(), headers={"content-type": "application/json"})
    assert got.status_code == 413 and "over 524288 bytes" in got.json()["error"]
    got = client.post("/predict", content=b"a,b", headers={"content-type": "text/csv"})
    assert got.status_code == 415 and "Content-Type" in got.json()["error"]
    got = client.post("/predict", content=b"nope", headers={"content-type": ARROW})
    assert got.status_code == 400 and "not an Arrow IPC stream" in got.json()["error"]
    assert client.get("/healthz").json() == {"status": "ok", "sequence": Predictor(served).sequence}


def test_model_and_metrics_routes(client, served):
    offline = Predictor(served)
    model = client.get("/model").json()
    assert [model["base"], *model["deltas"]] == [f.name for f in offline.saves]
    assert model["sequence"] == offline.sequence
    assert model["passes"] == offline.sequence + 1  # the chain job trains a pass per save
    assert model["rows"] == offline.rows() and model["rows"]["deep_emb"] > 1000
    assert model["age_s"] >= 0 and model["bytes"] == offline.nbytes()
    assert set(model["reloads"]) == {"applied", "refused"}

    # every worker's metrics, labelled (the others' written at most a second ago)
    def answered(text: str, status: str) -> float:
        return sum(
            s.value
            for s in samples(text, "sparseps_serve_requests_total")
            if s.labels["route"] == "/predict" and s.labels["status"] == status
        )

    def with_the_413() -> str | None:
        text = client.get("/metrics").text
        return text if answered(text, "413") else None

    text = wait_until(with_the_413, 30, "the 413 answered above in /metrics", 0.1)
    assert answered(text, "200") > 0
    assert "sparseps_serve_request_seconds_bucket" in text
    for worker in range(WORKERS):
        assert f'sparseps_serve_model_sequence{{worker="{worker}"}} {offline.sequence}.0' in text
    applied = model["reloads"]["applied"]  # the answering worker's
    assert any(
        line.startswith('sparseps_serve_reloads_total{outcome="applied",worker=')
        and line.endswith(f" {applied}.0")
        for line in text.splitlines()
    )
    age = [line for line in text.splitlines() if line.startswith("sparseps_serve_model_age")]
    assert len(age) == WORKERS and all(float(line.split()[1]) >= 0 for line in age)
