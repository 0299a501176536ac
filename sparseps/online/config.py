"""The YAML config of an online job, as frozen dataclasses validated at load.

Example (every key but ``data.root``, ``schedule.start_day`` and ``save.model_dir`` has a
default)::

    job:      {server_num: 1, worker_num: 2, mode: sync}
    data:     {root: /data/stream, pattern: "{day}/{hhmm}", split_minutes: 5,
               splits_per_pass: 12, done_marker: _SUCCESS, wait_timeout_s: 3600}
    schedule: {start_day: "20240101", days: 3}
    model:    {emb_dim: 8, hidden: [64, 32], dense_lr: 0.001, deep_lr: 0.01}
    save:     {model_dir: /models/ctr, delta_every: 1, checkpoint_every: 4}
    predict:  {enabled: true, key: item, outputs: [item_vec], unique_keys: true}

Any job, not only the built-in wide&deep on Criteo: ``data.schema`` (a built-in name or
the fields of a :class:`sparseps.data.Schema`), ``data.format`` and ``data.pipe_command``,
``model.builder`` (``module:function`` building the model from the schema and
``model.params``) and ``model.loss`` (``module:name`` of a loss).

Unknown sections and keys are rejected (one ``ConfigError`` names every one of them and
lists the accepted keys); every value is type- and range-checked and an error names
``section.key``.

This module is the whole config (:class:`OnlineConfig`, the checks across sections, the
YAML file); each section is its own module (``config_job``, ``config_data``,
``config_model``, ``config_schedule``) and the value checks they share are in
``config_values``. The section classes are re-exported here, where callers import them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .config_data import MINUTES_PER_DAY, DataConfig
from .config_job import JobConfig
from .config_model import ModelConfig
from .config_schedule import PredictConfig, SaveConfig, ScheduleConfig
from .config_values import reject_unknown

__all__ = [
    "DataConfig",
    "JobConfig",
    "ModelConfig",
    "OnlineConfig",
    "PredictConfig",
    "SaveConfig",
    "ScheduleConfig",
    "load_config",
]

_SECTIONS = {
    "job": JobConfig,
    "data": DataConfig,
    "schedule": ScheduleConfig,
    "model": ModelConfig,
    "save": SaveConfig,
    "predict": PredictConfig,
}
_REQUIRED = {"data": ("root",), "schedule": ("start_day",), "save": ("model_dir",)}


@dataclass(frozen=True)
class OnlineConfig:
    """The whole job: one section per concern."""

    job: JobConfig
    data: DataConfig
    schedule: ScheduleConfig
    model: ModelConfig
    save: SaveConfig
    predict: PredictConfig = PredictConfig()

    def __post_init__(self) -> None:
        per_day = MINUTES_PER_DAY // (self.data.split_minutes * self.data.splits_per_pass)
        if self.schedule.passes_per_day is not None and self.schedule.passes_per_day > per_day:
            raise ConfigError(
                f"schedule.passes_per_day: {self.schedule.passes_per_day} passes of "
                f"{self.data.splits_per_pass} x {self.data.split_minutes} min do not fit in a "
                f"day (at most {per_day})"
            )

    @property
    def passes_per_day(self) -> int:
        if self.schedule.passes_per_day is not None:
            return self.schedule.passes_per_day
        return MINUTES_PER_DAY // (self.data.split_minutes * self.data.splits_per_pass)

    @property
    def model_dir(self) -> Path:
        return Path(self.save.model_dir)

    @property
    def log_dir(self) -> Path:
        return Path(self.job.log_dir) if self.job.log_dir else self.model_dir / "log"

    @classmethod
    def from_dict(cls, raw: Any, *, base: Path | None = None) -> OnlineConfig:
        """Build from a parsed YAML mapping; relative paths resolve against ``base``."""
        if not isinstance(raw, dict):
            raise ConfigError(
                f"online config: expected a mapping of sections, got {type(raw).__name__}"
            )
        for name in _SECTIONS:
            if not isinstance(raw.get(name) or {}, dict):
                raise ConfigError(f"{name}: expected a mapping, got {raw[name]!r}")
        reject_unknown(
            raw, {name: [f.name for f in fields(kind)] for name, kind in _SECTIONS.items()}
        )
        built = {}
        for name, kind in _SECTIONS.items():
            section = raw.get(name) or {}
            for key in _REQUIRED.get(name, ()):
                if key not in section:
                    raise ConfigError(f"{name}.{key}: required")
            section = dict(section)
            if base is not None:
                for key in ("root", "model_dir", "log_dir", "init_checkpoint", "data"):
                    value = section.get(key)
                    if isinstance(value, str) and value and not os.path.isabs(value):
                        section[key] = str((base / value).resolve())
            built[name] = kind(**section)
        return cls(**built)

    def to_dict(self) -> dict:
        out = {}
        for name in _SECTIONS:
            section = getattr(self, name)
            out[name] = {f.name: _plain(getattr(section, f.name)) for f in fields(section)}
        return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def load_config(path: str | os.PathLike) -> OnlineConfig:
    """Read and validate a YAML config; relative paths are relative to the file's folder.

    Raises:
        ConfigError: the file is missing, not YAML, or a value is invalid (names the key).
    """
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"online config {path}: cannot read ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"online config {path}: not valid YAML ({exc})") from None
    try:
        return OnlineConfig.from_dict(raw, base=path.resolve().parent)
    except ConfigError as exc:
        raise ConfigError(f"online config {path}: {exc}") from None
