"""The per-batch dedup that decides what is pulled and pushed (worked example pinned), and
the pooling of the pulled rows per (sample, slot), against `F.embedding_bag`."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sparseps.core.lookup import build_lookup
from sparseps.core.pooling import pool_bags
from sparseps.errors import InputError


def _slot(values, offsets):
    return SimpleNamespace(values=np.array(values, np.uint64), offsets=np.array(offsets, np.int64))


class _Batch(SimpleNamespace):
    def __len__(self):
        return len(self.label)


def _example():
    return _Batch(
        label=np.array([1, 0], np.float32),
        slots={"a": _slot([5, 7, 5], [0, 2, 3]), "b": _slot([7], [0, 0, 1])},
    )


def test_worked_example_from_the_docstring():
    lk = build_lookup(_example(), ["a", "b"])
    np.testing.assert_array_equal(lk.keys, np.array([5, 7], np.uint64))
    np.testing.assert_array_equal(lk.index, [0, 1, 0, 1])
    np.testing.assert_array_equal(lk.bag_offsets, [0, 2, 3, 3])
    np.testing.assert_array_equal(lk.shows, [2, 2])
    np.testing.assert_array_equal(lk.clicks, [1, 1])


def test_pooling_matches_a_hand_sum():
    lk = build_lookup(_example(), ["a", "b"])
    rows = torch.tensor([[1.0, 2.0], [10.0, 20.0]])
    pooled = pool_bags(rows, lk, "sum").view(2, 2, 2).transpose(0, 1)
    # sample 0: a -> 5 + 7, b -> nothing; sample 1: a -> 5, b -> 7
    expected = torch.tensor([[[11.0, 22.0], [0.0, 0.0]], [[1.0, 2.0], [10.0, 20.0]]])
    assert torch.equal(pooled, expected)
    mean = pool_bags(rows, lk, "mean").view(2, 2, 2).transpose(0, 1)
    assert torch.equal(mean, torch.tensor([[[5.5, 11.0], [0.0, 0.0]], [[1.0, 2.0], [10.0, 20.0]]]))


def _random_lookup(rng, bag_sizes, size=64, slots=5):
    """A lookup over ``slots`` slots whose bags hold ``bag_sizes[0]..bag_sizes[1]`` ids."""
    names = [f"s{i}" for i in range(slots)]
    batch_slots = {}
    for name in names:
        sizes = rng.integers(bag_sizes[0], bag_sizes[1] + 1, size)
        values = rng.integers(0, 40, int(sizes.sum())).astype(np.uint64)
        batch_slots[name] = _slot(values, np.concatenate([[0], np.cumsum(sizes)]))
    label = (rng.random(size) < 0.3).astype(np.float32)
    return build_lookup(_Batch(label=label, slots=batch_slots), names)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize(
    "sizes", [(1, 1), (0, 1), (0, 3)], ids=["one_id_per_bag", "one_or_none", "jagged"]
)
def test_pooling_and_its_gradient_match_embedding_bag(mode, sizes):
    rng = np.random.default_rng(sizes[1])
    lk = _random_lookup(rng, sizes)
    weights = torch.randn(lk.keys.size, 3, dtype=torch.float32)
    upstream = torch.randn(lk.bag_offsets.size, 3)
    ours = weights.clone().requires_grad_(True)
    theirs = weights.clone().requires_grad_(True)
    pooled = pool_bags(ours, lk, mode)
    reference = torch.nn.functional.embedding_bag(
        torch.from_numpy(lk.index), theirs, torch.from_numpy(lk.bag_offsets), mode=mode
    )
    torch.testing.assert_close(pooled, reference, rtol=1e-6, atol=1e-6)
    (pooled * upstream).sum().backward()
    (reference * upstream).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-5)


def test_as_many_ids_as_bags_is_not_taken_for_one_id_per_bag():
    # 3 ids in 3 bags laid out 0, 2, 1: the gather shortcut would give bag 0 one id
    batch = _Batch(label=np.zeros(3, np.float32), slots={"a": _slot([1, 2, 3], [0, 0, 2, 3])})
    lk = build_lookup(batch, ["a"])
    rows = torch.tensor([[1.0], [10.0], [100.0]])
    assert torch.equal(pool_bags(rows, lk, "sum"), torch.tensor([[0.0], [11.0], [100.0]]))


def test_unknown_pooling_mode_is_refused():
    with pytest.raises(ValueError, match="pooling mode 'max'"):
        pool_bags(torch.zeros(2, 2), build_lookup(_example(), ["a", "b"]), "max")


def test_extreme_keys_survive_dedup():
    big = 2**64 - 1
    batch = _Batch(label=np.array([0.0], np.float32), slots={"a": _slot([big, 0, big], [0, 3])})
    lk = build_lookup(batch, ["a"])
    np.testing.assert_array_equal(lk.keys, np.array([0, big], np.uint64))
    np.testing.assert_array_equal(lk.shows, [1, 2])


def test_missing_slot_is_a_clear_error():
    with pytest.raises(InputError, match="slot 'zz' is not in the batch"):
        build_lookup(_example(), ["zz"])


def test_select_gives_a_module_its_slots_over_the_same_keys():
    lk = build_lookup(_example(), ["a", "b"])
    np.testing.assert_array_equal(lk.slot_bounds, [0, 3, 4])
    b = lk.select(["b"])  # the docstring's example
    assert b.keys is lk.keys and b.shows is lk.shows
    np.testing.assert_array_equal(b.index, [1])
    np.testing.assert_array_equal(b.bag_offsets, [0, 0])
    np.testing.assert_array_equal(b.slot_bounds, [0, 1])
    # reordered: equal to a lookup built over those slots, re-indexed to the union's keys
    ba = lk.select(["b", "a"])
    own = build_lookup(_example(), ["b", "a"])
    np.testing.assert_array_equal(ba.keys[ba.index], own.keys[own.index])
    np.testing.assert_array_equal(ba.bag_offsets, own.bag_offsets)
    assert lk.select(["a", "b"]) is lk
    with pytest.raises(InputError, match=r"slots \['zz'\] are not in this lookup"):
        lk.select(["zz"])
