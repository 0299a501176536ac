"""Key routing: stable, balanced, vectorised."""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.core.routing import dense_server_of, routing_hash, server_of, split_by_server
from sparseps.errors import InputError


def _reference_mix(key: int) -> int:
    """Plain-Python splitmix64 finaliser with the documented salt (the spec)."""
    mask = (1 << 64) - 1
    z = key ^ 0x5DEECE66DA5A5A5A
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_matches_the_documented_formula():
    keys = np.array([0, 1, 2, 12345, 2**63, 2**64 - 1], dtype=np.uint64)
    for key, mixed in zip(keys.tolist(), routing_hash(keys).tolist(), strict=True):
        assert mixed == _reference_mix(key)
    for servers in (1, 2, 3, 7):
        expected = [((_reference_mix(k) >> 32) * servers) >> 32 for k in keys.tolist()]
        assert server_of(keys, servers).tolist() == expected


def test_pinned_values_never_change():
    # Saved shards depend on this mapping: changing it breaks loading old checkpoints.
    keys = np.arange(10, dtype=np.uint64)
    assert server_of(keys, 3).tolist() == [((_reference_mix(k) >> 32) * 3) >> 32 for k in range(10)]
    assert server_of(keys, 1).tolist() == [0] * 10


@pytest.mark.parametrize("servers", [2, 3, 8])
def test_sequential_keys_balance(servers):
    counts = np.bincount(server_of(np.arange(300_000, dtype=np.uint64), servers), minlength=servers)
    assert counts.min() / counts.max() > 0.98


def test_low_bits_within_a_server_stay_uniform():
    # The table's hash map uses low bits of its own hash: routing must not bias them.
    keys = np.arange(200_000, dtype=np.uint64)
    mine = keys[server_of(keys, 2) == 0]
    low = np.bincount((routing_hash(mine) & np.uint64(15)).astype(np.int64), minlength=16)
    assert low.min() / low.max() > 0.9


def test_split_by_server_partitions_in_order():
    keys = np.random.default_rng(0).integers(0, 2**63, 1000, dtype=np.uint64)
    parts = split_by_server(keys, 3)
    owner = server_of(keys, 3)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    for rank, positions in enumerate(parts):
        assert (owner[positions] == rank).all() and (np.diff(positions) > 0).all()


def test_dense_placement_is_stable_and_validated():
    assert dense_server_of("dense", 1) == 0
    assert dense_server_of("dense", 4) == dense_server_of("dense", 4)
    assert {dense_server_of(f"d{i}", 4) for i in range(64)} == {0, 1, 2, 3}
    with pytest.raises(InputError):
        dense_server_of("", 2)


def test_rejects_wrong_input():
    with pytest.raises(InputError, match="1-D uint64"):
        server_of(np.arange(3), 2)
    with pytest.raises(InputError, match="num_servers"):
        server_of(np.arange(3, dtype=np.uint64), 0)


@pytest.mark.parametrize("servers", [1, 2, 3, 7])
def test_client_grouping_agrees_with_server_of(servers):
    from sparseps.core.routing import group_by_server
    from sparseps.rpc.batching import merge_by_group

    rng = np.random.default_rng(servers)
    keys = rng.integers(0, 3000, 5000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    grouped, offsets, inverse = group_by_server(keys, servers)
    assert len(grouped) == len(np.unique(keys)) and (grouped[inverse] == keys).all()
    owner = server_of(grouped, servers)
    for rank in range(servers):
        assert (owner[offsets[rank] : offsets[rank + 1]] == rank).all()
    values = rng.standard_normal((5000, 3)).astype(np.float32)
    merged, shows, clicks = merge_by_group(inverse, len(grouped), values, None, None)
    expected = np.zeros_like(merged)
    np.add.at(expected, inverse, values)
    np.testing.assert_allclose(merged, expected, rtol=1e-5, atol=1e-6)
    assert (shows == np.bincount(inverse)).all() and not clicks.any()


@pytest.mark.parametrize("servers", [1, 2, 3, 7])
def test_pull_routing_keeps_every_occurrence_grouped_by_owner(servers):
    from sparseps.core.placement import Placement
    from sparseps.core.routing import route_by_server

    rng = np.random.default_rng(servers)
    keys = rng.integers(0, 300, 2000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    grouped, offsets, inverse = route_by_server(keys, servers)
    if servers == 1:
        assert grouped is keys and inverse is None and offsets.tolist() == [0, len(keys)]
        return
    assert len(grouped) == len(keys) and (grouped[inverse] == keys).all()
    assert sorted(inverse.tolist()) == list(range(len(keys)))  # a permutation: no merging
    owner = server_of(grouped, servers)
    for rank in range(servers):
        part = slice(offsets[rank], offsets[rank + 1])
        assert (owner[part] == rank).all()
        # within a server the caller's order is kept
        np.testing.assert_array_equal(grouped[part], keys[server_of(keys, servers) == rank])
    placement = Placement(1, tuple(f"h:{i}" for i in range(servers)), np.arange(64) % servers)
    grouped, offsets, inverse = placement.group(keys, dedup=False)
    assert len(grouped) == len(keys) and (grouped[inverse] == keys).all()
    owners = placement.owner_of(grouped)
    assert all((owners[offsets[r] : offsets[r + 1]] == r).all() for r in range(servers))
