"""Cluster spec resolution: ports, node shares, defaults, and errors that name the option."""

from __future__ import annotations

import pytest

from sparseps.env import Role
from sparseps.errors import ConfigError
from sparseps.launch.spec import DEFAULT_MASTER_PORT, ClusterSpec, make_spec


def test_single_node_picks_distinct_free_ports(tmp_path):
    spec = make_spec(server_num=3, worker_num=2, log_dir=str(tmp_path / "log"))
    ports = [int(s.rsplit(":", 1)[1]) for s in spec.servers] + [int(spec.master.rsplit(":", 1)[1])]
    assert len(set(ports)) == 4 and all(p > 0 for p in ports)
    assert spec.workers == ("127.0.0.1", "127.0.0.1") and spec.host == "127.0.0.1"
    assert (
        not spec.multi_node and spec.local_servers() == [0, 1, 2] and spec.local_workers() == [0, 1]
    )
    assert spec.log_dir == str(tmp_path / "log")
    env = spec.role_env(Role.WORKER, 1)
    assert (env.rank, env.worker_num, env.servers, env.master) == (1, 2, spec.servers, spec.master)
    assert spec.job_id != make_spec().job_id  # one-node ids are random


def test_defaults_are_one_server_one_worker():
    spec = make_spec()
    assert len(spec.servers) == 1 and len(spec.workers) == 1


def test_given_servers_are_used_and_counted():
    spec = make_spec(servers="127.0.0.1:7001,127.0.0.1:7002", worker_num=1)
    assert spec.servers == ("127.0.0.1:7001", "127.0.0.1:7002")
    assert not spec.multi_node


def test_two_nodes_each_get_their_share_and_the_same_job_id():
    layout = {"servers": "10.0.0.1:6000,10.0.0.2:6000", "workers": "10.0.0.1,10.0.0.2:9999"}
    # Hosts beyond loopback: secure by default, so every launcher names the shared keys.
    layout["key_dir"] = "/shared/job-keys"
    a = make_spec(host="10.0.0.1", **layout)
    b = make_spec(host="10.0.0.2", **layout)
    assert a.secure and b.key_dir == "/shared/job-keys"
    assert a.multi_node and a.nodes == ("10.0.0.1", "10.0.0.2")
    assert (a.local_servers(), a.local_workers()) == ([0], [0])
    assert (b.local_servers(), b.local_workers()) == ([1], [1])
    assert a.master == b.master == f"10.0.0.1:{DEFAULT_MASTER_PORT}"
    assert a.control_endpoint == f"10.0.0.1:{DEFAULT_MASTER_PORT + 1}"
    assert a.is_control_host and not b.is_control_host
    assert a.job_id == b.job_id  # derived from the layout, so launchers agree without talking
    assert "(this node)" in a.describe()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"server_num": 3, "servers": "127.0.0.1:1,127.0.0.1:2"}, "--server-num 3 disagrees"),
        ({"worker_num": 0}, "--worker-num: must be >= 1"),
        ({"servers": "a:1,b:2", "workers": "a,b"}, "--host is required"),
        ({"servers": "a:1", "workers": "a", "host": "c"}, "--host 'c' runs nothing"),
        ({"workers": "127.0.0.1,10.0.0.9", "host": "127.0.0.1"}, "--servers is required"),
        ({"servers": "a:1,b:1", "workers": "a,b", "host": "a", "master": "b:5"}, "worker 0's host"),
        ({"servers": "127.0.0.1:1,127.0.0.1:1"}, "listed twice"),
        ({"servers": "a", "workers": "a"}, "--servers"),
        ({"host": "203.0.113.7"}, "--host '203.0.113.7'"),
    ],
)
def test_inconsistent_options_name_the_option(options, message):
    with pytest.raises(ConfigError, match=message):
        make_spec(**options)


def test_spec_validates_when_built_directly():
    with pytest.raises(ConfigError, match="at least one server"):
        ClusterSpec((), ("h",), "h:1", "h", "job", "/tmp")


def test_command_line_accepts_fleetrun_spellings_and_passes_script_arguments():
    import argparse

    from sparseps.launch.launch_cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--server_num", "2", "--trainer_num", "3", "train.py", "--lr", "0.1", "--server-num", "9"]
    )
    assert (args.server_num, args.worker_num, args.script) == (2, 3, "train.py")
    assert args.script_args == ["--lr", "0.1", "--server-num", "9"]  # after the script: its own
    assert parser.parse_args(["--worker_num", "4", "t.py"]).worker_num == 4


def test_missing_script_is_a_config_error(tmp_path):
    import argparse

    from sparseps.launch.launch_cli import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError, match="nope.py"):
        run(parser.parse_args(["--log-dir", str(tmp_path), "nope.py"]))
