"""The online YAML builds ``Strategy``, ``Lifecycle`` and the ``LaunchConfig`` through
their own ``from_dict`` (issue 53): one schema, one set of defaults, every mode."""

from __future__ import annotations

import pytest

import sparseps as sps
from sparseps.errors import ConfigError
from sparseps.launch.config import LaunchConfig
from sparseps.online.config import OnlineConfig
from sparseps.online.online_cli import launch_config
from sparseps.worker.strategy import MODES

BASE = {
    "data": {"root": "/stream", "splits_per_pass": 12},
    "schedule": {"start_day": "20240101", "days": 2},
    "save": {"model_dir": "/model"},
}

# every mode Strategy accepts, as a name and with the knobs of its variants
MODE_VALUES = [
    *MODES,
    {"name": "sync", "backup_workers": 1},  # backup workers
    {"name": "async", "max_staleness": 4},  # bounded staleness
    {"name": "geo", "k_steps": 20},
    {"name": "heter", "sync": True},
    {"name": "gpups", "device": "cpu"},
    {"name": "hybrid", "push_merge_window": 4},
]


def _online(**sections) -> OnlineConfig:
    raw = {k: dict(v) for k, v in BASE.items()}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return OnlineConfig.from_dict(raw)


def _heter(mode) -> dict:
    name = mode if isinstance(mode, str) else mode["name"]
    return {"heter_worker_num": 1} if MODES[name].dense_on_heter_workers else {}


@pytest.mark.parametrize("mode", MODE_VALUES, ids=str)
def test_every_mode_gives_the_strategy_of_strategy_from_dict(mode):
    """The YAML's strategy is the library's: the same mode and the same defaults of every
    other knob (before: RPC timeout 120 s against 60 s, collective 3600 s against 600 s)."""
    config = _online(job={"mode": mode, **_heter(mode)})
    library = sps.Strategy.from_dict({"mode": mode})
    assert config.job.strategy == library
    assert config.job.training_mode == library.mode
    default = sps.Strategy()
    for knob in ("prefetch", "push_queue_size", "rpc_timeout", "collective_timeout"):
        assert getattr(config.job.strategy, knob) == getattr(default, knob), knob
    assert config.job.collective_timeout_s == default.collective_timeout  # what the driver waits
    assert OnlineConfig.from_dict(config.to_dict()) == config


def test_the_strategy_knobs_reach_the_strategy():
    config = _online(job={"mode": "async", "rpc_timeout_s": 30, "collective_timeout_s": 900,
                          "prefetch": False, "push_queue_size": 2})  # fmt: skip
    assert config.job.strategy == sps.Strategy(
        mode=sps.Async(), rpc_timeout=30.0, collective_timeout=900.0, prefetch=False,
        push_queue_size=2,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"mode": {"name": "geo", "k": 1}}, r"job.mode geo: unknown knob\(s\) \['k'\]"),
        ({"mode": "fast"}, "job.mode"),
        ({"push_queue_size": 0}, "job.push_queue_size"),
        ({"prefetch": "yes"}, "job.prefetch"),
    ],
)
def test_a_bad_strategy_knob_names_the_yaml_key(job, message):
    with pytest.raises(ConfigError, match=message):
        _online(job=job)


def test_strategy_from_dict_refuses_an_unknown_key():
    with pytest.raises(ConfigError, match="unknown key.*k_steps.*known: mode"):
        sps.Strategy.from_dict({"mode": "geo", "k_steps": 5})
    assert sps.Strategy.from_dict({}) == sps.Strategy()


def test_the_lifecycle_is_lifecycle_from_dict():
    assert _online().model.build_lifecycle() == sps.Lifecycle()  # one set of defaults
    config = _online(model={"decay_rate": 0.9, "lifecycle": {"admission": "count",
                                                             "admit_count": 3}})  # fmt: skip
    assert config.model.build_lifecycle() == sps.Lifecycle.from_dict(
        {"decay_rate": 0.9, "admission": "count", "admit_count": 3}
    )
    assert config.model.decay_rate == 0.9 and _online().model.decay_rate == 0.98
    with pytest.raises(ConfigError, match="model.lifecycle: decay_rate given twice"):
        _online(model={"decay_rate": 0.9, "lifecycle": {"decay_rate": 0.8}})
    with pytest.raises(ConfigError, match="model.lifecycle.admit_count"):
        _online(model={"lifecycle": {"admission": "count", "admit_count": 0}})
    with pytest.raises(ConfigError, match="unknown"):
        _online(model={"lifecycle": {"admit": 1}})


def test_the_launch_config_is_launch_config_from_dict(tmp_path):
    config = _online(job={"server_num": 2, "worker_num": 3,
                          "launch": {"max_restarts": 2, "replicas": 1, "file_roots": ["/data"]}})  # fmt: skip
    launched = launch_config(config, tmp_path / "job.yaml", job_id="j1")
    assert launched == LaunchConfig.from_dict({
        "script": launched.script, "script_args": (str((tmp_path / "job.yaml").resolve()),),
        "server_num": 2, "worker_num": 3, "log_dir": "/model/log", "job_id": "j1",
        "max_restarts": 2, "replicas": 1, "file_roots": ["/data"],
    })  # fmt: skip
    for launch, message in (
        ({"server_num": 2}, "job.launch: server_num set by the job section"),
        ({"max_restart": 2}, "job.launch: unknown setting"),
        ({"replicas": -1}, "--replicas"),
    ):
        with pytest.raises(ConfigError, match=message):
            _online(job={"launch": launch})
