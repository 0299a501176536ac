"""Job keys: ``sparseps keys DIR``, strict modes, clear load errors, env and launch rules."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from sparseps import env
from sparseps.errors import ConfigError
from sparseps.launch.spec import make_spec
from sparseps.rpc.security import PUBLIC_FILE, SECRET_FILE, JobKeys, write_job_keys

ROOT = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _keys_command(*args: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    environ["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "keys", *args],
        capture_output=True, text=True, timeout=60, env=environ,
    )  # fmt: skip


def test_keys_command_writes_a_private_folder_and_never_prints_the_secret(tmp_path):
    folder = tmp_path / "deep" / "keys"
    done = _keys_command(str(folder))
    assert done.returncode == 0, done.stderr
    assert _mode(folder) == 0o700
    assert _mode(folder / PUBLIC_FILE) == 0o600 and _mode(folder / SECRET_FILE) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == [PUBLIC_FILE, SECRET_FILE]
    keys = JobKeys.load(folder)
    assert zmq.curve_public(keys.secret) == keys.public
    assert str(folder) in done.stdout and keys.public.decode() in done.stdout
    assert keys.secret.decode() not in done.stdout + done.stderr
    assert keys.secret.decode() not in repr(keys)

    again = _keys_command(str(folder))
    assert again.returncode == 1 and "already exists" in again.stderr
    assert JobKeys.load(folder) == keys  # untouched

    forced = _keys_command(str(folder), "--force")
    assert forced.returncode == 0, forced.stderr
    assert JobKeys.load(folder).public != keys.public


def test_keys_command_refuses_a_folder_others_can_read(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    done = _keys_command(str(folder))
    assert done.returncode == 1
    assert "0755" in done.stderr and "chmod 700" in done.stderr
    assert not (folder / SECRET_FILE).exists()


@pytest.fixture
def key_dir(tmp_path) -> Path:
    folder = tmp_path / "keys"
    write_job_keys(folder)
    return folder


def test_load_refuses_a_folder_that_is_not_0700(key_dir):
    os.chmod(key_dir, 0o750)
    with pytest.raises(ConfigError, match=r"folder has mode 0750, must be 0700") as info:
        JobKeys.load(key_dir)
    assert str(key_dir) in str(info.value) and f"chmod 700 {key_dir}" in str(info.value)


@pytest.mark.parametrize("name", [PUBLIC_FILE, SECRET_FILE])
def test_load_refuses_a_key_file_that_is_not_0600(key_dir, name):
    os.chmod(key_dir / name, 0o644)
    with pytest.raises(ConfigError, match=r"key file has mode 0644, must be 0600") as info:
        JobKeys.load(key_dir)
    assert str(key_dir / name) in str(info.value)


@pytest.mark.parametrize("name", [PUBLIC_FILE, SECRET_FILE])
def test_load_names_a_missing_file_and_the_fix(key_dir, name):
    (key_dir / name).unlink()
    with pytest.raises(ConfigError, match="does not exist") as info:
        JobKeys.load(key_dir)
    assert str(key_dir / name) in str(info.value) and "sparseps keys DIR" in str(info.value)


def test_load_names_a_missing_folder(tmp_path):
    with pytest.raises(ConfigError, match="folder does not exist"):
        JobKeys.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"short\n", "expected 40 z85 characters, got 5"), (b"~" * 40 + b"\n", "not z85 text")],
)
def test_load_refuses_malformed_keys(key_dir, content, problem):
    (key_dir / SECRET_FILE).write_bytes(content)
    with pytest.raises(ConfigError, match=problem) as info:
        JobKeys.load(key_dir)
    assert str(key_dir / SECRET_FILE) in str(info.value)


def test_load_refuses_a_public_key_of_another_pair(key_dir):
    other, _ = zmq.curve_keypair()
    (key_dir / PUBLIC_FILE).write_bytes(other + b"\n")
    with pytest.raises(ConfigError, match="does not belong to the secret key"):
        JobKeys.load(key_dir)


def test_environment_carries_only_the_folder_path(key_dir):
    role = env.RoleEnv(
        env.Role.WORKER, 0, ("127.0.0.1:7000",), 1, "127.0.0.1:7100", "log", "job",
        key_dir=str(key_dir),
    )  # fmt: skip
    variables = role.to_environ()
    assert variables[env.SECURE] == "1" and variables[env.KEY_DIR] == str(key_dir)
    keys = JobKeys.load(key_dir)
    assert not any(
        keys.secret.decode() in v or keys.public.decode() in v for v in variables.values()
    )
    assert env.from_environ(variables) == role and role.secure
    plain = env.from_environ({k: v for k, v in variables.items() if k != env.SECURE})
    assert not plain.secure and env.SECURE not in plain.to_environ()


@pytest.mark.parametrize(
    ("environ", "match"),
    [({env.SECURE: "1"}, env.KEY_DIR), ({env.SECURE: "maybe", env.KEY_DIR: "k"}, env.SECURE)],
)
def test_security_switch_errors_name_the_variable(environ, match):
    with pytest.raises(ConfigError, match=match):
        env.security_setting(environ)


def test_security_switch_values():
    assert env.security_setting({}) is None
    assert env.security_setting({env.SECURE: "0", env.KEY_DIR: "k"}) is None
    assert env.security_setting({env.SECURE: "1", env.KEY_DIR: "k"}) == "k"


def test_launch_rule_secure_by_default_only_beyond_loopback(tmp_path):
    log_dir = str(tmp_path / "log")
    one_node = make_spec(server_num=1, worker_num=2, log_dir=log_dir)
    assert not one_node.secure
    asked = make_spec(server_num=1, worker_num=2, log_dir=log_dir, secure=True)
    assert asked.key_dir == os.path.join(log_dir, "keys")
    assert asked.role_env(env.Role.SERVER, 0).key_dir == asked.key_dir
    two_loopback = dict(
        servers="127.0.0.1:7000,127.0.0.2:7000", workers="127.0.0.1,127.0.0.2", host="127.0.0.1"
    )
    assert not make_spec(**two_loopback, log_dir=log_dir).secure
    with pytest.raises(ConfigError, match="--key-dir is required.*every host needs the same keys"):
        make_spec(**two_loopback, log_dir=log_dir, secure=True)
    remote = dict(
        servers="10.1.0.1:7000,10.1.0.2:7000", workers="10.1.0.1,10.1.0.2", host="10.1.0.1"
    )
    with pytest.raises(ConfigError, match="--key-dir is required"):
        make_spec(**remote, log_dir=log_dir)  # on by default: hosts beyond loopback
    assert not make_spec(**remote, log_dir=log_dir, secure=False).secure
    given = make_spec(**remote, log_dir=log_dir, key_dir=str(tmp_path / "k"))
    assert given.secure and given.key_dir == str(tmp_path / "k")
    with pytest.raises(ConfigError, match="contradict"):
        make_spec(**remote, log_dir=log_dir, key_dir="k", secure=False)
