"""The DESIGN §2.2 environment contract: all or nothing, errors name the variable."""

import pytest

from sparseps import env
from sparseps.errors import ConfigError

FULL = {
    "SPARSEPS_ROLE": "worker",
    "SPARSEPS_RANK": "1",
    "SPARSEPS_SERVERS": "127.0.0.1:7000,127.0.0.1:7001",
    "SPARSEPS_WORKER_NUM": "2",
    "SPARSEPS_MASTER": "127.0.0.1:7100",
    "SPARSEPS_LOG_DIR": "log",
    "SPARSEPS_JOB_ID": "job-1",
}


def test_no_variable_means_local_mode():
    assert env.from_environ({}) is None


def test_full_environment_round_trips():
    role = env.from_environ(FULL)
    assert role.role is env.Role.WORKER and role.rank == 1
    assert role.servers == ("127.0.0.1:7000", "127.0.0.1:7001")
    assert env.from_environ(role.to_environ()) == role


@pytest.mark.parametrize("missing", env.VARIABLES)
def test_half_configured_environment_names_the_missing_variable(missing):
    partial = {k: v for k, v in FULL.items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        env.from_environ(partial)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SPARSEPS_ROLE", "boss"),
        ("SPARSEPS_RANK", "one"),
        ("SPARSEPS_RANK", "5"),
        ("SPARSEPS_SERVERS", "127.0.0.1"),
        ("SPARSEPS_SERVERS", "127.0.0.1:99999"),
        ("SPARSEPS_MASTER", "nohost"),
        ("SPARSEPS_WORKER_NUM", "0"),
    ],
)
def test_malformed_variable_is_named(name, value):
    with pytest.raises(ConfigError, match=name):
        env.from_environ({**FULL, name: value})


def test_float_setting():
    assert env.float_setting("X", 3.0, {}) == 3.0
    assert env.float_setting("X", 3.0, {"X": "1.5"}) == 1.5
    with pytest.raises(ConfigError, match="X"):
        env.float_setting("X", 3.0, {"X": "soon"})
