"""examples/slot_dnn: PaddleRec's ``models/rank/slot_dnn`` with ``config_online.yaml``
and its online trainer, ported, end to end.

The port keeps PaddleRec's layout, its ``config_online.yaml`` and its LICENSE unchanged
(checked against the upstream blobs). The config's ``table_parameters.embedding`` maps
onto the servers' table one field to one field: checked on the config itself, and on
what the servers wrote into the inference save of a job launched as PaddleRec's online
trainer is (``sparseps launch ... static_ps_online_trainer.py -m config_online.yaml``, 1
server, 2 workers, from the model's folder) on a few thousand generated slot lines in
``DAY/HHMM`` folders. The day's end holds the accessor's rules (rows below
``delete_threshold`` gone after the shrink; embedx parts only for rows that earned one),
and ``sparseps predict`` on the day's inference chain, run from another folder with no
schema flag, predicts what the trainer predicted for the same lines (its infer dump).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from _ports import EXAMPLES, git_blob, launch, predict

from sparseps.files import manifest as mf
from sparseps.files.shards import read_shard
from sparseps.worker.predict import read_predictions

pytestmark = pytest.mark.timeout(600)

PORT = EXAMPLES / "slot_dnn"
MODEL = "models/rank/slot_dnn"
# PaddleRec 656326ad: path -> git blob
UPSTREAM = {
    f"{MODEL}/config_online.yaml": "e4c60ce42f14bb605c08066bd9cc34b48e8a5d28",
    "LICENSE": "261eeb9e9f8b2b4b0d119366dda99c6fd7d35c64",
}
DAY, NEXT_DAY = "20190720", "20190721"
SLOTS = 300  # hyper_parameters.slot_num
# the table the config's table_parameters.embedding describes, written out by hand from
# the yaml (TableConfig.to_dict of the sparseps table), with cvm (fea_dim 11 = 2 + 9)
ADAGRAD = {"name": "sparse_adagrad", "lr": 0.05, "initial_g2sum": 3.0, "l2": 0.0,
           "clip": [-10.0, 10.0]}  # fmt: skip
EXPECTED = {
    "name": "embedding",
    "dim": 9,  # embed_w + embedx_dim 8 = emb_dim
    "rule": ADAGRAD,  # embedx_sgd_param
    "initializer": {"kind": "uniform", "low": -0.0001, "high": 0.0001},  # initial_range
    "lifecycle": {
        "admission": "always",
        "admit_count": 1,
        "admit_probability": 1.0,
        "admit_score": 0.0,
        "nonclick_coeff": 0.1,
        "click_coeff": 1.0,
        "decay_rate": 0.98,
        "shrink_score": 0.8,
        "shrink_unseen_days": 30,
        "base_score": 1.5,
    },  # fmt: skip
    "seed": 0,
    "accessor": {
        "embed_dim": 1,
        "embed_rule": ADAGRAD,
        "embed_initializer": {"kind": "zeros"},
        "embedx_threshold": 10.0,
        "embedx_dtype": "float32",
        "cvm": True,
        "delta_threshold": 0.25,
        "delta_keep_days": 16,
        "slot_dims": [],
    },  # fmt: skip
}


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slot_lines(path: Path, rows: int, seed: int) -> Path:
    """``rows`` lines of slot_dnn's data (``feasign:slot``, slot 1 the click): 24 of the
    300 slots a line, ids Zipf-distributed per slot (a few ids seen hundreds of times, so
    they earn an embedx), clicks drawn from a planted logistic model of the ids."""
    rng = np.random.default_rng(seed)
    weight = np.random.default_rng(0).normal(0.0, 0.8, (SLOTS, 64))
    lines = []
    for _ in range(rows):
        slots = np.sort(rng.choice(SLOTS, 24, replace=False))
        ids = np.minimum(rng.zipf(1.6, 24), 64) - 1
        logit = weight[slots, ids].sum() / 3 - 2.5
        click = int(rng.random() < 1 / (1 + np.exp(-logit)))
        tokens = [f"{click}:1"] + [
            f"{(s + 2) * 1000 + i}:{s + 2}" for s, i in zip(slots, ids, strict=True)
        ]
        lines.append(" ".join(tokens))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_paddlerecs_config_and_licence_are_kept():
    for path, blob in UPSTREAM.items():
        assert git_blob((PORT / path).read_bytes()) == blob, path


def test_table_parameters_map_one_to_one():
    tables = _module(PORT / "tools/utils/static_ps/table_parameters.py", "slot_dnn_tables")
    config = yaml.safe_load((PORT / MODEL / "config_online.yaml").read_text())
    block = config["table_parameters"]["embedding"]
    table = tables.table_config("embedding", block, emb_dim=9, cvm=True)
    assert table.to_dict() == EXPECTED
    assert table.pull_dim == block["accessor"]["fea_dim"] == 11
    for field, value, says in [
        ("accessor_class", "DownpourCtrAccessor", "accessor_class"),
        ("embedx_dim", 7, "emb_dim is 9"),
        ("fea_dim", 9, "a pull is 11 wide"),
        ("bogus", 1, "unknown field"),
    ]:
        changed = yaml.safe_load(yaml.safe_dump(block))
        changed["accessor"][field] = value
        with pytest.raises(ValueError, match=says):
            tables.table_config("embedding", changed, emb_dim=9, cvm=True)


def _score(show: np.ndarray, click: np.ndarray) -> np.ndarray:
    return 0.1 * (show - click) + 1.0 * click  # nonclk_coeff, click_coeff


def test_slot_dnn_online_job_uses_the_configs_accessor_and_predicts_as_trained(tmp_path):
    job = tmp_path / "PaddleRec"
    shutil.copytree(PORT, job, ignore=shutil.ignore_patterns("__pycache__", ".ruff_cache"))
    data = tmp_path / "data"
    # split_interval 720 and split_per_pass 1: two passes a day (folders 0000 and 1200)
    for n, folder in enumerate(("0000", "1200")):
        for part in range(2):
            slot_lines(data / DAY / folder / f"part-{part}", 900, seed=10 * n + part)
    out, dump = tmp_path / "output_model", tmp_path / "dump"
    # the inference saves keep every row (base and delta thresholds 0) so that the
    # predictor sees what the trainer saw; batches of 128 rows, not 32 (a quarter of the
    # steps: what is checked here, the counts, the saves and the predictions, does not
    # depend on the batch); every other setting of the table and the model is the config's
    accessor = "table_parameters.embedding.accessor.ctr_accessor_param"
    options = [f"runner.train_data_dir={data}", f"runner.model_save_path={out}",
               f"runner.start_day={DAY}", f"runner.end_day={DAY}", "runner.split_interval=720",
               "runner.split_per_pass=1", "runner.print_interval=5",
               "runner.train_batch_size=128", "runner.infer_batch_size=128",
               "runner.need_infer_dump=True", f"runner.infer_dump_fields_dir={dump}",
               f"{accessor}.base_threshold=0", f"{accessor}.delta_threshold=0"]  # fmt: skip
    launch(job / MODEL, "../../../tools/static_ps_online_trainer.py", "-m", "config_online.yaml",
           "-o", *options, logs=tmp_path / "logs")  # fmt: skip

    # what the servers use: the config of the table in the shards they wrote
    chain = out / DAY  # the day's chain: base-00000 (pass 1), delta-00001 (pass 2)
    assert sorted(p.name for p in chain.iterdir() if "-" in p.name) == ["base-00000", "delta-00001"]
    shard = next((chain / "delta-00001").glob("embedding.delta-*.arrow"))
    meta, _ = read_shard(shard)
    want = json.loads(json.dumps(EXPECTED))
    want["lifecycle"]["base_score"] = 0.0
    want["accessor"]["delta_threshold"] = 0.0
    assert meta["config"] == want

    # the day's end: decay (0.98) then shrink (delete_threshold 0.8) before the batch model
    batch = out / NEXT_DAY / "0"
    files = json.loads((batch / mf.MANIFEST).read_text())["files"]
    rows = [read_shard(batch / name)[1] for name in files if name.startswith("embedding.shard-")]
    show = np.concatenate([r["show"] for r in rows])
    click = np.concatenate([r["click"] for r in rows])
    has_embedx = np.concatenate([r["has_embedx"] for r in rows]).astype(bool)
    assert show.size > 0 and _score(show, click).min() >= 0.8 - 1e-6
    assert 0 < has_embedx.sum() < has_embedx.size  # embedx_threshold 10: only some earned one
    assert _score(show, click)[has_embedx].max() >= 10 * 0.98 - 1e-4

    # sparseps predict on the day's chain == the trainer's infer dump of pass 2: one
    # command on the pass's folder (its files in name order, as the dump numbers them;
    # each command pays ~5 CPU-s of imports before its first row)
    dumped = read_predictions(dump / DAY / "2")
    by_id = dict(
        zip(dumped.column("key").to_pylist(), dumped.column("pred").to_pylist(), strict=True)
    )
    pass_folder = data / DAY / "1200"
    lines = [len(path.read_text().splitlines()) for path in sorted(pass_folder.iterdir())]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    predicted = predict(chain, pass_folder, cwd=elsewhere)
    assert predicted.size == len(by_id) == sum(lines) == 1800  # both files, each line once
    trained = np.array([by_id[(file_no << 40) | i] for file_no, n in enumerate(lines)
                        for i in range(n)])  # fmt: skip
    np.testing.assert_allclose(predicted, trained, rtol=0, atol=5e-7)  # 7 places printed
