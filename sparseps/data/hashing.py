"""Stable 64-bit feature ids for categorical strings: XXH64, compiled, over arrow buffers.

A categorical value becomes a feature id with::

    id = xxh64(value_utf8, seed=slot_seed(slot))      slot_seed(slot) = xxh64(slot_utf8, seed=0)

so equal strings in different slots are different features (DESIGN §2.4), and the id
depends only on the slot *name* and the value bytes: not on the schema's column order,
the process, the machine or the Python version (never ``hash()``). XXH64 is the
algorithm of the ``xxhash`` package (``xxhash.xxh64_intdigest(value, seed)``); this
module is a numba port of it that runs over the data and offsets buffers of a whole
arrow string column at once, because one Python call per value is far too slow for the
reader's throughput target. ``tests/data/test_data_formats.py``
(``test_compiled_xxh64_is_bit_identical_to_the_xxhash_package``) proves the port
bit-identical to the package.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

from ..core.jit import njit
from ..errors import InputError

__all__ = ["hash_string_array", "hash_strings", "slot_seed", "xxh64_bytes", "xxh64_range"]

_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P3 = np.uint64(1609587929392839161)
_P4 = np.uint64(9650029242287828579)
_P5 = np.uint64(2870177450012600261)


def slot_seed(slot: str) -> int:
    """The XXH64 seed of a slot: ``xxh64(slot name as UTF-8, seed=0)``."""
    return xxhash.xxh64_intdigest(slot.encode("utf-8"), 0)


# Every operand below is uint64 on purpose: mixing in a Python int would make numba
# promote to float64 and silently lose the wrap-around arithmetic the hash relies on.
@njit(nogil=True, cache=True, inline="always")
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(nogil=True, cache=True, inline="always")
def _read64(data, p):
    v = np.uint64(0)
    for i in range(8):
        v |= np.uint64(data[p + i]) << np.uint64(8 * i)
    return v


@njit(nogil=True, cache=True, inline="always")
def _read32(data, p):
    v = np.uint64(0)
    for i in range(4):
        v |= np.uint64(data[p + i]) << np.uint64(8 * i)
    return v


@njit(nogil=True, cache=True, inline="always")
def _round(acc, lane):
    acc = acc + lane * _P2
    acc = _rotl(acc, 31)
    return acc * _P1


@njit(nogil=True, cache=True, inline="always")
def _merge(acc, val):
    acc = acc ^ _round(np.uint64(0), val)
    return acc * _P1 + _P4


@njit(nogil=True, cache=True)
def xxh64_range(data, start, end, seed):
    """XXH64 of ``data[start:end]`` (a uint8 array) with a uint64 seed."""
    p = start
    length = end - start
    if length >= 32:
        v1 = seed + _P1 + _P2
        v2 = seed + _P2
        v3 = seed
        v4 = seed - _P1
        limit = end - 32
        while p <= limit:
            v1 = _round(v1, _read64(data, p))
            v2 = _round(v2, _read64(data, p + 8))
            v3 = _round(v3, _read64(data, p + 16))
            v4 = _round(v4, _read64(data, p + 24))
            p += 32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(h, v1)
        h = _merge(h, v2)
        h = _merge(h, v3)
        h = _merge(h, v4)
    else:
        h = seed + _P5
    h = h + np.uint64(length)
    while p + 8 <= end:
        h = h ^ _round(np.uint64(0), _read64(data, p))
        h = _rotl(h, 27) * _P1 + _P4
        p += 8
    if p + 4 <= end:
        h = h ^ (_read32(data, p) * _P1)
        h = _rotl(h, 23) * _P2 + _P3
        p += 4
    while p < end:
        h = h ^ (np.uint64(data[p]) * _P5)
        h = _rotl(h, 11) * _P1
        p += 1
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    h = h ^ (h >> np.uint64(32))
    return h


@njit(nogil=True, cache=True)
def _hash_offsets(data, offsets, seed, out):
    for i in range(out.shape[0]):
        out[i] = xxh64_range(data, offsets[i], offsets[i + 1], seed)


def xxh64_bytes(value: bytes, seed: int = 0) -> int:
    """XXH64 of ``value`` through the compiled port (for tests and one-off ids)."""
    data = np.frombuffer(value, dtype=np.uint8)
    return int(xxh64_range(data, 0, data.size, np.uint64(seed)))


def hash_strings(data: np.ndarray, offsets: np.ndarray, seed: int) -> np.ndarray:
    """XXH64 of each ``data[offsets[i]:offsets[i+1]]``; ``data`` uint8, ``offsets`` int32/64."""
    out = np.empty(offsets.size - 1, dtype=np.uint64)
    if out.size:
        _hash_offsets(data, offsets, np.uint64(seed), out)
    return out


def hash_string_array(array: pa.Array, slot: str) -> tuple[np.ndarray, np.ndarray]:
    """Feature ids of an arrow string column, and which rows have a value.

    Args:
        array: a ``string`` or ``large_string`` arrow array (one chunk).
        slot: the slot name (selects the seed).

    Returns:
        ``(ids, present)``: uint64 ``[n]`` ids (meaningless where absent) and a bool
        ``[n]`` mask; a null or empty string is *absent* (the sample gets no id in the slot).

    Raises:
        InputError: the column is not a string column.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    offset_dtype: type[np.int32] | type[np.int64]
    if pa.types.is_string(array.type) or pa.types.is_binary(array.type):
        offset_dtype = np.int32
    elif pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type):
        offset_dtype = np.int64
    else:
        raise InputError(f"slot {slot!r}: expected a string column to hash, got {array.type}")
    n = len(array)
    if n == 0:
        return np.empty(0, np.uint64), np.zeros(0, bool)
    _, offsets_buf, data_buf = array.buffers()[:3]
    offsets = np.frombuffer(offsets_buf, dtype=offset_dtype)[array.offset : array.offset + n + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    )
    ids = hash_strings(data, offsets, slot_seed(slot))
    present = np.diff(offsets) > 0
    if array.null_count:
        present &= array.is_valid().to_numpy(zero_copy_only=False)
    return ids, present
