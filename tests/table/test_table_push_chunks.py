"""The push backs up, counts and steps existing rows in chunks (table/push.py,
``PushTransaction._apply_old``; issue 59): the rows must come out bit for bit as the
whole-batch passes made them (gather, ``touch_rows``, the rule's kernel), for every rule,
and a failure in a late chunk must restore the rows of the earlier ones."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.core.hashing import mix64_array
from sparseps.errors import InputError
from sparseps.table import SparseTable
from sparseps.table.batch import dedup_merge, touch_rows
from sparseps.table.push import CHUNK_ROWS

ROWS = 5 * CHUNK_ROWS + 77  # several chunks and a partial one


def _filled(rule) -> SparseTable:
    table = SparseTable(TableConfig(name="t", dim=8, rule=rule, seed=3))
    keys = mix64_array(np.arange(ROWS, dtype=np.uint64))
    rng = np.random.default_rng(0)
    table.push(keys, (rng.random((ROWS, 8), np.float32) - 0.5))
    return table


@pytest.mark.parametrize("name", sorted(optim.RULES))
def test_chunked_push_equals_the_whole_batch_passes(name) -> None:
    table = _filled(optim.RULES[name]())
    store = table._storage  # noqa: SLF001 - the rows themselves are what is compared
    rng = np.random.default_rng(1)
    picked = rng.integers(0, ROWS, 3 * ROWS, dtype=np.uint64)  # repeats: merged first
    keys = mix64_array(picked)
    grads = (rng.random((keys.size, 8), np.float32) - 0.5) * 3
    shows = rng.random(keys.size, np.float32) * 2
    clicks = shows * rng.random(keys.size, np.float32)
    # the reference: the passes over the whole batch the push made before the chunks
    expected = store.rows.copy()
    uniq, merged, merged_shows, merged_clicks = dedup_merge(keys, grads, shows, clicks)
    ids = store.index.find(uniq)
    assert (ids >= 0).all()
    policy = store.policy
    touch_rows(expected, ids, merged_shows, merged_clicks, store.stat0,
               policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
    store.rule.update(expected, ids, merged, store.dim)
    table.push(keys, grads, shows=shows, clicks=clicks)
    assert uniq.size > 2 * CHUNK_ROWS
    np.testing.assert_array_equal(store.rows.view(np.uint32), expected.view(np.uint32))


def test_a_failure_in_the_last_chunk_restores_every_chunk() -> None:
    table = _filled(optim.Adagrad())
    store = table._storage  # noqa: SLF001
    keys = mix64_array(np.arange(ROWS, dtype=np.uint64))
    big = np.full((1, 8), 3e38, np.float32)
    table.push_delta(keys[-1:], big)  # the batch's last key sits near float32's max
    before = store.rows.copy()
    deltas = np.full((ROWS, 8), 1e-3, np.float32)
    deltas[-1] = 3e38  # its sum overflows: the push is refused in its last chunk
    with pytest.raises(InputError, match="non-finite"):
        table.push_delta(keys, deltas)
    # every chunk's rows, counters included, are what they were
    np.testing.assert_array_equal(store.rows.view(np.uint32), before.view(np.uint32))


@dataclass(frozen=True)
class _RaisesOnSecondChunk(optim.Adagrad):
    """A user's rule whose kernel fails half-way through a push, once armed (its second
    call after arming: the second chunk's step)."""

    calls: list = field(default_factory=list, compare=False)

    def update(self, storage, rows, grads, dim):
        if self.calls:  # armed
            self.calls.append(rows.shape[0])
            if len(self.calls) == 3:
                raise RuntimeError("injected: the rule failed in the second chunk")
        return super().update(storage, rows, grads, dim)


def test_a_rule_failing_in_a_later_chunk_leaves_every_row_as_it_was() -> None:
    rule = _RaisesOnSecondChunk()
    table = _filled(rule)
    store = table._storage  # noqa: SLF001
    keys = mix64_array(np.arange(ROWS, dtype=np.uint64))
    before = store.rows.copy()
    rule.calls.append("armed")
    with pytest.raises(RuntimeError, match="second chunk"):
        table.push(keys, np.full((ROWS, 8), 0.5, np.float32))
    assert rule.calls[1:] == [CHUNK_ROWS, CHUNK_ROWS]
    # the first chunk is restored, the chunks after the failure were never touched
    np.testing.assert_array_equal(store.rows.view(np.uint32), before.view(np.uint32))
