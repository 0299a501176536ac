"""A rejected push is rejected whole, by the client, before anything is sent.

Each server checks only its own share of a push; if the client sent a batch with one bad
count, the server owning that key would refuse its part while the others applied theirs.
These tests put the bad value on a key owned by server 1 of 2 and check that the call
raises at once and that neither server saw a request (request counters, table stats and
rows are all unchanged).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.core.routing import server_of
from sparseps.errors import InputError
from sparseps.rpc.client_checks import check_counts_or_none, check_finite_rows, check_merged
from sparseps.testing import local_cluster

pytestmark = pytest.mark.timeout(120)

DIM = 4
N = 400


def _bad_cases(position: int):
    """(what to break, regex the error must match): argument, caller's position, value."""

    def clicks(value):
        def apply(grads, shows, clicks):
            clicks[position] = value

        return apply

    def shows(value):
        def apply(grads, shows, clicks):
            shows[position] = value

        return apply

    def grads(value):
        def apply(grads, shows, clicks):
            grads[position, 3] = value

        return apply

    at = rf"\[{position}\]"
    return [
        (clicks(-1.0), rf"clicks must be finite and >= 0.*-1\.0 at clicks{at}"),
        (clicks(np.nan), rf"clicks must be finite and >= 0.*nan at clicks{at}"),
        (clicks(np.inf), rf"clicks must be finite and >= 0.*inf at clicks{at}"),
        (shows(-np.inf), rf"shows must be finite and >= 0.*-inf at shows{at}"),
        (shows(-0.5), rf"shows must be finite and >= 0.*-0\.5 at shows{at}"),
        (grads(np.nan), rf"grads must be finite.*nan at grads\[{position}, 3\]"),
        (grads(-np.inf), rf"grads must be finite.*-inf at grads\[{position}, 3\]"),
    ]


def _table_state(client) -> list:
    """Per server: requests seen so far and the table's statistics."""
    return [(s["requests"], s["failed"], s["tables"]["emb"]) for s in client.stats()["servers"]]


def test_bad_push_on_one_server_is_sent_to_none():
    config = TableConfig(name="emb", dim=DIM, rule=optim.Adagrad(lr=0.1), seed=3)
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 2**63, N, dtype=np.uint64)
    keys[10:20] = keys[:10]  # duplicates: merged on the client
    owners = server_of(keys, 2)
    assert (owners == 0).any() and (owners == 1).any()
    # The first key owned by server 1 after a stretch of server 0's keys.
    position = int(np.flatnonzero(owners == 1)[np.flatnonzero(owners == 1) > 50][0])
    grads = rng.standard_normal((N, DIM)).astype(np.float32)
    shows = np.ones(N, np.float32)
    clicks = (rng.random(N) < 0.3).astype(np.float32)

    with local_cluster(servers=2, timeout=30) as cluster, cluster.client(timeout=20) as client:
        client.create_table(config)
        client.push("emb", keys, grads, shows=shows, clicks=clicks).wait()
        rows_before = client.pull("emb", keys).wait()
        state_before = _table_state(client)

        for case, (apply, pattern) in enumerate(_bad_cases(position)):
            bad_grads, bad_shows, bad_clicks = grads.copy(), shows.copy(), clicks.copy()
            apply(bad_grads, bad_shows, bad_clicks)
            with pytest.raises(InputError, match=pattern) as info:
                client.push("emb", keys, bad_grads, shows=bad_shows, clicks=bad_clicks)
            assert "nothing was sent" in str(info.value), case
            with pytest.raises(InputError, match=pattern.replace("grads", "deltas")):
                client.push_delta("emb", keys, bad_grads, shows=bad_shows, clicks=bad_clicks)

        # Finite duplicates whose sum overflows float32 (keys[15] repeats keys[5]).
        huge = grads.copy()
        huge[5] = huge[15] = 3e38
        with pytest.raises(InputError, match=rf"duplicate key {int(keys[5])} overflow"):
            client.push("emb", keys, huge, shows=shows, clicks=clicks)

        state_after = _table_state(client)
        # Each server counted exactly one more request: the second stats call itself.
        for (req_b, failed_b, table_b), (req_a, failed_a, table_a) in zip(
            state_before, state_after, strict=True
        ):
            assert req_a == req_b + 1
            assert failed_a == failed_b == 0
            assert table_a == table_b
        np.testing.assert_array_equal(client.pull("emb", keys).wait(), rows_before)

        # Counts that are fine (zero clicks, fractional shows) still go through.
        ok_shows = np.full(N, 0.5, np.float32)
        client.push("emb", keys, grads, shows=ok_shows, clicks=np.zeros(N, np.float32)).wait()
        assert not np.array_equal(client.pull("emb", keys).wait(), rows_before)


def test_count_and_row_checks_name_argument_position_and_value():
    counts = np.array([1, 0, 2, -3, np.nan], np.float32)
    with pytest.raises(
        InputError, match=r"push 'e': clicks .* 2 bad value\(s\), first -3\.0 at clicks\[3\]"
    ):
        check_counts_or_none(counts, "clicks", "push 'e'", 5)
    with pytest.raises(InputError, match=r"shape \[4\]"):
        check_counts_or_none(counts, "clicks", "push 'e'", 4)
    assert check_counts_or_none(None, "shows", "push 'e'", 5) is None
    rows = np.zeros((3, 2), np.float32)
    rows[2, 1] = np.inf
    with pytest.raises(InputError, match=r"1 NaN/inf value\(s\), first inf at grads\[2, 1\]"):
        check_finite_rows(rows, "grads", "push 'e'", 3)


def test_merged_overflow_names_the_key():
    keys = np.array([11, 22], np.uint64)
    # What summing two finite rows of 3e38 gives in float32.
    merged = np.array([[1, 2], [np.inf, 0]], np.float32)
    ones = np.ones(2, np.float32)
    with pytest.raises(InputError, match="duplicate key 22 overflow"):
        check_merged("push 'e'", keys, merged, ones, ones)
    with pytest.raises(InputError, match="duplicate key 11"):
        check_merged(
            "push 'e'", keys, np.zeros((2, 2), np.float32), np.array([np.inf, 1], np.float32), ones
        )
    check_merged("push 'e'", keys, np.zeros((2, 2), np.float32), ones, ones)


def test_a_bad_dense_push_is_refused_before_it_is_sent():
    with local_cluster(servers=1, timeout=30) as cluster, cluster.client(timeout=20) as client:
        client.create_dense("dense", 1000, optim.Adam(lr=0.01))
        grad = np.full(1000, 0.5, np.float32)
        client.push_dense("dense", grad).wait()
        values, requests = (
            client.pull_dense("dense").wait(),
            client.stats()["servers"][0]["requests"],
        )
        grad[7], grad[900] = np.nan, -np.inf
        with pytest.raises(InputError, match=r"2 NaN/inf value\(s\), first nan at index 7; "
                           r"rejected, nothing was sent"):  # fmt: skip
            client.push_dense("dense", grad)
        # only the stats call itself reached the server; the values are unchanged
        assert client.stats()["servers"][0]["requests"] == requests + 1
        np.testing.assert_array_equal(client.pull_dense("dense").wait(), values)
