"""Online pieces without processes: config validation, data layout, ledger rule."""

from __future__ import annotations

import time

import pytest
import yaml

from sparseps.errors import ConfigError, DeadlineError
from sparseps.online import DataLayout, Ledger, load_config
from sparseps.online.config import OnlineConfig
from sparseps.online.ledger import LedgerError

BASE = {
    "data": {"root": "stream", "splits_per_pass": 12},
    "schedule": {"start_day": "20240101", "days": 2},
    "save": {"model_dir": "model"},
}


def _config(tmp_path, **changes) -> OnlineConfig:
    raw = {k: dict(v) for k, v in BASE.items()}
    for key, value in changes.items():
        section, name = key.split("__")
        raw.setdefault(section, {})[name] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def test_defaults_and_relative_paths(tmp_path):
    config = _config(tmp_path)
    assert config.data.root == str(tmp_path / "stream")
    assert config.model_dir == tmp_path / "model"
    assert config.log_dir == tmp_path / "model" / "log"
    assert config.passes_per_day == 24  # 1440 min / (12 x 5 min)
    assert config.job.mode == "sync" and config.model.hidden == (64, 32)
    assert config.data.preload is True and config.save.keep_bases == 2
    assert OnlineConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data__patern": "x"}, "data.patern: unknown key"),
        ({"job__mode": "fast"}, "job.mode"),
        ({"job__worker_num": 0}, "job.worker_num"),
        ({"data__split_minutes": 7}, "data.split_minutes: must divide a day"),
        ({"data__pattern": "{day}/{hm}"}, "data.pattern"),
        ({"schedule__start_day": "2024-01-01"}, "schedule.start_day"),
        ({"schedule__passes_per_day": 25}, "schedule.passes_per_day"),
        ({"save__delta_every": -1}, "save.delta_every"),
        ({"model__hidden": []}, "model.hidden"),
        ({"model__decay_rate": 0}, "model.decay_rate"),
        ({"extra__x": 1}, "unknown section 'extra'"),
        ({"data__preload": "yes"}, "data.preload: expected true or false"),
        ({"save__keep_bases": 0}, "save.keep_bases: expected an integer >= 1"),
        ({"save__check_inference": 1}, "save.check_inference: expected true or false"),
        # YAML's .inf / .nan: a timeout that never ends is refused, as is any non-finite number
        ({"job__rpc_timeout_s": float("inf")}, "job.rpc_timeout_s: expected a finite number"),
        (
            {"job__collective_timeout_s": float("inf")},
            "job.collective_timeout_s: expected a finite",
        ),
        ({"data__wait_timeout_s": float("inf")}, "data.wait_timeout_s: expected a finite number"),
        ({"data__poll_s": float("nan")}, "data.poll_s: expected a finite number"),
        ({"model__shrink_score": float("inf")}, "model.shrink_score: expected a finite number"),
    ],
)
def test_bad_values_name_the_key(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        _config(tmp_path, **change)


def test_every_unknown_key_and_section_is_named_at_once(tmp_path):
    path = tmp_path / "job.yaml"
    raw = {k: dict(v) for k, v in BASE.items()}
    raw["data"].update(patern="x", batchsize=3)
    raw["save"]["keep_base"] = 1
    raw["extra"] = {}
    raw["other"] = {}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    for part in ("unknown sections 'extra', 'other'", "data.batchsize: unknown key",
                 "data.patern: unknown key", "save.keep_base: unknown key", "keep_bases"):  # fmt: skip
        assert part in message, message


def test_required_key(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"data": {"root": "x"}, "save": {"model_dir": "m"}}))
    with pytest.raises(ConfigError, match="schedule.start_day: required"):
        load_config(path)


def test_layout_passes_and_splits(tmp_path):
    config = _config(tmp_path, schedule__passes_per_day=2, data__splits_per_pass=3)
    layout = DataLayout(config)
    passes = layout.passes()
    assert [(p.seq, p.day, p.index) for p in passes] == [
        (0, "20240101", 0), (1, "20240101", 1), (2, "20240102", 0), (3, "20240102", 1)
    ]  # fmt: skip
    assert [p.name for p in layout.splits(passes[3])] == ["0015", "0020", "0025"]
    assert layout.splits(passes[3])[0].parent.name == "20240102"
    assert layout.is_last_of_day(passes[1]) and not layout.is_last_of_day(passes[2])
    custom = _config(tmp_path, data__pattern="{year}/{month}/{dd}/{hour}-{minute}")
    assert DataLayout(custom).split_path("20240131", 13).relative_to(
        tmp_path / "stream"
    ).as_posix() == ("2024/01/31/01-05")


def test_wait_ready_times_out_naming_the_split(tmp_path):
    config = _config(tmp_path, data__splits_per_pass=1, data__poll_s=0.05)
    layout = DataLayout(config)
    first = layout.passes()[0]
    folder = layout.splits(first)[0]
    folder.mkdir(parents=True)
    start = time.monotonic()
    with pytest.raises(DeadlineError, match="data.wait_timeout_s") as info:
        layout.wait_ready(first, timeout=0.3)
    # the 0.3 s limit, not the 3600 s default (room for a loaded box)
    assert 0.25 < time.monotonic() - start < 10 and str(folder) in str(info.value)
    (folder / "_SUCCESS").touch()
    assert layout.wait_ready(first, timeout=0.3) == [folder]


def _record(seq: int, **extra) -> dict:
    """A pass record with the fields every ledger line of a pass holds."""
    return {"kind": "pass", "seq": seq, "day": "20240101", "pass": seq,
            "splits": [f"stream/20240101/{seq:04d}"], "eval": {"auc": 0.5}, **extra}  # fmt: skip


def test_ledger_supersedes_passes_after_the_checkpoint(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    for seq in range(4):
        ledger.append(_record(seq, v="old"))
    # restart from the checkpoint of seq 1: passes 2 and 3 are trained again
    ledger.resume(1, "ckpt-1", _record(1))
    assert [r["seq"] for r in ledger.passes()] == [0, 1]
    ledger.append(_record(2, v="new"))
    assert [(r["seq"], r.get("v")) for r in ledger.passes()] == [(0, "old"), (1, "old"), (2, "new")]


def test_ledger_restores_the_checkpointed_record_and_survives_a_torn_line(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append(_record(0))
    with open(ledger.path, "ab") as f:
        f.write(b'{"kind": "pass", "se')  # a crash mid-append
    assert [r["seq"] for r in ledger.passes()] == [0]
    # crash between checkpoint 1 and its ledger line: the resume restores the record
    ledger.resume(1, "ckpt-1", _record(1))
    assert [r["seq"] for r in ledger.passes()] == [0, 1]
    assert ledger.path.read_bytes().count(b"\n") == 3  # torn line cut off, 3 whole lines


def test_ledger_resume_never_appends_a_record_out_of_order(tmp_path):
    """The newest checkpoint is ahead of the ledger by more than one pass (lines deleted):
    the resume refuses, naming the missing passes, and appends nothing; a ledger that
    starts after the checkpoint's pass (its first lines deleted) gets the resume line only."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append(_record(0))
    before = ledger.path.read_bytes()
    with pytest.raises(LedgerError, match=r"records of passes 1\.\.2 are missing"):
        ledger.resume(3, "ckpt-3", _record(3))
    assert ledger.path.read_bytes() == before
    later = Ledger(tmp_path / "later.jsonl")
    later.append(_record(5))
    later.resume(3, "ckpt-3", _record(3))
    assert [r["kind"] for r in later.records()] == ["pass", "resume"]
    assert later.passes() == []
