"""Which server owns a key, and which server holds a dense table.

Sparse keys: ``server_of(keys, S)`` mixes each key with the splitmix64 finaliser (after
xor-ing a fixed salt) and maps the top 32 bits of the mix onto ``0..S-1`` with a
multiply-shift (Lemire's fast range reduction)::

    h = splitmix64_finaliser(key ^ 0x5DEECE66DA5A5A5A)
    server = ((h >> 32) * S) >> 32

Why this shape:

- It is a pure function of the 64-bit key and ``S`` (no Python ``hash``, no process
  seed), so every worker, tool and future version agrees on the owner. Saved shards can
  be reloaded onto any number of servers by re-applying it.
- Sequential ids (``1, 2, 3, ...``) and slot-prefixed ids spread evenly, because the
  finaliser avalanches every input bit.
- The salt and the use of the *high* bits keep the routing independent of the low bits
  a table's own hash map uses, so each server's hash map stays uniformly loaded.

Dense tables live whole on one server: ``dense_server_of(name, S)`` is the xxh64
(seed 0) of the UTF-8 name modulo ``S``.

The compiled side - ``group_by_server`` (dedup a batch and group it by owner, what the
client sends for a push), ``route_by_server`` (group it by owner as it is, for a pull: a
server pulls repeated keys at the cost of the in-process table, and the worker's keys are
already distinct, so hashing them into a set on the client paid twice for nothing) and
``misrouted`` (what a server checks on arrival) - uses the same
``owner`` function as ``server_of``, so the client, the servers, sync mode's key shares
and the checkpoint's re-routing agree by construction.
"""

from __future__ import annotations

import numpy as np
import xxhash

from ..errors import InputError
from .hashing import draw_seed, mix64, mix64_array
from .jit import njit
from .keysets import first_seen

__all__ = [
    "dense_server_of",
    "group_by_server",
    "group_by_table",
    "misrouted",
    "owner_of",
    "route_by_server",
    "route_by_table",
    "routing_hash",
    "server_of",
    "split_by_server",
    "vshard_of",
]

ROUTING_SALT = np.uint64(0x5DEECE66DA5A5A5A)


@njit(nogil=True, cache=True, inline="always")
def owner_of(key, num_servers):  # pragma: no cover - compiled
    """Owner rank of one key (compiled; the formula of the module docstring)."""
    z = mix64(key ^ ROUTING_SALT)
    return np.int64(((z >> np.uint64(32)) * np.uint64(num_servers)) >> np.uint64(32))


def routing_hash(keys: np.ndarray) -> np.ndarray:
    """The salted splitmix64 finaliser of each key (uint64 in, uint64 out)."""
    return mix64_array(keys, int(ROUTING_SALT))


def _check(keys: np.ndarray, num_servers: int) -> None:
    if not isinstance(keys, np.ndarray) or keys.dtype != np.uint64 or keys.ndim != 1:
        found = (
            f"{keys.dtype} with shape {keys.shape}"
            if isinstance(keys, np.ndarray)
            else type(keys).__name__
        )
        raise InputError(f"server_of: keys must be a 1-D uint64 array, got {found}")
    if not isinstance(num_servers, int) or isinstance(num_servers, bool) or num_servers < 1:
        raise InputError(f"server_of: num_servers must be an int >= 1, got {num_servers!r}")


def server_of(keys: np.ndarray, num_servers: int) -> np.ndarray:
    """Owner rank of each key.

    Args:
        keys: 1-D uint64 array.
        num_servers: number of servers ``S`` (>= 1).

    Returns:
        int64 array of ranks in ``0..S-1``, same length as ``keys``.

    Raises:
        InputError: keys is not a 1-D uint64 array, or num_servers < 1.
    """
    _check(keys, num_servers)
    if num_servers == 1:
        return np.zeros(len(keys), dtype=np.int64)
    high = routing_hash(keys) >> np.uint64(32)
    return ((high * np.uint64(num_servers)) >> np.uint64(32)).astype(np.int64)


def split_by_server(keys: np.ndarray, num_servers: int) -> list[np.ndarray]:
    """Positions of the keys each server owns: ``result[s]`` indexes ``keys`` (int64).

    The positions for one server keep the order they have in ``keys``.
    """
    owner = server_of(keys, num_servers)
    if num_servers == 1:
        return [np.arange(len(keys), dtype=np.int64)]
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(num_servers + 1))
    return [order[bounds[s] : bounds[s + 1]] for s in range(num_servers)]


