"""Compiled passes of the memory tier (:mod:`sparseps.table.tier`): promote, evict, write.

The tier's state, all plain arrays:

- ``cache [C, width]``: the rows held in memory, one per *slot*;
- ``id_of [C]`` int64: the row id (= disk row) a slot holds, -1 for a free slot;
- ``slot_of [D]`` int32: the slot holding row id ``r``, -1 when the row is only on disk;
- ``ref [C]`` uint8: the CLOCK counter (0..``REF_MAX``): +1 per use, -1 per sweep of
  the hand, so a row survives as many sweeps as it was used recently (frequency and
  recency, like a 2-bit CLOCK);
- ``dirty [C]`` uint8: the slot's row differs from its disk copy (written on eviction);
- ``pin [C]`` int64: the op (epoch) that last used the slot; an op never evicts a row it
  has handed out, so every slot it got stays valid until it ends.

Kernels assume valid input (ids < D, slots < C); the tier checks sizes first.
"""

from __future__ import annotations

from numba import njit

__all__ = ["REF_MAX", "ensure", "flush", "forget", "write_rows"]

REF_MAX = 3


@njit(nogil=True, cache=True)
def ensure(ids, start, out, slot_of, id_of, ref, dirty, pin, epoch, hand, cache, disk,
           load, mark_dirty, counts):  # fmt: skip  # pragma: no cover - compiled
    """Give every id >= 0 of ``ids[start:]`` a slot (``out``), promoting rows from disk.

    A row not in memory takes a free slot or evicts one chosen by the CLOCK hand
    (writing it to disk first if dirty). ``load`` False skips reading the disk row (new
    rows, whose value the caller writes next); ``mark_dirty`` marks every slot used.
    ``counts`` accumulates ``[promoted, evicted, written]``.

    Returns:
        ``(k, hand)``: ``k == len(ids)`` when done; otherwise every slot is pinned by
        this op and the caller must grow the cache and resume at ``k``.
    """
    capacity = id_of.shape[0]
    width = cache.shape[1]
    for k in range(start, ids.shape[0]):
        r = ids[k]
        if r < 0:
            out[k] = -1
            continue
        s = slot_of[r]
        if s < 0:
            steps = 0
            while True:
                if steps > (REF_MAX + 1) * capacity:
                    return k, hand
                v = hand
                hand += 1
                if hand == capacity:
                    hand = 0
                steps += 1
                old = id_of[v]
                if old < 0:
                    break
                if pin[v] == epoch:
                    continue
                if ref[v] > 0:
                    ref[v] -= 1
                    continue
                if dirty[v]:
                    for j in range(width):
                        disk[old, j] = cache[v, j]
                    counts[2] += 1
                slot_of[old] = -1
                counts[1] += 1
                break
            s = v
            if load:
                for j in range(width):
                    cache[s, j] = disk[r, j]
                counts[0] += 1
            slot_of[r] = s
            id_of[s] = r
            dirty[s] = 0
            ref[s] = 0
        if ref[s] < REF_MAX:
            ref[s] += 1
        pin[s] = epoch
        if mark_dirty:
            dirty[s] = 1
        out[k] = s
    return ids.shape[0], hand


@njit(nogil=True, cache=True)
def flush(cache, id_of, dirty, disk):  # pragma: no cover - compiled
    """Write every dirty slot's row to its disk row; returns how many were written."""
    width = cache.shape[1]
    written = 0
    for s in range(id_of.shape[0]):
        r = id_of[s]
        if r >= 0 and dirty[s]:
            for j in range(width):
                disk[r, j] = cache[s, j]
            dirty[s] = 0
            written += 1
    return written


@njit(nogil=True, cache=True)
def forget(ids, slot_of, id_of, ref, dirty, disk):  # pragma: no cover - compiled
    """Rows ``ids`` are deleted: free their slots and zero their disk rows."""
    width = disk.shape[1]
    for i in range(ids.shape[0]):
        r = ids[i]
        if r < 0:
            continue
        s = slot_of[r]
        if s >= 0:
            id_of[s] = -1
            ref[s] = 0
            dirty[s] = 0
            slot_of[r] = -1
        for j in range(width):
            disk[r, j] = 0.0


@njit(nogil=True, cache=True)
def write_rows(ids, rows, slot_of, dirty, cache, disk):  # pragma: no cover - compiled
    """``row(ids[i]) = rows[i]`` where the row lives: its slot (then dirty) or its disk row."""
    width = rows.shape[1]
    for i in range(ids.shape[0]):
        r = ids[i]
        s = slot_of[r]
        if s >= 0:
            for j in range(width):
                cache[s, j] = rows[i, j]
            dirty[s] = 1
        else:
            for j in range(width):
                disk[r, j] = rows[i, j]
