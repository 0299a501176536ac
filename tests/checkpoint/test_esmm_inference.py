"""examples/esmm saves an inference model (issue 58): a two-task model whose head gives two
logits per row.

The example trains on planted impressions (click, then conversion) and saves with
``--out``. The save records the example's schema (two labels, three slots) and format;
``sparseps.Predictor`` gives ``[rows, 2]`` (pCTR, pCVR), ``sparseps predict`` prints both
columns with no flag, and pCTR ranks the clicks (the model learned). ``sparseps serve``
answers each row with both (a list per row, or two Arrow columns) equal to the
``Predictor``'s; a later save whose head gives another count is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from sparseps import cli
from sparseps.checkpoint.predictor import Predictor
from sparseps.data import QueueDataset
from sparseps.errors import CheckpointError
from sparseps.metrics.functions import exact_auc
from sparseps.serving import ServeProcess
from sparseps.testing.environ import clean_environ

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, rows: int, seed: int) -> np.ndarray:
    """Impressions ``click<TAB>conversion<TAB>user<TAB>item<TAB>ctx``; returns the clicks."""
    weights = np.random.default_rng(100)  # the planted model, the same for every file
    w_click = weights.normal(0.0, 1.0, (3, 50))
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, (3, rows))
    logit = w_click[np.arange(3)[:, None], ids].sum(0) - 1.0
    click = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    conversion = click * (rng.random(rows) < 0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(
        f"{click[r]}\t{conversion[r]}\tu_{ids[0, r]}\ti_{ids[1, r]}\tc_{ids[2, r]}\n"
        for r in range(rows)
    ))  # fmt: skip
    return click


@pytest.fixture(scope="module")
def esmm(tmp_path_factory) -> tuple[Path, Path, np.ndarray]:
    work = tmp_path_factory.mktemp("esmm")
    write(work / "train" / "part-0", 6000, seed=1)
    clicks = write(work / "test" / "part-0", 1000, seed=2)
    argv = [sys.executable, str(ROOT / "examples" / "esmm" / "train.py"), "--train",
            str(work / "train"), "--test", str(work / "test"), "--passes", "2", "--json",
            "--out", str(work / "model")]  # fmt: skip
    done = subprocess.run(argv, cwd=work, env=clean_environ(), capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(summary["inference_model"]).name == "base-00000"
    return work / "model", work / "test" / "part-0", clicks


def test_the_esmm_model_predicts_both_tasks(esmm, capsys):
    model, test, clicks = esmm
    predictor = Predictor(model)
    assert predictor.outputs == 2
    recorded = predictor.input
    assert recorded is not None and recorded.format == "criteo_tsv"
    assert recorded.schema.labels == ("click", "conversion")
    assert recorded.schema.slots == ("user", "item", "ctx")
    want = predictor.predict(QueueDataset([str(test)], recorded.schema, 256, rank=0, world=1))
    assert want.shape == (1000, 2) and ((want > 0) & (want < 1)).all()
    assert exact_auc(want[:, 0], clicks) > 0.7  # pCTR learned the planted clicks

    assert cli.main(["predict", str(model), "--data", str(test)]) == 0
    lines = capsys.readouterr().out.splitlines()
    got = np.array([[float(x) for x in line.split("\t")] for line in lines])
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-7)


def test_serve_answers_both_tasks_as_the_predictor_does(esmm):
    """``sparseps serve`` answers each row with its two outputs (JSON: a list per row; Arrow:
    ``prediction_0`` and ``prediction_1``), equal to ``sparseps.Predictor``'s, and
    ``/model`` says how many."""
    model, test, _ = esmm
    predictor = Predictor(model)
    recorded = predictor.input
    assert recorded is not None
    want = predictor.predict(QueueDataset([str(test)], recorded.schema, 256, rank=0, world=1))
    fields = [line.split("\t")[2:] for line in test.read_text().splitlines()[:40]]
    rows = [dict(zip(("user", "item", "ctx"), f, strict=True)) for f in fields]
    arrow = "application/vnd.apache.arrow.stream"
    with ServeProcess(model, poll_s=60) as service, httpx.Client(base_url=service.url) as client:
        assert client.get("/model").json()["outputs"] == 2
        answer = client.post("/predict", json={"rows": rows}).json()
        assert answer["rows"] == 40
        got = np.array(answer["predictions"], np.float32)
        assert got.shape == (40, 2)
        np.testing.assert_allclose(got, want[:40], rtol=0, atol=5e-7)
        streamed = client.post("/predict", json={"rows": rows}, headers={"accept": arrow})
        table = pa.ipc.open_stream(streamed.content).read_all()
        assert table.column_names == ["prediction_0", "prediction_1"]
        np.testing.assert_array_equal(
            np.stack([table.column(n).to_numpy() for n in table.column_names], 1), got
        )


def test_serve_refuses_a_later_head_of_other_outputs(esmm):
    """The first model served fixes a row's predictions: a save whose head gives another
    count is refused like one of another schema."""
    from sparseps.serving.request_schema import RequestSchema

    model, _, _ = esmm
    columns = RequestSchema(None)
    columns.warm_up(Predictor(model))  # the served head: 2 outputs

    class OneOutput:  # the same save, its head answering one number per row
        def __init__(self) -> None:
            self._inner = Predictor(model)

        def __getattr__(self, name: str):
            return getattr(self._inner, name)

        def predict_batch(self, batch):
            return self._inner.predict_batch(batch)[:, 0]

    with pytest.raises(
        CheckpointError, match="gives 1 predictions per row and the service answers 2"
    ):
        columns.warm_up(OneOutput())  # type: ignore[arg-type]
