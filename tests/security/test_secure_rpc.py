"""CURVE transport between PSClient and servers: same values as plain, clear refusals.

A client with another job's key, or with no key, must get an UnavailableError that says
the key was refused, within seconds (not the RPC timeout), for calls already waiting and
for new ones.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
from _securetools import job_security, server

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.errors import UnavailableError
from sparseps.rpc.client import PSClient
from sparseps.rpc.security import JobKeys, Security

pytestmark = pytest.mark.timeout(120)

DEADLINE_S = 10.0  # the refusal must arrive well before the client's 60 s RPC timeout


def _train(endpoint: str, security: Security | None) -> list[np.ndarray]:
    """Create a table, pull, push, pull; returns what the client saw."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**63, 500, dtype=np.uint64)
    keys = np.concatenate([keys, keys[:50]])  # duplicates too
    grads = rng.standard_normal((len(keys), 8)).astype(np.float32)
    with PSClient([endpoint], timeout=30, security=security) as client:
        client.create_table(TableConfig(name="emb", dim=8, rule=optim.Adagrad(lr=0.1), seed=11))
        first = client.pull("emb", keys).wait()
        client.push("emb", keys, grads).wait()
        second = client.pull("emb", keys).wait()
        client.push("emb", keys, 2 * grads).wait()
        third = client.pull("emb", keys).wait()
    return [first, second, third]


def test_secure_round_trip_gives_the_same_values_as_plain(tmp_path):
    security = job_security(tmp_path / "keys")
    with server(security) as endpoint:
        secure = _train(endpoint, security)
    with server(None) as endpoint:
        plain = _train(endpoint, None)
    assert secure[0].any() and not np.array_equal(secure[0], secure[1])  # training happened
    for got, want in zip(secure, plain, strict=True):
        np.testing.assert_array_equal(got, want)


def _refused(endpoint: str, security: Security | None) -> tuple[UnavailableError, float]:
    start = time.monotonic()
    with PSClient([endpoint], timeout=60, security=security) as client:
        pending = client.pull("emb", np.arange(10, dtype=np.uint64))  # in flight already
        with pytest.raises(UnavailableError) as waited:
            pending.wait()
        with pytest.raises(UnavailableError) as new_call:  # and a call made afterwards
            client.ping()
    elapsed = time.monotonic() - start
    assert "authentication failed" in str(new_call.value)
    # Same refusal for both (zmq's event code may differ between reconnect attempts).
    for error in (waited.value, new_call.value):
        assert "authentication failed" in str(error) and error.address == endpoint
    return new_call.value, elapsed


def test_client_with_another_jobs_key_is_refused_quickly(tmp_path):
    security = job_security(tmp_path / "job")
    intruder = job_security(tmp_path / "other")
    with server(security) as endpoint:
        error, elapsed = _refused(endpoint, intruder)
    assert elapsed < DEADLINE_S
    text = str(error)
    assert "this client's key is not the job's key" in text
    assert str(tmp_path / "other") in text and endpoint in text
    assert error.address == endpoint and error.rank == 0


def test_client_knowing_the_public_key_but_not_the_secret_is_refused(tmp_path):
    """The ZAP allow-list, not only the server key: a peer that learnt job.public but holds
    another secret passes the server-key check and is refused by the ZAP handler."""
    security = job_security(tmp_path / "job")
    public, secret = zmq.curve_keypair()

    class Impostor(Security):
        def client_socket(self, sock):
            sock.setsockopt(zmq.CURVE_SERVERKEY, security.keys.public)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)

    with server(security) as endpoint:
        error, elapsed = _refused(endpoint, Impostor(JobKeys(public, secret)))
    assert elapsed < DEADLINE_S
    assert "the server refused this client's key" in str(error)


def test_client_without_a_key_is_refused_quickly(tmp_path):
    security = job_security(tmp_path / "job")
    with server(security) as endpoint:
        error, elapsed = _refused(endpoint, None)
    assert elapsed < DEADLINE_S
    assert "requires the job's key" in str(error) and "SPARSEPS_KEY_DIR" in str(error)


def test_secure_client_of_a_plain_server_is_told_so(tmp_path):
    security = job_security(tmp_path / "job")
    with server(None) as endpoint:
        error, elapsed = _refused(endpoint, security)
    assert elapsed < DEADLINE_S
    assert "runs without --secure" in str(error)


def test_client_reads_the_keys_from_the_environment(tmp_path, monkeypatch):
    security = job_security(tmp_path / "job")
    monkeypatch.setenv("SPARSEPS_SECURE", "1")
    monkeypatch.setenv("SPARSEPS_KEY_DIR", str(tmp_path / "job"))
    with server(security) as endpoint, PSClient([endpoint], timeout=20) as client:
        assert client.ping()[0]["rank"] == 0
