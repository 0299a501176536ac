"""Pooling the rows of a batch's ids into one vector per (sample, slot).

A :class:`~sparseps.core.lookup.SlotLookup` says where each occurrence's row sits in the
pulled ``[U, dim]`` matrix (``index``) and where each of the ``S * B`` bags starts
(``bag_offsets``). :func:`pool_bags` sums (or averages) each bag's rows.

Why not ``F.embedding_bag``: on the CPU its backward is slow. For a batch of 512 samples
and 26 slots (13k ids, dim 8) its forward and backward took 2.4 ms of a worker's ~19 ms
step, against 0.4 ms for a gather (bags of one id, or none: a missing feature) and 1.0 ms
for a gather plus an ``index_add`` (longer bags). The result is the same sums; the
gradient is the same per-row sums, added in another order (float32 rounding may differ in
the last bit).
"""

from __future__ import annotations

import numpy as np
import torch

from .lookup import SlotLookup

__all__ = ["pool_bags", "slot_outputs"]

_MODES = ("sum", "mean")


def pool_bags(rows: torch.Tensor, lookup: SlotLookup, mode: str) -> torch.Tensor:
    """``[S * B, dim]``: bag ``b`` is the sum (``"sum"``) or mean (``"mean"``) of the rows of
    its occurrences, slot-major like ``lookup.bag_offsets``; an empty bag is zeros.

    Differentiable in ``rows`` (the pulled leaf tensor).
    """
    if mode not in _MODES:
        raise ValueError(f"pooling mode {mode!r}: expected one of {_MODES}")
    bags = lookup.bag_offsets.size
    occurrences = lookup.index.size
    sizes = np.diff(lookup.bag_offsets, append=occurrences)
    if sizes.max(initial=0) <= 1:
        if occurrences == bags:  # one id in every bag
            return rows.index_select(0, torch.from_numpy(lookup.index).to(rows.device))
        # at most one id per bag (a missing feature leaves its bag empty): still a gather,
        # the empty bags read a row of zeros appended after the pulled rows
        at = np.full(bags, rows.shape[0], np.int64)
        at[sizes == 1] = lookup.index
        padded = torch.cat([rows, rows.new_zeros((1, rows.shape[1]))])
        return padded.index_select(0, torch.from_numpy(at).to(rows.device))
    index = torch.from_numpy(lookup.index).to(rows.device)
    bag_of = torch.from_numpy(np.repeat(np.arange(bags, dtype=np.int64), sizes))
    pooled = rows.new_zeros((bags, rows.shape[1])).index_add(
        0, bag_of.to(rows.device), rows.index_select(0, index)
    )
    if mode == "mean":
        divisor = torch.from_numpy(np.maximum(sizes, 1).astype(np.float32)).to(rows.device)
        pooled = pooled / divisor.unsqueeze(1)
    return pooled


def slot_outputs(pooled: torch.Tensor, num_slots: int, accessor, *, cvm: bool,
                 slots: tuple[str, ...]) -> torch.Tensor:  # fmt: skip
    """``[B, S, width]`` of a table's pooled rows ``[S * B, pull_dim]`` (slot-major), as
    a :class:`~sparseps.nn.SparseEmbedding` gives them to the model (its trainer's and a
    predictor's one rule).

    A table whose ``accessor.cvm`` is set pulls ``[show, click, embedding]``: with ``cvm``
    the output is Paddle's cvm op on the pooled counts, ``log(show + 1)`` and
    ``log(click + 1) - log(show + 1)`` (inputs: no gradient flows to them), then the
    embedding; without it the embedding alone. Slots listed in ``accessor.slot_dims``
    (Paddle's CtrDymfAccessor mf_dim) read their embedx columns past that width as zero
    (so they train as zero too).
    """
    if accessor.cvm:
        if cvm:
            counts = pooled[:, :2].detach().clamp_min(0.0)
            log_show = torch.log1p(counts[:, :1])
            features = torch.log1p(counts[:, 1:]) - log_show
            pooled = torch.cat([log_show, features, pooled[:, 2:]], 1)
        else:
            pooled = pooled[:, 2:]
    width = pooled.shape[1]
    out = pooled.view(num_slots, -1, width).transpose(0, 1)
    widths = dict(accessor.slot_dims)
    if widths:
        mask = torch.ones((num_slots, width), dtype=out.dtype, device=out.device)
        first = 2 * bool(cvm and accessor.cvm) + accessor.embed_dim
        for s, name in enumerate(slots):  # one entry per slot, not per id
            if name in widths:
                mask[s, first + widths[name] :] = 0.0
        out = out * mask
    return out
