"""Compiled passes of the memory tier (:mod:`sparseps.table.tier`): promote, evict, append.

The tier's state, all plain arrays:

- ``cache [C, width]``: the rows held in memory, one per *slot*;
- ``id_of [C]`` int64: the row id a slot holds, -1 for a free slot;
- ``slot_of [N]`` int32: the slot holding row id ``r``, -1 when the row is only on disk;
- ``disk_of [N]`` int64: the file row holding id ``r``'s disk copy, -1 for none yet;
- ``owner [F]`` int32: the id whose disk copy file row ``f`` is, -1 for garbage/free;
- ``seg_live [F / seg]`` int32: live disk copies per segment of ``seg`` file rows;
- ``bufs [B, seg, width]``: write buffers, one segment each; ``seg_buf [F / seg]``
  int32 / ``buf_seg [B]`` int64 say which segment a buffer holds (-1: none);
- ``front [3]`` int64: the next file row to write, the end of its segment, its buffer;
- ``ref [C]`` uint8: the CLOCK counter (0..``REF_MAX``): +1 per use, -1 per sweep of
  the hand, so a row survives as many sweeps as it was used recently (frequency and
  recency, like a 2-bit CLOCK);
- ``dirty [C]`` uint8: the slot's row differs from its disk copy;
- ``pin [C]`` int64: the op (epoch) that last used the slot; an op never evicts a row it
  has handed out, so every slot it got stays valid until it ends.

Writes are *appended* (log-structured) into the write buffer of the current segment and
reach the file a whole segment per ``pwrite`` (the tier writes full buffers out before
the next op); the previous disk copy of the row becomes garbage. Writing rows in place
through a memory map was measured at ~3-4 us per row on this box's ext4 (a write fault
with a journal and mtime update per page); reading them through the map mapped whole
large folios per fault (~110 MB of RSS for a 3000-row pull). So rows are read with one
``pread`` each (~0.9 us, nothing mapped), or from a write buffer while their segment
has not been written yet.

Kernels assume valid input and that the caller reserved free file rows and buffers.
"""

from __future__ import annotations

from numba import types

from ..core.jit import njit

__all__ = [
    "REF_MAX", "append", "ensure", "flush", "forget", "move_rows", "pin_hits", "plan_rows",
    "read_rows", "zero_garbage",
]  # fmt: skip

REF_MAX = 3
# ssize_t pread(int fd, void *buf, size_t count, off_t offset): resolved by name from
# the C library at link time, so the kernels that call it stay cacheable
_pread = types.ExternalFunction("pread", types.intp(types.intc, types.voidptr, types.uintp, types.intp))  # fmt: skip


@njit(nogil=True, cache=True, inline="always")
def _next_front(front, seg_live, seg_buf, buf_seg, seg):  # pragma: no cover - compiled
    """Start a new segment: one without live copies or a pending buffer, and a free
    buffer; False if either is missing. The full segment stays in its buffer."""
    nseg = seg_live.shape[0]
    start = front[0] // seg if front[0] > 0 else 0
    found = -1
    for t in range(nseg):
        s = (start + t) % nseg
        if seg_live[s] == 0 and seg_buf[s] < 0:
            found = s
            break
    if found < 0:
        return False
    for b in range(buf_seg.shape[0]):
        if buf_seg[b] < 0:
            buf_seg[b] = found
            seg_buf[found] = b
            front[0] = found * seg
            front[1] = found * seg + seg
            front[2] = b
            return True
    return False


