"""The Ray backend's parts that need no Ray cluster: the role actor's class run in this
process (path checks, its child's log streamed by offset, process-group stop) and the
option checks of ``sparseps launch --backend ray``."""

from __future__ import annotations

import time

import pytest

from sparseps.cli import main as cli_main
from sparseps.errors import ConfigError
from sparseps.launch.ray_actor import RoleActor
from sparseps.launch.ray_placement import actor_options, parse_resources
from sparseps.testing import wait_until
from sparseps.testing.jobs import alive


def test_prepare_names_the_node_and_the_missing_path(tmp_path):
    actor = RoleActor("worker", 1, f"test-{time.monotonic_ns()}")
    info = actor.prepare({"script": str(tmp_path / "nowhere.py")}, 2)
    assert info["ports"] == [] and "nowhere.py does not exist on node" in info["error"]
    assert "worker 1" in info["error"]
    ok = actor.prepare({"script": __file__, "working folder": str(tmp_path)}, 2)
    assert ok["error"] == "" and len(set(ok["ports"])) == 2


def test_child_output_is_pulled_by_offset_and_stop_ends_its_group(tmp_path):
    actor = RoleActor("server", 0, f"test-{time.monotonic_ns()}")
    # the child runs a grandchild in its session: stop() must end both
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('grandchild', p.pid, flush=True); time.sleep(60)"
    )
    script = tmp_path / "role.py"
    script.write_text(code)
    pid = actor.start([str(script)], {"SPARSEPS_PROBE": "1"}, cwd=str(tmp_path))
    out = b""

    def grandchild() -> int | None:
        nonlocal out
        reply = actor.poll(len(out))
        out += reply["data"]
        assert reply["code"] is None
        return int(out.split()[1]) if out.startswith(b"grandchild") else None

    child_of_child = wait_until(grandchild, 30, "the role to print its grandchild's pid")
    assert alive(pid) and alive(child_of_child)
    assert actor.stop(grace_s=2.0) is not None
    wait_until(lambda: not alive(child_of_child), 5, "the grandchild to die with the group")
    assert actor.poll(len(out))["code"] is not None


def test_resources_and_refused_options(tmp_path, capsys):
    assert parse_resources("--worker-resources", '{"CPU": 1, "node_b": 0.1}') == {
        "CPU": 1.0, "node_b": 0.1,
    }  # fmt: skip
    assert actor_options({"CPU": 2, "GPU": 1, "memory": 1e9, "node_b": 0.1}) == {
        "num_cpus": 2, "num_gpus": 1, "memory": 1e9, "resources": {"node_b": 0.1},
    }  # fmt: skip
    for bad in ("[1]", '{"CPU": 0}', '{"CPU": "x"}', "{"):
        with pytest.raises(ConfigError, match="--worker-resources"):
            parse_resources("--worker-resources", bad)
    script = tmp_path / "s.py"
    script.write_text("")
    argv = ["launch", "--backend", "ray", "--servers", "127.0.0.1:1", str(script)]
    assert cli_main(argv) == 1
    assert "--servers does not apply to --backend ray" in capsys.readouterr().err
    assert cli_main(["launch", "--address", "x:1", str(script)]) == 1
    assert "--address applies only to --backend ray" in capsys.readouterr().err