def dense_server_of(name: str, num_servers: int) -> int:
    """Rank of the server that holds the dense table ``name`` (xxh64 of the name mod S)."""
    if not isinstance(name, str) or not name:
        raise InputError(f"dense_server_of: name must be a non-empty string, got {name!r}")
    if not isinstance(num_servers, int) or isinstance(num_servers, bool) or num_servers < 1:
        raise InputError(f"dense_server_of: num_servers must be an int >= 1, got {num_servers!r}")
    return xxhash.xxh64_intdigest(name.encode("utf-8"), seed=0) % num_servers


@njit(nogil=True, cache=True, inline="always")
def vshard_of(key, vshards):  # pragma: no cover - compiled
    """Virtual shard of one key: the same mix as :func:`owner_of`, ranged onto ``vshards``."""
    z = mix64(key ^ ROUTING_SALT)
    return np.int64(((z >> np.uint64(32)) * np.uint64(vshards)) >> np.uint64(32))


@njit(nogil=True, cache=True, inline="always")
def _owner(key, num_servers, vshards, table):  # pragma: no cover - compiled
    if vshards > 0:  # a placement: virtual shard -> rank (core.placement)
        return table[vshard_of(key, vshards)]
    return owner_of(key, num_servers) if num_servers > 1 else np.int64(0)


@njit(nogil=True, cache=True)
def _group(keys, num_servers, seed, vshards, table, dedup):  # pragma: no cover - compiled
    n = keys.shape[0]
    if dedup:
        # A secret seed per call: crafted keys cannot collide on purpose (an unseeded
        # multiplicative hash is invertible, and a batch of colliding keys would make
        # the hash set quadratic). The result does not depend on the seed.
        unique, first = first_seen(keys, seed)
    else:  # every occurrence is its own entry, in the caller's order
        unique, first = keys.copy(), np.arange(n)
    u = unique.shape[0]
    owner = np.empty(u, np.int64)
    for j in range(u):
        owner[j] = _owner(unique[j], num_servers, vshards, table)
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
    return _group(keys, num_servers, draw_seed(), 0, _NO_TABLE, True)


def route_by_server(
    keys: np.ndarray, num_servers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Group ``keys`` by owning server as they are (repeats kept): ``(grouped, offsets,
    inverse)`` as :func:`group_by_server`, except that ``grouped`` holds every key once per
    occurrence; ``inverse`` is None when ``grouped`` is ``keys`` itself (one server)."""
    if num_servers == 1:
        return keys, np.array([0, len(keys)], np.int64), None
    return _group(keys, num_servers, 0, 0, _NO_TABLE, False)


# Read-only, like every Placement's owners table: numba compiles a separate overload of
# _group for a read-only table, and the plain routing of a job's first steps then
# compiles (or loads) the one a placement's routing uses. Had they differed, a worker on
# a cold kernel cache compiled it at a scale's cut-over, every sync worker waiting
# seconds (the Ray scale test on CI).
_NO_TABLE = np.zeros(1, np.int64)
_NO_TABLE.setflags(write=False)


def group_by_table(
    keys: np.ndarray, num_ranks: int, owners: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`group_by_server` with owners from a placement table: key -> virtual shard
    ``vshard_of(key, len(owners))`` -> rank ``owners[vshard]`` (int64, each in
    ``0..num_ranks-1``, validated by :class:`sparseps.core.placement.Placement`)."""
    return _group(keys, num_ranks, draw_seed(), len(owners), owners, True)


def route_by_table(
    keys: np.ndarray, num_ranks: int, owners: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`route_by_server` with owners from a placement table (as :func:`group_by_table`)."""
    return _group(keys, num_ranks, 0, len(owners), owners, False)


@njit(nogil=True, cache=True)
def _misrouted(keys, num_servers, rank):  # pragma: no cover - compiled
    count = 0
    first = -1
    for i in range(keys.shape[0]):
        if owner_of(keys[i], num_servers) != rank:
            if first < 0:
                first = i
            count += 1
    return count, first


def misrouted(keys: np.ndarray, num_servers: int, rank: int) -> tuple[int, int]:
    """``(how many keys do not belong to server rank, index of the first, or -1)``."""
    if num_servers == 1 or not len(keys):
        return 0, -1
    return _misrouted(keys, num_servers, rank)
