"""The launcher's backends (issue 53): one ``Backend`` protocol, one table from
``LaunchConfig.backend`` to its implementation, and ``launch(config)`` dispatching through
it; the Ray backend and ``sparseps k8s`` take the ``LaunchConfig`` itself."""

from __future__ import annotations

import argparse
import inspect
import signal
import threading
from pathlib import Path

import pytest
import yaml

from sparseps.errors import ConfigError
from sparseps.launch import k8s
from sparseps.launch.config import BACKEND_NAMES, KubernetesConfig, LaunchConfig
from sparseps.launch.launch_cli import BACKENDS, Backend, backend_of, launch

JOB = Path(__file__).resolve().parent / "scripts" / "job.py"


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_every_backend_implements_the_protocol(name):
    assert set(BACKENDS) == set(BACKEND_NAMES)  # the config's names are the table's keys
    if name == "ray":
        pytest.importorskip("ray")
    backend = backend_of(name)
    assert isinstance(backend, Backend) and backend.name == name
    # the backends take the config itself: no argparse.Namespace anywhere on the way
    assert inspect.signature(type(backend).launch).parameters["config"].annotation in (
        "LaunchConfig",
        LaunchConfig,
    )


def test_the_ray_and_kubernetes_code_take_the_launch_config():
    from sparseps.launch import ray_placement

    for module in (k8s, ray_placement):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__ or name in ("add_arguments", "run"):
                continue
            for param in inspect.signature(fn).parameters.values():
                assert "Namespace" not in str(param.annotation), f"{module.__name__}.{name}"


def _k8s_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sparseps k8s")
    k8s.add_arguments(parser)
    return parser.parse_args(argv)


def test_launch_dispatches_kubernetes_by_the_config(tmp_path):
    """``backend="kubernetes"``: launch() writes the manifests ``sparseps k8s`` writes,
    from the same config (the command line's ``from_args`` or Python)."""
    argv = ["--image", "img:1", "--name", "ctr", "--out", str(tmp_path / "cli"),
            "--server-num", "2", "--worker-num", "3", "/shared/train.py", "--epochs", "1"]  # fmt: skip
    from_cli = LaunchConfig.from_args(_k8s_args(argv))
    assert from_cli.backend == "kubernetes" and from_cli.kubernetes is not None
    assert from_cli.kubernetes.image == "img:1" and from_cli.kubernetes.port == 6000
    by_hand = LaunchConfig(
        script="/shared/train.py", script_args=("--epochs", "1"), server_num=2, worker_num=3,
        backend="kubernetes",
        kubernetes=KubernetesConfig(image="img:1", name="ctr", out=str(tmp_path / "py")),
    )  # fmt: skip
    outcome = launch(by_hand)
    assert (outcome.exit_code, outcome.reason) == (0, "rendered")
    assert k8s.run(_k8s_args(argv)) == 0  # sparseps k8s: the same launch()
    docs = [yaml.safe_load_all((tmp_path / d / "ctr.yaml").read_text()) for d in ("py", "cli")]
    assert list(docs[0]) == list(docs[1])
    assert k8s.manifests(by_hand) == k8s.manifests(from_cli.replace(kubernetes=by_hand.kubernetes))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"backend": "kubernetes"}, "backend kubernetes needs kubernetes=KubernetesConfig"),
        ({"kubernetes": {"image": "i"}}, "only it takes one"),
        ({"backend": "kubernetes", "kubernetes": {"image": "i", "name": "Bad_Name"}}, "--name"),
        ({"backend": "kubernetes", "kubernetes": {"image": "i", "port": 0}}, "--port"),
        ({"backend": "kubernetes", "kubernetes": {"image": "i", "mount": "rel"}}, "--mount"),
        (
            {"backend": "kubernetes", "kubernetes": {"image": "i", "pvc_name": "x"}},
            "unknown setting",
        ),
        ({"backend": "kubernetes", "kubernetes": {"image": "i"}, "address": "x"}, "--address"),
        ({"server_resources": '{"CPU": 1}'}, "--server-resources applies only to --backend ray"),
    ],
)
def test_a_bad_backend_setting_is_refused_naming_it(values, message):
    with pytest.raises(ConfigError, match=message):
        LaunchConfig.from_dict({"script": "job.py", **values})


def _failing_job(tmp_path: Path, name: str) -> LaunchConfig:
    """A real local job whose worker 1 exits 3 after joining (``job.py fail``): the
    launcher fails fast, a few seconds."""
    return LaunchConfig(
        script=str(JOB), script_args=("fail", "--dir", str(tmp_path / name)), server_num=1,
        worker_num=2, log_dir=str(tmp_path / name / "log"), grace_s=2.0, metrics=False,
    )  # fmt: skip


def test_a_local_launch_runs_in_this_process_and_gives_the_signals_back(tmp_path):
    """``backend="local"``: the supervisor runs here (pids.json's launcher is this
    process); on the main thread it takes SIGINT/SIGTERM while it runs and restores the
    handlers; from another thread it runs without touching them (Python allows signal
    handlers on the main thread only)."""
    import json
    import os

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    config = _failing_job(tmp_path, "main")
    outcome = launch(config)
    assert outcome.reason == "failed" and outcome.failure is not None, outcome
    assert (outcome.failure.role, outcome.failure.rank, outcome.failure.exit_code) == (
        "worker",
        1,
        3,
    )
    assert json.loads((Path(config.log_dir) / "pids.json").read_text())["launcher"] == os.getpid()
    assert {s: signal.getsignal(s) for s in before} == before

    got: list = []
    thread = threading.Thread(target=lambda: got.append(launch(_failing_job(tmp_path, "thread"))))
    thread.start()
    thread.join(timeout=240)
    assert got and got[0].reason == "failed", got
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_path_of_a_launch_names_at_most_six_modules_that_exist():
    """docs/architecture.md, "The path of a launch": at most 6 steps, each a module that
    exists; the launch step names the backend table it dispatches through."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "architecture.md").read_text()
    section = text.split("### The path of a launch", 1)[1].split("\n## ", 1)[0]
    steps = re.findall(r"^\d+\. \*\*`([^`]+)`\.\*\*", section, flags=re.M)
    assert 1 <= len(steps) <= 6, steps
    for module in steps:
        assert (root / "sparseps" / module).is_file(), module
    assert "BACKENDS" in section and "launch/launch_cli.py" in steps
