"""An in-process online job: the real driver with a fake trainer and fake datasets.

With no process group, collectives are local, so :class:`OnlineDriver` runs in the test
process; the fake trainer records what the driver asks of it and writes real manifests,
so the model directory (checkpoints, inference chain) behaves as in a real job.
"""

from __future__ import annotations

import time
from pathlib import Path

from sparseps.files import manifest as mf
from sparseps.online.config import OnlineConfig
from sparseps.online.driver import OnlineDriver


class FakeMetrics:
    def __init__(self, count: int) -> None:
        self.count = count

    def to_dict(self) -> dict:
        return {"auc": 0.5, "logloss": 0.69, "count": self.count}


class FakeResult:
    def __init__(self, count: int) -> None:
        self.metrics = FakeMetrics(count)
        self.timings: dict[str, float] = {}  # PassResult.timings (the mode's figures)


class FakeDataset:
    """``batches`` batches of 10 samples; loading sleeps ``load_s`` (sleeping needs no CPU,
    so the timings hold on a loaded machine)."""

    def __init__(self, folders, *, load_s: float, batches: int) -> None:
        self.name = Path(folders[0]).parent.name + "/" + Path(folders[0]).name
        self.load_s, self.batches, self.loaded = load_s, batches, False

    def load_into_memory(self) -> None:
        time.sleep(self.load_s)
        self.loaded = True

    def global_shuffle(self, seed=None) -> None:
        assert self.loaded

    def release_memory(self) -> None:
        self.loaded = False

    def __len__(self) -> int:
        return 10 * self.batches

    def __iter__(self):
        assert self.loaded
        return iter(range(self.batches))


class FakeTrainer:
    """Records calls; training sleeps ``train_s``; saves write manifests only."""

    def __init__(self, *, train_s: float = 0.0) -> None:
        self.train_s, self.passes, self.calls = train_s, 0, []
        self.prepared: list[str] = []  # datasets handed to prefetch_pass, by name

    def load_checkpoint(self, path) -> dict:
        state = mf.read_manifest(Path(path))["state"]
        self.passes = int(state["passes"])
        self.calls.append(("load", Path(path).name))
        return state

    def evaluate(self, dataset) -> FakeMetrics:
        self.calls.append(("evaluate", dataset.name))
        return FakeMetrics(len(dataset))

    def train_from_dataset(self, dataset, *, print_period: int = 100,
                           on_batch=None) -> FakeResult:  # fmt: skip
        batches = list(dataset)
        for _ in batches:  # training sleeps train_s in all, on_batch after each batch
            time.sleep(self.train_s / max(len(batches), 1))
            if on_batch is not None:
                on_batch(None, None)
        seen = len(batches)
        self.calls.append(("train", seen))
        self.passes += 1
        return FakeResult(10 * seen)

    def prefetch_pass(self, dataset) -> None:
        self.prepared.append(dataset.name)

    def decay(self, rate=None) -> None:
        self.calls.append(("decay", rate))

    def shrink(self) -> dict:
        self.calls.append(("shrink",))
        return {"t": 0}

    def save_inference_model(self, directory, *, mode: str = "base", hooks=None) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        numbers = [int(f.name.split("-")[1]) for f in directory.glob("*-0*")]
        sequence = max(numbers) + 1 if numbers else 0  # as the real saves number them
        folder = directory / f"{mode}-{sequence:05d}"
        folder.mkdir()
        mf.write_manifest(
            folder, "sparseps-inference", {}, kind=mode, state={"passes": self.passes}
        )
        self.calls.append((mode, folder.name))
        return folder

    def save_checkpoint(self, directory, *, state=None, hooks=None) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        full = {"passes": self.passes, **(state or {})}
        mf.write_manifest(directory, "sparseps-checkpoint", {}, state=full)
        self.calls.append(("checkpoint", directory.name))


class FakeDriver(OnlineDriver):
    def __init__(self, config, trainer, *, load_s: float = 0.0, batches: int = 3, **kw) -> None:
        super().__init__(config, trainer, rank=0, world=1, **kw)
        self.load_s, self.batches = load_s, batches

    def _dataset(self, folders, **_):
        return FakeDataset(folders, load_s=self.load_s, batches=self.batches)


def fake_config(tmp_path: Path, *, days: int, passes_per_day: int, **sections) -> OnlineConfig:
    """A config over ``tmp_path/stream`` with every split of the schedule ready."""
    raw = {
        "data": {"root": str(tmp_path / "stream"), "split_minutes": 5, "splits_per_pass": 1,
                 "poll_s": 0.01, "wait_timeout_s": 5},
        "schedule": {"start_day": "20240101", "days": days, "passes_per_day": passes_per_day},
        "save": {"model_dir": str(tmp_path / "model")},
    }  # fmt: skip
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    config = OnlineConfig.from_dict(raw)
    from sparseps.online import DataLayout

    layout = DataLayout(config)
    for pass_id in layout.passes():
        for folder in layout.splits(pass_id):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "_SUCCESS").touch()
    return config
