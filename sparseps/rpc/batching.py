"""Client-side push preparation, compiled: merge the rows of repeated keys.

Keys are deduplicated and grouped by server by :func:`sparseps.core.routing.group_by_server`
(unique keys grouped by owning server, ``keys[offsets[s]:offsets[s+1]]`` belong to server
``s``, and ``inverse[i]`` is the row of input key ``i`` in that grouped order).

Merging (push): a key's rows, shows and clicks are summed in input order, starting from
its first row, which is exactly what ``SparseTable.push`` does with duplicates, so a
batch pushed through the client and one pushed into a table give bit-identical rows.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit

__all__ = ["merge_by_group"]


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
