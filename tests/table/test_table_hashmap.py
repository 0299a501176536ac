"""KeyIndex against a dict oracle: random insert / find / erase / grow sequences."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparseps.table import KeyIndex

EDGE = [0, 1, 2**64 - 1, 2**64 - 2, 2**63, 2**63 - 1]
keys_st = st.lists(
    st.one_of(st.sampled_from(EDGE), st.integers(0, 40), st.integers(0, 2**64 - 1)), max_size=40
)
ops_st = st.lists(st.tuples(st.sampled_from(["insert", "find", "erase"]), keys_st), max_size=25)


def _arr(keys):
    return np.array(keys, dtype=np.uint64)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # a fixed seed: the suite cannot fail by chance
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops_st)
def test_key_index_matches_dict(ops):
    index = KeyIndex(capacity=8)  # tiny: every sequence of any length forces rehashes
    oracle: dict[int, int] = {}
    freed: list[int] = []
    for op, keys in ops:
        arr = _arr(keys)
        if op == "insert":
            ids, is_new = index.find_or_insert(arr)
            seen = set()
            for key, i, new in zip(keys, ids.tolist(), is_new.tolist(), strict=True):
                if key in oracle:
                    assert i == oracle[key] and not new
                else:
                    assert new and key not in seen
                    oracle[key] = i
                seen.add(key)
        elif op == "erase":
            ids = index.erase(arr)
            for key, i in zip(keys, ids.tolist(), strict=True):
                if key in oracle:
                    assert i == oracle.pop(key)
                    freed.append(i)
                else:
                    assert i == -1
        ids = index.find(arr)
        assert ids.tolist() == [oracle.get(k, -1) for k in keys]
        assert len(index) == len(oracle)
        # ids stay dense and unique: live ids + free ids never exceed the high-water mark
        live = sorted(oracle.values())
        assert len(set(live)) == len(live)
        assert not live or live[-1] < index.high_water
        assert index.high_water <= len(oracle) + len(set(freed))
    got_keys, got_ids = index.items()
    assert dict(zip(got_keys.tolist(), got_ids.tolist(), strict=True)) == oracle


def test_growth_and_id_reuse_at_scale():
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 2**64 - 1, 200_000, dtype=np.uint64, endpoint=True))
    keys = np.concatenate([keys, _arr(EDGE)])
    keys = np.unique(keys)
    index = KeyIndex()
    ids, is_new = index.find_or_insert(keys)
    assert is_new.all() and sorted(ids.tolist()) == list(range(keys.size))
    assert index.capacity >= keys.size / 0.75
    np.testing.assert_array_equal(index.find(keys), ids)
    gone = keys[::2]
    np.testing.assert_array_equal(index.erase(gone), ids[::2])
    assert (index.find(gone) == -1).all()
    np.testing.assert_array_equal(index.find(keys[1::2]), ids[1::2])
    high_water = index.high_water
    fresh = np.arange(10**6, 10**6 + gone.size, dtype=np.uint64)
    new_ids, _ = index.find_or_insert(fresh)
    assert index.high_water == high_water  # every freed id was reused
    assert set(new_ids.tolist()) == set(ids[::2].tolist())


def test_erasing_most_keys_gives_slot_memory_back():
    keys = np.arange(1, 100_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    index = KeyIndex()
    ids, _ = index.find_or_insert(keys)
    full = index.capacity
    gone, kept = keys[:98_000], keys[98_000:]
    index.erase(gone)
    assert index.capacity <= full // 4  # rehashed into a smaller slot array
    assert len(index) == kept.size
    np.testing.assert_array_equal(index.find(kept), ids[98_000:])
    assert (index.find(gone) == -1).all()
    again, is_new = index.find_or_insert(gone[:1000])
    assert is_new.all() and set(again.tolist()) <= set(ids[:98_000].tolist())  # ids reused