@njit(nogil=True, cache=True)
def append(
    src, i, r, bufs, seg_buf, buf_seg, disk_of, owner, seg_live, front, seg
):  # pragma: no cover
    """Write ``src[i]`` as id ``r``'s disk copy at the front; the old copy turns garbage."""
    if front[0] >= front[1] and not _next_front(front, seg_live, seg_buf, buf_seg, seg):
        # the tier reserves room before every op: reaching this is a bug, and writing on
        # would overwrite a live copy
        raise RuntimeError("disk tier: append without a reserved segment and buffer")
    f = front[0]
    b = front[2]
    at = f - (f // seg) * seg
    for j in range(src.shape[1]):
        bufs[b, at, j] = src[i, j]
    old = disk_of[r]
    if old >= 0:
        owner[old] = -1
        seg_live[old // seg] -= 1
    disk_of[r] = f
    owner[f] = r
    seg_live[f // seg] += 1
    front[0] = f + 1


@njit(nogil=True, cache=True, inline="always")
def _read(f, dst, bufs, seg_buf, seg, fd, row_bytes):  # pragma: no cover - compiled
    """File row ``f`` into ``dst`` (from its write buffer if it has not been written)."""
    b = seg_buf[f // seg]
    if b >= 0:
        at = f - (f // seg) * seg
        for j in range(dst.shape[0]):
            dst[j] = bufs[b, at, j]
        return True
    return _pread(fd, dst.ctypes, row_bytes, f * row_bytes) == row_bytes


@njit(nogil=True, cache=True)
def pin_hits(ids, slot_of, pin, epoch):  # pragma: no cover - compiled
    """Pin the slots of the ids >= 0 of ``ids`` that are in memory, for the op ``epoch``,
    and count the others (repeats counted). Pinned first, a row the op will use cannot
    be evicted by the op's own promotions before its turn, so the op promotes (and
    evicts, and writes back) at most that many rows."""
    misses = 0
    for k in range(ids.shape[0]):
        r = ids[k]
        if r < 0:
            continue
        s = slot_of[r]
        if s < 0:
            misses += 1
        else:
            pin[s] = epoch
    return misses


@njit(nogil=True, cache=True)
def plan_rows(ids, slot_of, disk_of, seg_buf, seg, most, out_ids, out_where, out_buffered):  # fmt: skip  # pragma: no cover - compiled
    """The distinct ids among ``ids`` with no slot but a disk copy, at most ``most``:
    ``out_ids[:n]`` with their file rows ``out_where[:n]``, to read from the file, and
    ``out_buffered[:b]``, whose copy is in a write buffer. Returns ``(n, b)``. Repeats
    are skipped by marking ``slot_of`` -2 meanwhile (restored before returning)."""
    n = 0
    b = 0
    for k in range(ids.shape[0]):
        if n + b == most:
            break
        r = ids[k]
        if r < 0 or slot_of[r] != -1:
            continue
        f = disk_of[r]
        if f < 0:
            continue
        slot_of[r] = -2
        if seg_buf[f // seg] >= 0:
            out_buffered[b] = r
            b += 1
        else:
            out_ids[n] = r
            out_where[n] = f
            n += 1
    for k in range(n):
        slot_of[out_ids[k]] = -1
    for k in range(b):
        slot_of[out_buffered[k]] = -1
    return n, b


@njit(nogil=True, cache=True)
def read_rows(fd, row_bytes, where, out, ok):  # pragma: no cover - compiled
    """``out[i] =`` file row ``where[i]`` (one ``pread`` each), ``ok[i]`` whether it read
    whole. Touches nothing of the tier: a prefetch runs it without holding any lock."""
    for i in range(where.shape[0]):
        got = _pread(fd, out[i].ctypes, row_bytes, where[i] * row_bytes)
        ok[i] = got == row_bytes


@njit(nogil=True, cache=True)
def ensure(ids, start, out, slot_of, id_of, ref, dirty, pin, epoch, hand, cache, fd, row_bytes,
           bufs, seg_buf, buf_seg, disk_of, owner, seg_live, front, seg, load, mark_dirty,
           counts):  # fmt: skip  # pragma: no cover - compiled
    """Give every id >= 0 of ``ids[start:]`` a slot (``out``), promoting rows from disk.

    A row not in memory takes a free slot or evicts one chosen by the CLOCK hand
    (appending it to disk first if dirty). ``load`` False skips reading the disk copy
    (new rows, whose value the caller writes next); ``mark_dirty`` marks every slot used.
    ``counts`` accumulates ``[promoted, evicted, written]``.

    Returns:
        ``(k, hand, status)``: status 0 and ``k == len(ids)`` when done; 1: every slot is
        pinned by this op, grow the cache and resume at ``k``; 2: reading the disk copy
        of ``ids[k]`` failed (nothing of ``ids[k:]`` was done).
    """
    capacity = id_of.shape[0]
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
                    return k, hand, 1
                v = hand
                hand += 1
                if hand == capacity:
                    hand = 0
                steps += 1
                if id_of[v] < 0 or (pin[v] != epoch and ref[v] == 0):
                    break
                if pin[v] != epoch:
                    ref[v] -= 1
            old = id_of[v]
            if old >= 0:  # evict: a changed row is appended (buffered) before its slot goes
                if dirty[v]:
                    append(cache, v, old, bufs, seg_buf, buf_seg, disk_of, owner, seg_live,
                           front, seg)  # fmt: skip
                    counts[2] += 1
                slot_of[old] = -1
                id_of[v] = -1
                dirty[v] = 0
                counts[1] += 1
            if load:
                if not _read(disk_of[r], cache[v], bufs, seg_buf, seg, fd, row_bytes):
                    return k, hand, 2  # slot v is free now; nothing else changed
                counts[0] += 1
            s = v
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
    return ids.shape[0], hand, 0


@njit(nogil=True, cache=True)
def flush(start, limit, cache, id_of, dirty, bufs, seg_buf, buf_seg, disk_of, owner, seg_live,
          front, seg):  # fmt: skip  # pragma: no cover - compiled
    """Append the dirty slots' rows from slot ``start`` on, at most ``limit`` of them.

    Returns:
        ``(next slot, rows written)``; next slot == C when every slot was seen.
    """
    written = 0
    for s in range(start, id_of.shape[0]):
        if written == limit:
            return s, written
        r = id_of[s]
        if r >= 0 and dirty[s]:
            append(cache, s, r, bufs, seg_buf, buf_seg, disk_of, owner, seg_live, front, seg)
            dirty[s] = 0
            written += 1
    return id_of.shape[0], written


@njit(nogil=True, cache=True)
def write_rows(ids, rows, slot_of, dirty, cache, bufs, seg_buf, buf_seg, disk_of, owner,
               seg_live, front, seg):  # fmt: skip  # pragma: no cover - compiled
    """``row(ids[i]) = rows[i]`` where the row lives: its slot (then dirty) or the disk."""
    width = rows.shape[1]
    for i in range(ids.shape[0]):
        r = ids[i]
        s = slot_of[r]
        if s >= 0:
            for j in range(width):
                cache[s, j] = rows[i, j]
            dirty[s] = 1
        else:
            append(rows, i, r, bufs, seg_buf, buf_seg, disk_of, owner, seg_live, front, seg)


@njit(nogil=True, cache=True)
def move_rows(
    first, rows, bufs, seg_buf, buf_seg, disk_of, owner, seg_live, front, seg
):  # pragma: no cover
    """Compaction: append the live copies among file rows ``first + i`` (values ``rows[i]``,
    a segment read from the file) so that their segment becomes free; returns how many."""
    moved = 0
    for i in range(rows.shape[0]):
        r = owner[first + i]
        if r >= 0:
            append(rows, i, r, bufs, seg_buf, buf_seg, disk_of, owner, seg_live, front, seg)
            moved += 1
    return moved


@njit(nogil=True, cache=True)
def forget(
    ids, slot_of, id_of, ref, dirty, disk, disk_of, owner, seg_live, seg
):  # pragma: no cover
    """Rows ``ids`` were deleted: free their slots and zero their disk copies (``disk``:
    the file's map, every buffer written out)."""
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
        f = disk_of[r]
        if f >= 0:
            for j in range(width):
                disk[f, j] = 0.0
            owner[f] = -1
            seg_live[f // seg] -= 1
            disk_of[r] = -1


@njit(nogil=True, cache=True)
def zero_garbage(disk, owner):  # pragma: no cover - compiled
    """Zero the superseded copies (rows no id owns) that still hold data."""
    width = disk.shape[1]
    zeroed = 0
    for f in range(owner.shape[0]):
        if owner[f] >= 0:
            continue
        nonzero = False
        for j in range(width):
            if disk[f, j] != 0.0:
                nonzero = True
                break
        if nonzero:
            for j in range(width):
                disk[f, j] = 0.0
            zeroed += 1
    return zeroed
