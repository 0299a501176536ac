"""examples/paddlerec_wide_deep: PaddleRec's ``models/rank/wide_deep`` with
``config_cpups.yaml`` and ``tools/static_ps_trainer.py``, ported, end to end.

The port keeps PaddleRec's layout and files (the config and ``common_ps.py`` unchanged,
the reader unchanged but for its import line: each checked against its upstream blob). It
is copied to a folder of its own, launched there as PaddleRec's trainer is (``sparseps
launch ... tools/static_ps_trainer.py -m models/rank/wide_deep/config_cpups.yaml -o ...``,
1 server, 2 workers) on a few thousand lines of PaddleRec's slot text, and saves an
inference model per epoch; ``sparseps predict`` and ``sparseps serve`` then run on it
from another folder with no schema flag and answer the same predictions.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from _ports import EXAMPLES, criteo_raw, git_blob, launch, predict, request_rows, serve, slot_text

pytestmark = pytest.mark.timeout(600)

PORT = EXAMPLES / "paddlerec_wide_deep"
# PaddleRec 656326ad: path -> git blob
UPSTREAM = {
    "models/rank/wide_deep/queuedataset_reader.py": "587f822bb4ff07ea1b46ec7d27f9a5c3a8087d1d",
    "models/rank/wide_deep/config_cpups.yaml": "42ed70a53a54b0735b19eaeaa93c68c41318d1b0",
    "tools/utils/static_ps/common_ps.py": "c5d3919ca5f54aef07c7b3ef8ffff6c86d0e577e",
    "LICENSE": "261eeb9e9f8b2b4b0d119366dda99c6fd7d35c64",
}


def test_paddlerecs_files_are_kept_but_for_the_readers_import_line():
    for path, blob in UPSTREAM.items():
        data = (PORT / path).read_bytes()
        if path.endswith("queuedataset_reader.py"):
            ours = b"import sparseps.data as fleet\n"
            assert data.count(ours) == 1
            data = data.replace(ours, b"import paddle.distributed.fleet as fleet\n")
        assert git_blob(data) == blob, path


def test_paddlerec_wide_deep_trains_saves_predicts_and_serves(tmp_path):
    job = tmp_path / "PaddleRec"
    shutil.copytree(PORT, job, ignore=shutil.ignore_patterns("__pycache__", ".ruff_cache"))
    train, test = criteo_raw(tmp_path / "gen", rows=2400, files=2, seed=12)
    for path in train:
        slot_text(path, tmp_path / "train" / path.name)
    test = slot_text(test, tmp_path / "test" / "part-0")
    options = [f"runner.train_data_dir={tmp_path / 'train'}", "runner.epochs=1",
               "runner.thread_num=1", "runner.train_batch_size=64", "runner.print_interval=10",
               f"runner.model_save_path={tmp_path / 'model'}"]  # fmt: skip
    launch(job, "tools/static_ps_trainer.py", "-m", "models/rank/wide_deep/config_cpups.yaml",
           "-o", *options, logs=tmp_path / "logs")  # fmt: skip
    model = tmp_path / "model" / "0"  # model_save_path/epoch, as PaddleRec saves
    recorded = json.loads((model / "base-00000" / "MANIFEST.json").read_text())["input"]
    assert recorded["pipe_command"].startswith(
        "python models/rank/wide_deep/queuedataset_reader.py"
    )
    assert recorded["pipe_dir"] == str(job)
    assert recorded["schema"]["multislot_order"][0] == "label"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    predicted = predict(model, test, cwd=elsewhere)
    served, described = serve(model, request_rows(model, test))
    assert predicted.shape == served.shape == (300,)
    np.testing.assert_allclose(served, predicted, rtol=0, atol=5e-7)  # predict prints 7 places
    assert described["request_columns"]["dense_lists"] == {"dense_input": 13}
