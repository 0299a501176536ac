"""Placement over virtual shards (sparseps.core.placement): the default placement is
today's routing exactly, and a rebalance moves only the added or removed server's share."""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.core.placement import Placement, default_vshards, rebalance
from sparseps.core.routing import group_by_server, server_of
from sparseps.errors import InputError

KEYS = np.random.default_rng(7).integers(0, 2**64 - 1, 200_000, dtype=np.uint64, endpoint=True)


@pytest.mark.parametrize("servers", [1, 2, 3, 5, 8])
def test_default_placement_routes_every_key_as_server_of(servers):
    placement = Placement.default([f"h:{i}" for i in range(servers)])
    assert placement.vshards == default_vshards(servers) and placement.vshards % servers == 0
    np.testing.assert_array_equal(placement.owner_of(KEYS), server_of(KEYS, servers))
    keys = np.concatenate([KEYS[:5000], KEYS[:100], np.arange(1, 2000, dtype=np.uint64)])
    for got, want in zip(placement.group(keys), group_by_server(keys, servers), strict=True):
        np.testing.assert_array_equal(got, want)


def test_rebalance_moves_only_the_new_servers_share_and_back():
    endpoints = ["h:0", "h:1"]
    start = Placement.default(endpoints, 1024)
    grown = rebalance(start, [0, 1, 2], [*endpoints, "h:2"])
    assert grown.version == 2
    assert sorted(np.bincount(grown.owners).tolist()) == [341, 341, 342]
    moves = start.moves(grown)
    assert set(moves) == {(0, 2), (1, 2)}  # every moved shard goes to the new server
    assert sum(map(len, moves.values())) == 341
    moved_keys = np.mean(start.owner_of(KEYS) != grown.owner_of(KEYS))
    assert 0.30 < moved_keys < 0.37  # about a third of the keys, not a reshuffle
    shrunk = rebalance(grown, [0, 1])
    assert shrunk.version == 3 and set(start.moves(shrunk)) == set()  # back where it was
    np.testing.assert_array_equal(shrunk.owners, start.owners)


def test_rebalance_and_placement_refuse_bad_input():
    start = Placement.default(["h:0", "h:1"], 8)
    with pytest.raises(InputError, match="extend"):
        rebalance(start, [0, 1], ["h:9", "h:1"])
    with pytest.raises(InputError, match="ranks"):
        rebalance(start, [0, 5])
    with pytest.raises(InputError, match="not a rank"):
        Placement(1, ("h:0",), np.array([0, 1]))
    with pytest.raises(InputError, match="version"):
        Placement(0, ("h:0",), np.array([0]))
    with pytest.raises(InputError, match="virtual shards"):
        start.moves(Placement.default(["h:0", "h:1"], 16))
    assert not start.owners.flags.writeable


def test_move_import_schema_lists_the_tables_export_columns():
    from sparseps.elastic.server_moves import PENDING_BUFS, ROW_BUFS
    from sparseps.rpc.ops import OPS

    names = [b.name for b in OPS["move_import"].bufs]
    assert names == [f"r_{n}" for n in ROW_BUFS] + [f"p_{n}" for n in PENDING_BUFS]


def test_a_placement_routes_with_the_kernels_plain_routing_compiled():
    """A placement's routing uses the overloads of the routing kernel that a job's plain
    routing made (its owners table is read-only, as the plain one is): a worker does not
    compile one at its first scale's cut-over, which on a cold kernel cache held every
    sync worker for seconds."""
    from sparseps.core import routing

    keys = np.arange(1, 500, dtype=np.uint64)
    routing.group_by_server(keys, 3)
    routing.route_by_server(keys, 3)
    before = list(routing._group.signatures)
    placement = Placement.default(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    placement.group(keys, dedup=True)
    placement.group(keys, dedup=False)
    assert routing._group.signatures == before
