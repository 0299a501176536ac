"""Per-pass reporting (log line, JSON lines, TensorBoard) and debugging dumps round trips."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from sparseps.errors import ConfigError, InputError
from sparseps.metrics import (
    CTRMetrics,
    DumpConfig,
    FieldDumper,
    JsonlReporter,
    MetricResult,
    TensorBoardReporter,
    dump_params,
    format_metrics,
    read_dump,
    read_jsonl,
)

RESULT = MetricResult(
    auc=0.7712, auc_defined=True, bucket_error=0.0125, logloss=0.45, mae=0.3, rmse=0.4,
    actual_ctr=0.25, predicted_ctr=0.24, copc=1.0416666, count=1000, clicks=250, mse=0.16,
    accuracy=0.8,
)  # fmt: skip


def test_format_metrics_line():
    line = format_metrics(RESULT, "pass: [3]")
    assert line == (
        "pass: [3], auc: [0.771200], bucket_error: [0.012500], logloss: [0.450000], "
        "mae: [0.300000], mse: [0.160000], rmse: [0.400000], accuracy: [0.800000], actual_ctr: [0.250000], "
        "predicted_ctr: [0.240000], copc: [1.041667], ins_num: [1000]"
    )
    empty = CTRMetrics(num_buckets=4).compute()
    assert format_metrics(empty).startswith("auc: [0.500000 (undefined)], ")
    m = CTRMetrics(num_buckets=4)
    m.update([0.2, 0.8], [0, 1], group=[1, 1])
    assert format_metrics(m.compute()).endswith("ins_num: [2], uauc: [1.000000], gauc: [1.000000]")


def test_jsonl_reporter_appends_one_object_per_pass(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    reporter = JsonlReporter(path)
    reporter.report(RESULT, pass_id=1, phase="train")
    reporter.report(RESULT, pass_id=1, phase="test", day="20240101")
    reporter.report(CTRMetrics(num_buckets=4).compute(), pass_id=2)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    records = read_jsonl(path)
    assert records == [json.loads(line) for line in lines]
    first, second, third = records
    assert (first["pass"], first["phase"], first["auc"], first["count"]) == (
        1,
        "train",
        0.7712,
        1000,
    )
    assert isinstance(first["time"], float) and first["time"] > 1.6e9
    assert (second["phase"], second["day"]) == ("test", "20240101")
    assert (third["pass"], third["auc"], third["auc_defined"], third["uauc"]) == (
        2,
        0.5,
        False,
        None,
    )
    with pytest.raises(ConfigError, match="phase"):
        reporter.report(RESULT, pass_id=3, phase="validation")
    with pytest.raises(ConfigError, match="pass_id"):
        reporter.report(RESULT, pass_id=-1)
    with pytest.raises(ConfigError, match="clash"):
        reporter.report(RESULT, pass_id=3, auc=1.0)
    assert len(read_jsonl(path)) == 3


def test_tensorboard_reporter(tmp_path):
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ConfigError, match="pip install tensorboard"):
            TensorBoardReporter(tmp_path / "tb")
        pytest.importorskip("tensorboard")  # reported as skipped: the writer path is untested
    with TensorBoardReporter(tmp_path / "tb") as tb:
        tb.report(RESULT, pass_id=0, phase="train")
        tb.report(RESULT, pass_id=1, phase="train")
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    auc = [t for t in events.Tags()["scalars"] if t.endswith("/auc")]
    assert len(auc) == 1
    points = events.Scalars(auc[0])
    assert [p.step for p in points] == [0, 1]
    assert points[0].value == pytest.approx(0.7712)


def test_field_dump_round_trip_over_passes_and_workers(tmp_path):
    fields = ["sample_id", "label", "pred", "C1", "dense"]
    ids = np.arange(5, dtype=np.uint64) + np.uint64(2**63)
    label = np.array([1, 0, 0, 1, 0], np.float32)
    pred = np.array([0.9, 0.1, 0.2, 0.7, 0.4], np.float32)
    c1_values = np.array([11, 12, 13, 14, 15, 16], np.uint64)  # sample 1 has no ids
    c1_offsets = np.array([0, 2, 2, 3, 5, 6])
    dense = np.arange(10, dtype=np.float32).reshape(5, 2)
    with FieldDumper(tmp_path, fields, worker_rank=1, rows_per_group=3) as d0:
        d0.begin_pass(7)
        # two batches: rows 0-1 and 2-4 (offsets re-based per batch)
        d0.add(
            sample_id=ids[:2],
            label=label[:2],
            pred=pred[:2],
            C1=(c1_values[:2], c1_offsets[:3]),
            dense=dense[:2],
        )
        d0.add(
            sample_id=ids[2:],
            label=label[2:],
            pred=pred[2:],
            C1=(c1_values[2:], c1_offsets[2:] - 2),
            dense=dense[2:],
        )
        path = d0.end_pass()
        d0.begin_pass(8)  # an empty pass still publishes a file
    assert path == tmp_path / "pass-00007" / "fields-worker-00001.parquet"
    got = read_dump(path)
    assert list(got) == fields
    assert got["sample_id"].dtype == np.uint64 and np.array_equal(got["sample_id"], ids)
    assert np.array_equal(got["label"], label) and np.array_equal(got["pred"], pred)
    values, offsets = got["C1"]
    assert np.array_equal(values, c1_values) and offsets.tolist() == c1_offsets.tolist()
    assert np.array_equal(got["dense"], dense)
    assert read_dump(tmp_path / "pass-00008" / "fields-worker-00001.parquet")["pred"].size == 0
    # a second worker, then the whole pass folder is read in rank order
    with FieldDumper(tmp_path, fields, worker_rank=0) as d1:
        d1.begin_pass(7)
        d1.add(
            sample_id=ids[:1],
            label=label[:1],
            pred=pred[:1],
            C1=(c1_values[:1], [0, 1]),
            dense=dense[:1],
        )
    merged = read_dump(tmp_path / "pass-00007")
    assert merged["sample_id"].tolist() == [ids[0]] + ids.tolist()
    values, offsets = merged["C1"]
    assert values.tolist() == [11] + c1_values.tolist() and offsets.tolist() == [
        0,
        1,
        3,
        3,
        4,
        6,
        7,
    ]
    assert not list(tmp_path.rglob(".*tmp*"))  # no temporary file left behind


def test_field_dumper_rejects_bad_batches(tmp_path):
    d = FieldDumper(tmp_path, ["a", "b"], worker_rank=0)
    with pytest.raises(InputError, match="begin_pass"):
        d.add(a=[1], b=[2])
    d.begin_pass(0)
    with pytest.raises(InputError, match="expected fields"):
        d.add(a=[1])
    with pytest.raises(InputError, match="row counts"):
        d.add(a=[1, 2], b=[3])
    with pytest.raises(InputError, match="offsets"):
        d.add(a=[1], b=(np.array([1, 2]), np.array([0, 1])))
    d.add(a=np.array([1]), b=np.array([2.0]))
    with pytest.raises(InputError, match="types changed"):
        d.add(a=np.array([1]), b=np.array([2], np.int8))
    d.close()
    assert read_dump(d.path(0))["a"].tolist() == [1]
    with pytest.raises(ConfigError):
        FieldDumper(tmp_path, ["bad name"], worker_rank=0)
    with pytest.raises(ConfigError):
        FieldDumper(tmp_path, [], worker_rank=0)


def test_dump_params_round_trip(tmp_path):
    arrays = {
        "mlp.0.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "mlp.0.bias": np.array([0.5, -0.5]),
        "emb.keys": np.array([2**64 - 1, 3], np.uint64),
    }
    path = dump_params(tmp_path, 4, arrays)
    assert path == tmp_path / "pass-00004" / "params.npz"
    got = read_dump(path)
    assert set(got) == set(arrays)
    for name, value in arrays.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value)
    per_worker = dump_params(tmp_path, 4, {"rows": np.ones((2, 2))}, worker_rank=3)
    assert per_worker.name == "params-worker-00003.npz"
    with pytest.raises(InputError):
        dump_params(tmp_path, 4, {})
    with pytest.raises(ConfigError):
        dump_params(tmp_path, 4, {"a/b": np.ones(1)})
    with pytest.raises(InputError):
        read_dump(tmp_path / "missing.parquet")


def test_dump_config_is_off_by_default():
    assert not DumpConfig().dump_fields and not DumpConfig().dump_params
    cfg = DumpConfig(directory="d", fields=["label", "pred"])
    assert cfg.fields == ("label", "pred") and cfg.dump_fields and not cfg.dump_params
    with pytest.raises(ConfigError, match="directory"):
        DumpConfig(fields=("pred",))
    with pytest.raises(ConfigError):
        DumpConfig(directory="d", params="w")
