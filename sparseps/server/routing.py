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
"""

from __future__ import annotations

import numpy as np
import xxhash

from ..errors import InputError

__all__ = ["dense_server_of", "mix64", "server_of", "split_by_server"]

_SALT = np.uint64(0x5DEECE66DA5A5A5A)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def mix64(keys: np.ndarray) -> np.ndarray:
    """The salted splitmix64 finaliser of each key (uint64 in, uint64 out)."""
    z = keys ^ _SALT
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    return z ^ (z >> np.uint64(31))


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
    high = mix64(keys) >> np.uint64(32)
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
