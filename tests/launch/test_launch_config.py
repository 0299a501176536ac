"""LaunchConfig: one frozen config from the command line, a mapping or Python, checked once."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from sparseps.errors import ConfigError
from sparseps.launch import launch_cli
from sparseps.launch.config import LaunchConfig


def _parse(argv):
    parser = argparse.ArgumentParser(prog="sparseps launch")
    launch_cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_command_line_and_the_config_are_one_thing():
    argv = ["--server-num", "2", "--worker_num", "3", "--file-root", "/a", "--file-root", "/b",
            "--replicas", "1", "--no-secure", "--heter-worker-num", "2", "--heter-device",
            "cuda,cpu", "--grace-s", "2.5", "job.py", "--epochs", "2"]  # fmt: skip
    config = LaunchConfig.from_args(_parse(argv))
    assert (config.server_num, config.worker_num, config.replicas) == (2, 3, 1)
    assert config.file_roots == ("/a", "/b") and config.secure is False
    assert config.script == "job.py" and config.script_args == ("--epochs", "2")
    assert LaunchConfig.from_args(_parse(config.argv())) == config  # argv() round trips
    assert LaunchConfig.from_dict({"script": "job.py", "server_num": 2}).server_num == 2
    assert config.child_settings()["SPARSEPS_REPLICAS"] == "1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server_num = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"backend": "slurm"}, "--backend"),
        ({"heter_device": "cuda"}, "--heter-device: the job has no heter workers"),
        ({"heter_worker_num": 2, "heter_device": "tpu"}, "heter"),
        ({"address": "ray://x"}, "--address applies only to --backend ray"),
        ({"grace_s": 0}, "--grace-s"),
        ({"rendezvous_timeout_s": float("inf")}, "--rendezvous-timeout-s"),
        ({"replicas": -1}, "--replicas"),
        ({"replicas": 1, "backend": "ray"}, "only --backend local routes around"),
        ({"status_port": 70000}, "--status-port"),
        ({"server_nums": 2}, "unknown setting"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(values, message):
    with pytest.raises(ConfigError, match=message):
        LaunchConfig.from_dict({"script": "job.py", **values})
