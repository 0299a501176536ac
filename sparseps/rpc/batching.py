"""Client-side batch preparation, compiled: dedup keys, group them by server, merge rows.

One pass over the batch with a small open-addressing hash set replaces
``np.unique`` + ``argsort`` (about 5x faster for 8192 keys, and it keeps first-occurrence
order). The owner of each key is computed with the same formula as
:func:`sparseps.server.routing.server_of` (a test pins the two together).

Result layout: unique keys grouped by owning server, ``keys[offsets[s]:offsets[s+1]]``
belong to server ``s`` (a contiguous slice, sent without copying), and ``inverse[i]`` is
the row of input key ``i`` in that grouped order.

Merging (push): a key's rows, shows and clicks are summed in input order, starting from
its first row, which is exactly what ``SparseTable.push`` does with duplicates, so a
batch pushed through the client and one pushed into a table give bit-identical rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..server.routing import _C1, _C2, _SALT
from ..table.hashmap import draw_seed, seeded_hash

__all__ = ["group_by_server", "merge_by_group", "misrouted"]


@njit(nogil=True, cache=True, inline="always")
def _owner(key, num_servers):  # pragma: no cover - compiled
    z = key ^ _SALT
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    z = z ^ (z >> np.uint64(31))
    return np.int64(((z >> np.uint64(32)) * np.uint64(num_servers)) >> np.uint64(32))


@njit(nogil=True, cache=True)
def _group(keys, num_servers, seed):  # pragma: no cover - compiled
    n = keys.shape[0]
    bits = 4
    while (1 << bits) < 2 * n:
        bits += 1
    size = 1 << bits
    mask = size - 1
    shift = np.uint64(64 - bits)
    slot_keys = np.empty(size, np.uint64)
    slot_index = np.full(size, -1, np.int64)
    unique = np.empty(n, np.uint64)
    owner = np.empty(n, np.int64)
    first = np.empty(n, np.int64)
    u = 0
    for i in range(n):
        key = keys[i]
        # A secret seed per call: crafted keys cannot collide on purpose (an unseeded
        # multiplicative hash is invertible, and a batch of colliding keys would make
        # this loop quadratic). The result does not depend on the seed.
        s = np.int64(seeded_hash(key, seed) >> shift)
        while True:
            j = slot_index[s]
            if j < 0:
                slot_index[s] = u
                slot_keys[s] = key
                unique[u] = key
                owner[u] = _owner(key, num_servers) if num_servers > 1 else 0
                first[i] = u
                u += 1
                break
            if slot_keys[s] == key:
                first[i] = j
                break
            s = (s + 1) & mask
    offsets = np.zeros(num_servers + 1, np.int64)
    for j in range(u):
        offsets[owner[j] + 1] += 1
    for r in range(num_servers):
        offsets[r + 1] += offsets[r]
    cursor = offsets[:-1].copy()
    place = np.empty(u, np.int64)
    grouped = np.empty(u, np.uint64)
    for j in range(u):
        p = cursor[owner[j]]
        cursor[owner[j]] += 1
        place[j] = p
        grouped[p] = unique[j]
    inverse = np.empty(n, np.int64)
    for i in range(n):
        inverse[i] = place[first[i]]
    return grouped, offsets, inverse


def group_by_server(
    keys: np.ndarray, num_servers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deduplicate ``keys`` and group them by owning server.

    Args:
        keys: 1-D uint64 (validated by the caller).
        num_servers: number of servers.

    Returns:
        ``(grouped, offsets, inverse)``: unique keys with server ``s``'s at
        ``grouped[offsets[s]:offsets[s + 1]]`` (first-occurrence order within a server),
        and ``inverse`` such that ``grouped[inverse] == keys``.
    """
    return _group(keys, num_servers, draw_seed())


@njit(nogil=True, cache=True)
def _merge(
    inverse, count, values, shows, clicks, has_shows, has_clicks
):  # pragma: no cover - compiled
    n, dim = values.shape
    merged = np.empty((count, dim), np.float32)
    merged_shows = np.zeros(count, np.float32)
    merged_clicks = np.zeros(count, np.float32)
    seen = np.zeros(count, np.bool_)
    for i in range(n):
        r = inverse[i]
        if seen[r]:
            for d in range(dim):
                merged[r, d] += values[i, d]
        else:
            seen[r] = True
            for d in range(dim):
                merged[r, d] = values[i, d]
        merged_shows[r] += shows[i] if has_shows else np.float32(1.0)
        if has_clicks:
            merged_clicks[r] += clicks[i]
    return merged, merged_shows, merged_clicks


def merge_by_group(
    inverse: np.ndarray,
    count: int,
    values: np.ndarray,
    shows: np.ndarray | None,
    clicks: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum rows, shows and clicks into the grouped order of :func:`group_by_server`.

    Args:
        inverse: from :func:`group_by_server`.
        count: number of unique keys.
        values: float32 ``[n, dim]``.
        shows, clicks: float32 ``[n]`` or None (1 show and 0 clicks per occurrence).

    Returns:
        ``(values [count, dim], shows [count], clicks [count])``.
    """
    empty = np.empty(0, np.float32)
    return _merge(
        inverse,
        count,
        values,
        empty if shows is None else shows,
        empty if clicks is None else clicks,
        shows is not None,
        clicks is not None,
    )


@njit(nogil=True, cache=True)
def _misrouted(keys, num_servers, rank):  # pragma: no cover - compiled
    count = 0
    first = -1
    for i in range(keys.shape[0]):
        if _owner(keys[i], num_servers) != rank:
            if first < 0:
                first = i
            count += 1
    return count, first


def misrouted(keys: np.ndarray, num_servers: int, rank: int) -> tuple[int, int]:
    """``(how many keys do not belong to server rank, index of the first, or -1)``."""
    if num_servers == 1 or not len(keys):
        return 0, -1
    return _misrouted(keys, num_servers, rank)
