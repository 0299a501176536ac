"""Per-batch key bookkeeping: dedup the ids of a group of slots, once, vectorized.

A batch holds, per slot, a jagged list of uint64 ids (``values`` + ``offsets``). Every
table that reads a group of slots needs the same three things for a step:

- ``keys``: the unique ids of the batch (one pull/push per table and server, no
  duplicates on the wire);
- ``index`` and ``bag_offsets``: where each occurrence's row sits in the pulled ``[U, dim]``
  matrix, laid out as ``S * B`` bags (slot-major) for
  :func:`sparseps.core.pooling.pool_bags`;
- ``shows`` / ``clicks``: per unique key, how many times it occurred and how many of those
  occurrences were in positive samples (the show/click statistics the servers keep).

A table read by several modules over different slots is deduplicated once, over the
union of their slots; :meth:`SlotLookup.select` then gives each module its own
``index``/``bag_offsets`` into the same ``keys`` (slices of the union's arrays, no second
dedup), so there is one pull and one push per table and the modules' gradients land in
one ``[U, dim]`` tensor.

Worked example (2 samples, slots ``a`` and ``b``)::

    a: values [5, 7, 5]  offsets [0, 2, 3]      sample 0 -> [5, 7], sample 1 -> [5]
    b: values [7]        offsets [0, 0, 1]      sample 0 -> [],     sample 1 -> [7]
    label [1, 0]
    keys        [5, 7]
    index       [0, 1, 0, 1]          (occurrences a0, a0, a1, b1 -> rows of keys)
    bag_offsets [0, 2, 3, 3]          (bags a/s0, a/s1, b/s0, b/s1)
    slot_bounds [0, 3, 4]             (occurrences of a: 0..2, of b: 3)
    shows       [2, 2]   clicks [1, 1]
    select(["b"]): keys [5, 7], index [1], bag_offsets [0, 0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .keysets import unique_inverse

__all__ = ["SlotLookup", "build_lookup"]


@dataclass(frozen=True)
class SlotLookup:
    """The deduplicated ids of a group of slots in one batch (see the module docstring)."""

    slots: tuple[str, ...]
    batch_size: int
    keys: np.ndarray  # uint64 [U], sorted
    index: np.ndarray  # int64 [nnz]
    bag_offsets: np.ndarray  # int64 [S * B]
    shows: np.ndarray  # float32 [U]
    clicks: np.ndarray  # float32 [U]
    slot_bounds: np.ndarray  # int64 [S + 1]: slot s owns index[slot_bounds[s]:slot_bounds[s+1]]

    @property
    def num_slots(self) -> int:
        return len(self.slots)

    def select(self, slots: Sequence[str]) -> SlotLookup:
        """The lookup of a sub-sequence of ``self.slots`` over the same ``keys``.

        ``index`` and ``bag_offsets`` address the same ``[U, dim]`` rows; ``shows`` and
        ``clicks`` stay those of every slot of ``self`` (they describe the keys, which are
        pushed once per table).

        Raises:
            InputError: a slot that ``self`` was not built over.
        """
        slots = tuple(slots)
        if slots == self.slots:
            return self
        position = {name: i for i, name in enumerate(self.slots)}
        missing = [name for name in slots if name not in position]
        if missing:
            raise InputError(
                f"slots {missing} are not in this lookup (built over {list(self.slots)})"
            )
        size, index, bags, bounds = self.batch_size, [], [], [0]
        for name in slots:  # a loop over slots; each step is a slice of the union's arrays
            p = position[name]
            start, stop = int(self.slot_bounds[p]), int(self.slot_bounds[p + 1])
            index.append(self.index[start:stop])
            bags.append(self.bag_offsets[p * size : (p + 1) * size] - start + bounds[-1])
            bounds.append(bounds[-1] + stop - start)
        return SlotLookup(
            slots=slots,
            batch_size=size,
            keys=self.keys,
            index=np.concatenate(index) if index else np.empty(0, np.int64),
            bag_offsets=np.concatenate(bags) if bags else np.empty(0, np.int64),
            shows=self.shows,
            clicks=self.clicks,
            slot_bounds=np.asarray(bounds, np.int64),
        )


def build_lookup(batch, slots: Sequence[str]) -> SlotLookup:
    """Dedup the ids of ``slots`` in ``batch`` (no Python loop over ids or samples).

    Args:
        batch: a :class:`sparseps.data.Batch` (``label``, ``slots[name].values/offsets``).
        slots: the slot names, in the order the embedding module outputs them.

    Raises:
        InputError: a slot is missing from the batch.
    """
    size = len(batch)
    values, bag_starts, occurrence_sample, bounds = [], [], [], [0]
    base = 0
    for name in slots:
        slot = batch.slots.get(name)
        if slot is None:
            raise InputError(
                f"slot {name!r} is not in the batch (batch slots: {', '.join(batch.slots)}); "
                "check the embedding's slots= against the dataset schema"
            )
        offsets = np.asarray(slot.offsets, dtype=np.int64)
        values.append(slot.values)
        bag_starts.append(offsets[:-1] + base)
        occurrence_sample.append(np.repeat(np.arange(size, dtype=np.int64), np.diff(offsets)))
        base += int(offsets[-1])
        bounds.append(base)
    all_values = np.concatenate(values) if values else np.empty(0, np.uint64)
    keys, index = unique_inverse(all_values)
    shows = np.bincount(index, minlength=keys.size).astype(np.float32)
    label = np.asarray(batch.label, dtype=np.float64)
    samples = np.concatenate(occurrence_sample) if occurrence_sample else np.empty(0, np.int64)
    clicks = np.bincount(index, weights=label[samples], minlength=keys.size).astype(np.float32)
    return SlotLookup(
        slots=tuple(slots),
        batch_size=size,
        keys=keys.astype(np.uint64, copy=False),
        index=index,
        bag_offsets=np.concatenate(bag_starts) if bag_starts else np.empty(0, np.int64),
        shows=shows,
        clicks=clicks,
        slot_bounds=np.asarray(bounds, np.int64),
    )
