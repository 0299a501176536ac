"""Issue 27: a pass whose data is mostly bad fails the online job, is not marked done, and
leaves the model files as they were; with the data fixed, a rerun does that pass.
``data.max_bad_ratio`` sets how many bad lines a pass may skip; ``data.format`` takes every
format of sparseps.data.

The real driver and the real InMemoryDataset over real TSV splits; a fake trainer (see
_fakes.py) so the test runs in one process.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from _fakes import FakeMetrics, FakeResult, FakeTrainer, fake_config

from sparseps.data import MAX_BAD_RATIO, Format
from sparseps.errors import ConfigError, InputError
from sparseps.online import DataLayout, Ledger
from sparseps.online.config import OnlineConfig
from sparseps.online.driver import OnlineDriver

GOOD = "\t".join(["1", *["2"] * 13, *["abc"] * 26])


class CountingTrainer(FakeTrainer):
    """FakeTrainer over real datasets: counts the samples it is given."""

    def evaluate(self, dataset) -> FakeMetrics:
        self.calls.append(("evaluate", len(dataset)))
        return FakeMetrics(len(dataset))

    def train_from_dataset(self, dataset, *, print_period: int = 100,
                           on_batch=None) -> FakeResult:  # fmt: skip
        seen = sum(len(b) for b in dataset)
        self.calls.append(("train", seen))
        self.passes += 1
        return FakeResult(seen)


def _files(model_dir: Path) -> dict[str, str]:
    """Checksums of the model files (checkpoints and inference saves)."""
    return {
        str(p.relative_to(model_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(model_dir.rglob("*"))
        if p.is_file() and p.name not in ("status.json",) and "ledger" not in p.name
        and not p.name.endswith(".lock")
    }  # fmt: skip


def _write(folder: Path, lines: list[str]) -> None:
    (folder / "part-00000.tsv").write_text("\n".join(lines) + "\n")


def _five_percent_bad_second_pass(config) -> None:
    first, second = (DataLayout(config).splits(p)[0] for p in DataLayout(config).passes())
    _write(first, [GOOD] * 100)
    bad = [GOOD] * 100
    for n in range(0, 100, 20):
        bad[n] = "1\t2\t3"  # 5 of 100 lines
    _write(second, bad)


def test_a_bad_pass_is_left_undone_and_the_model_unchanged(tmp_path):
    config = fake_config(tmp_path, days=1, passes_per_day=2,
                         save={"delta_every": 1, "checkpoint_every": 1})  # fmt: skip
    _five_percent_bad_second_pass(config)
    second = DataLayout(config).splits(DataLayout(config).passes()[1])[0]

    snapshot = {}

    def hook(event):
        if event.phase == "checkpointed" and event.pass_id.seq == 0:
            snapshot.update(_files(Path(config.model_dir)))

    trainer = CountingTrainer()
    with pytest.raises(InputError, match=r"5 of 100 lines read as format='criteo_tsv' were bad"):
        OnlineDriver(config, trainer, rank=0, world=1, on_phase=hook).run()
    assert ("train", 100) in trainer.calls and trainer.passes == 1  # pass 0 only
    assert [r["seq"] for r in Ledger.of(config.model_dir).passes()] == [0]
    assert snapshot and _files(Path(config.model_dir)) == snapshot  # untouched by pass 1

    # the data fixed, a rerun resumes after pass 0 and does pass 1
    _write(second, [GOOD] * 100)
    rerun = CountingTrainer()
    records = OnlineDriver(config, rerun, rank=0, world=1).run()
    assert [r["seq"] for r in records] == [1] and records[0]["samples"] == 100
    assert [r["seq"] for r in Ledger.of(config.model_dir).passes()] == [0, 1]


def test_an_all_bad_pass_fails_naming_the_format(tmp_path):
    config = fake_config(tmp_path, days=1, passes_per_day=1)
    (split,) = DataLayout(config).splits(DataLayout(config).passes()[0])
    _write(split, ["1 1 1 7"] * 10)  # multislot text where TSV is configured
    with pytest.raises(InputError, match="every line read as format='criteo_tsv' was bad"):
        OnlineDriver(config, CountingTrainer(), rank=0, world=1).run()
    assert Ledger.of(config.model_dir).passes() == []


def test_max_bad_ratio_from_the_config_reaches_the_datasets(tmp_path):
    config = fake_config(tmp_path / "lenient", days=1, passes_per_day=2,
                         data={"max_bad_ratio": 0.1})  # fmt: skip
    assert config.data.dataset_options()["max_bad_ratio"] == 0.1
    _five_percent_bad_second_pass(config)
    trainer = CountingTrainer()
    records = OnlineDriver(config, trainer, rank=0, world=1).run()
    assert [r["samples"] for r in records] == [100, 95]  # 5 bad lines skipped, under 10%
    assert [r["seq"] for r in Ledger.of(config.model_dir).passes()] == [0, 1]

    strict = fake_config(tmp_path / "strict", days=1, passes_per_day=2,
                         data={"max_bad_ratio": 0})  # fmt: skip
    first, second = (DataLayout(strict).splits(p)[0] for p in DataLayout(strict).passes())
    _write(first, [GOOD] * 100)
    _write(second, [GOOD] * 99 + ["1\t2"])  # one bad line in 100
    with pytest.raises(InputError, match=r"1 of 100 lines read as format='criteo_tsv' were bad"):
        OnlineDriver(strict, CountingTrainer(), rank=0, world=1).run()
    assert [r["seq"] for r in Ledger.of(strict.model_dir).passes()] == [0]


def test_data_config_takes_every_format_and_checks_max_bad_ratio():
    base = {"schedule": {"start_day": "20240101"}, "save": {"model_dir": "m"}}
    for fmt in Format:
        data = OnlineConfig.from_dict({**base, "data": {"root": "d", "format": fmt.value}}).data
        assert data.dataset_options() == {"pipe_command": None, "format": fmt.value,
                                          "max_bad_ratio": MAX_BAD_RATIO,
                                          "split": "static"}  # fmt: skip
    assert {f.value for f in Format} >= {"multislot", "multislot_string"}
    for value in (1.5, -0.1, "x", True, float("nan")):
        with pytest.raises(ConfigError, match="data.max_bad_ratio"):
            OnlineConfig.from_dict({**base, "data": {"root": "d", "max_bad_ratio": value}})
    with pytest.raises(ConfigError, match="data.format"):
        OnlineConfig.from_dict({**base, "data": {"root": "d", "format": "xml"}})
