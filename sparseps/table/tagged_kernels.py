"""The compiled kernels of :class:`~sparseps.table.tagged_index.TaggedIndex`: linear
probing over one byte of tag and one int32 row id per slot, with each row's key kept by
row id (``row_keys``) instead of in the slot.

A slot's tag is ``EMPTY`` (0), ``TOMBSTONE`` (1) or, when full, ``2 + (hash & 0xFF) %
254``: seven to eight bits of the key's hash, so a probe compares a key (one read of
``row_keys``) only when the tags agree (1 in 254 for another key). The home slot is the
fastrange of the hash's high 32 bits, as in :mod:`~sparseps.table.hashmap_kernels`.
"""

from __future__ import annotations

import numpy as np

from ..core.hashing import seeded_hash
from ..core.jit import njit
from ..optim.prefetch import PREFETCH_AHEAD, prefetch
from .hashmap_kernels import FIND_AHEAD

__all__ = ["EMPTY", "TOMBSTONE", "erase", "find", "find_or_insert", "items", "rehash"]

EMPTY, TOMBSTONE = 0, 1


@njit(nogil=True, cache=True, inline="always")
def _place(key, capacity, seed):  # pragma: no cover - compiled
    h = seeded_hash(key, seed)
    home = np.int64(((h >> np.uint64(32)) * np.uint64(capacity)) >> np.uint64(32))
    tag = np.uint8(2 + (h & np.uint64(0xFF)) % np.uint64(254))
    return home, tag


@njit(nogil=True, cache=True)
def find(tags, ids, row_keys, keys, out, seed):  # pragma: no cover - compiled
    # Two phases, as hashmap_kernels.find: every key's home and tag first, then the probes
    # with the slots of the key FIND_AHEAD places on already requested (was: each key
    # hashed twice, PREFETCH_AHEAD ahead): 54-57 -> 36-37 ns a key on a 1M-key index,
    # 13k-key batches, 2-core box.
    capacity = tags.shape[0]
    n = keys.shape[0]
    start = np.empty(n, np.int64)
    want = np.empty(n, np.uint8)
    for k in range(n):
        start[k], want[k] = _place(keys[k], capacity, seed)
    for k in range(n):
        if k + FIND_AHEAD < n:
            ahead = start[k + FIND_AHEAD]
            prefetch(tags, ahead, 0)
            prefetch(ids, ahead, 0)
        key = keys[k]
        i = start[k]
        tag = want[k]
        result = -1
        while True:
            t = tags[i]
            if t == EMPTY:
                break
            if t == tag:
                r = ids[i]
                if row_keys[r] == key:
                    result = r
                    break
            i += 1
            if i == capacity:
                i = 0
        out[k] = result


@njit(nogil=True, cache=True)
def find_or_insert(tags, ids, row_keys, keys, start, out, is_new, free, nfree, next_id, used,
                   limit, size, seed):  # fmt: skip  # pragma: no cover - compiled
    capacity = tags.shape[0]
    n = keys.shape[0]
    for k in range(start, n):
        if used >= limit:
            return k, nfree, next_id, used, size  # the caller rehashes and resumes at k
        if k + PREFETCH_AHEAD < n:
            ahead, _ = _place(keys[k + PREFETCH_AHEAD], capacity, seed)
            prefetch(tags, ahead, 0)
        key = keys[k]
        i, tag = _place(key, capacity, seed)
        grave = -1
        found = -1
        while True:
            t = tags[i]
            if t == EMPTY:
                break
            if t == tag:
                r = ids[i]
                if row_keys[r] == key:
                    found = r
                    break
            elif t == TOMBSTONE and grave < 0:
                grave = i
            i += 1
            if i == capacity:
                i = 0
        if found >= 0:
            out[k] = found
            is_new[k] = False
            continue
        if grave >= 0:
            i = grave  # a reused tombstone was already a used slot
        else:
            used += 1
        if nfree > 0:
            nfree -= 1
            new_id = free[nfree]
        else:
            new_id = next_id
            next_id += 1
        tags[i] = tag
        ids[i] = new_id
        row_keys[new_id] = key
        size += 1
        out[k] = new_id
        is_new[k] = True
    return n, nfree, next_id, used, size


@njit(nogil=True, cache=True)
def erase(tags, ids, row_keys, keys, out, free, nfree, used, size, seed):  # pragma: no cover
    capacity = tags.shape[0]
    for k in range(keys.shape[0]):
        key = keys[k]
        i, tag = _place(key, capacity, seed)
        out[k] = -1
        while True:
            t = tags[i]
            if t == EMPTY:
                break
            if t == tag and row_keys[ids[i]] == key:
                out[k] = ids[i]
                free[nfree] = ids[i]
                nfree += 1
                size -= 1
                nxt = i + 1 if i + 1 < capacity else 0
                if tags[nxt] == EMPTY:  # the chain ends here: no tombstone, nor before it
                    tags[i] = EMPTY
                    used -= 1
                    j = i - 1 if i > 0 else capacity - 1
                    while tags[j] == TOMBSTONE:
                        tags[j] = EMPTY
                        used -= 1
                        j = j - 1 if j > 0 else capacity - 1
                else:
                    tags[i] = TOMBSTONE
                break
            i += 1
            if i == capacity:
                i = 0
    return nfree, used, size


@njit(nogil=True, cache=True)
def rehash(otags, oids, ntags, nids, row_keys, seed):  # pragma: no cover - compiled
    capacity = ntags.shape[0]
    for s in range(otags.shape[0]):
        if otags[s] < 2:
            continue
        r = oids[s]
        i, tag = _place(row_keys[r], capacity, seed)
        while ntags[i] != EMPTY:
            i += 1
            if i == capacity:
                i = 0
        ntags[i] = tag
        nids[i] = r


@njit(nogil=True, cache=True)
def items(tags, ids, row_keys, out_keys, out_ids):  # pragma: no cover - compiled
    j = 0
    for s in range(tags.shape[0]):
        if tags[s] >= 2:
            r = ids[s]
            out_keys[j] = row_keys[r]
            out_ids[j] = r
            j += 1
    return j
