"""examples/fleetx_wide_deep: FleetX's parameter-server quick start, ported, end to end.

FleetX's ``examples/wide_and_deep_dataset`` (``reader.py`` unchanged but for its import
lines, checked against the upstream blob) is copied to a folder of its own with a few
thousand raw Criteo lines in ``./data``, launched there as FleetX runs it (``sparseps
launch ... train.py``: 1 server, 2 workers, every worker reading every file), and saves
an inference model. ``sparseps predict`` and ``sparseps serve`` then run on it from
another folder with no schema flag (the model records its schema, ``multislot`` and the
pipe command ``PYTHONHASHSEED=0 python reader.py`` with the folder it ran in), and answer
the same predictions.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from _ports import EXAMPLES, criteo_raw, git_blob, launch, predict, request_rows, serve

pytestmark = pytest.mark.timeout(600)

PORT = EXAMPLES / "fleetx_wide_deep"
UPSTREAM_READER = "db4fff4c286827b83bf3dea3c3e57ca9762474c4"  # FleetX 918acb2, reader.py
UPSTREAM_LICENSE = "c8dd3ab2aad2e941b63d11f8f762d516c6f7f602"


def test_the_reader_is_fleetxs_but_for_its_import_lines():
    ours = (PORT / "reader.py").read_text()
    imports = ("# import paddle  (sparseps: the reader does not need Paddle)\n"
               "# import paddle.distributed.fleet as fleet\n"
               "import sparseps.data as fleet\n")  # fmt: skip
    assert ours.startswith(imports)
    upstream = "import paddle\nimport paddle.distributed.fleet as fleet\n" + ours[len(imports) :]
    assert git_blob(upstream.encode()) == UPSTREAM_READER
    assert git_blob((PORT / "LICENSE").read_bytes()) == UPSTREAM_LICENSE


def test_fleetx_quick_start_trains_saves_predicts_and_serves(tmp_path):
    job = tmp_path / "wide_and_deep_dataset"
    shutil.copytree(PORT, job, ignore=shutil.ignore_patterns("__pycache__", ".ruff_cache"))
    train, test = criteo_raw(tmp_path / "gen", rows=2400, files=2, seed=11)
    (job / "data").mkdir()
    for path in train:
        shutil.copy(path, job / "data" / path.name)
    # batches of 128 (FleetX's 4): every worker reads all 2400 lines, 19 steps each; what
    # is checked here, the save and its predictions, does not depend on the batch
    launch(job, "train.py", "--batch-size", "128", logs=tmp_path / "logs")
    model = job / "inference"
    manifest = json.loads((model / "base-00000" / "MANIFEST.json").read_text())
    assert manifest["input"]["pipe_command"] == "PYTHONHASHSEED=0 python reader.py"
    assert manifest["input"]["pipe_dir"] == str(job)
    assert manifest["input"]["schema"]["multislot_order"][0] == "dense_input"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    predicted = predict(model, test, cwd=elsewhere)
    rows = request_rows(model, test)
    served, described = serve(model, rows)
    assert predicted.shape == served.shape == (300,)
    np.testing.assert_allclose(served, predicted, rtol=0, atol=5e-7)  # predict prints 7 places
    assert described["request_columns"]["dense_lists"] == {"dense_input": 13}
    assert described["request_columns"]["slots"] == [f"C{i}" for i in range(1, 27)]
