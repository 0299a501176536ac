"""The role API in-process: env errors, a server role, and barriers that name who is missing."""

from __future__ import annotations

import logging

import pytest

from sparseps import role
from sparseps.errors import ConfigError, DeadlineError

SERVER_ENV = {
    "SPARSEPS_ROLE": "server",
    "SPARSEPS_RANK": "1",
    "SPARSEPS_SERVERS": "127.0.0.1:7000,127.0.0.1:7001",
    "SPARSEPS_WORKER_NUM": "3",
    "SPARSEPS_MASTER": "127.0.0.1:7100",
    "SPARSEPS_LOG_DIR": "log",
    "SPARSEPS_JOB_ID": "job-1",
}


@pytest.fixture(autouse=True)
def _fresh_role():
    role.stop()
    yield
    role.stop()


@pytest.mark.parametrize("missing", ["SPARSEPS_MASTER", "SPARSEPS_RANK", "SPARSEPS_JOB_ID"])
def test_half_configured_environment_raises_naming_the_variable(missing):
    partial = {k: v for k, v in SERVER_ENV.items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        role.init(environ=partial)
    assert role.role_env() is None  # no silent fallback to local mode


def test_malformed_variable_is_named():
    with pytest.raises(ConfigError, match="SPARSEPS_RANK"):
        role.init(environ={**SERVER_ENV, "SPARSEPS_RANK": "2"})  # only 2 servers


def test_calls_before_init_say_to_call_init():
    assert role.role_env() is None
    for call in (role.is_server, role.worker_num, role.server_endpoints, role.barrier_worker):
        with pytest.raises(ConfigError, match=r"sps\.init\(\)"):
            call()


def test_server_role_from_the_environment():
    env = role.init(environ=SERVER_ENV)
    assert role.init(environ=SERVER_ENV) is env  # idempotent
    assert role.is_server() and not role.is_worker()
    assert (role.server_num(), role.worker_num()) == (2, 3)
    assert role.server_endpoints() == ["127.0.0.1:7000", "127.0.0.1:7001"]
    assert env.rank == 1 and env.job_id == "job-1"
    with pytest.raises(ConfigError, match="not a worker"):
        role.worker_index()
    with pytest.raises(ConfigError, match="only workers"):
        role.barrier_worker()
    role.stop()
    assert role.role_env() is None


def test_store_barrier_names_missing_ranks_and_warns(caplog):
    import torch.distributed as dist

    from sparseps.runtime.rendezvous import store_barrier

    store = dist.HashStore()
    store.set("b/2", "1")  # rank 2 arrived; rank 1 never does
    with caplog.at_level(logging.WARNING), pytest.raises(DeadlineError) as info:
        store_barrier(
            store,
            "b",
            rank=0,
            world=3,
            timeout_s=0.6,
            warn_s=0.2,
            address="127.0.0.1:1",
            setting="S",
        )
    exc = info.value
    assert (exc.op, exc.role, exc.rank, exc.setting) == ("barrier", "worker", [1], "S")
    assert 0.6 <= exc.seconds < 5  # its own measured wait: the 0.6 s limit, plus a loaded box
    assert "still waiting for worker rank(s) [1]" in caplog.text
    store.set("b/1", "1")
    store_barrier(store, "b", rank=0, world=3, timeout_s=1, warn_s=1, address="x")  # all there now
