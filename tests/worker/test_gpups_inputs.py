"""A GPUPS step's inputs staged for the device one step ahead (``gpups_inputs``).

CPU (CI): the staged tensors are the batch's arrays themselves (no copy), with the names
the step reads. CUDA (skipped without a GPU): the copies land on the device, equal, once
``take`` has made the compute stream wait for the side stream. The GPUPS equality tests
(test_gpups_local.py, test_gpups_split.py, test_gpups_cluster.py) run every step through
the staged keys and counts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparseps.core.lookup import SlotLookup
from sparseps.worker.gpups_inputs import InputStager, step_inputs


def _item():
    keys = np.array([2**63 + 5, 7, 11], np.uint64)
    lookup = SlotLookup(
        slots=("a",), batch_size=2, keys=keys, index=np.array([0, 1, 2, 0], np.int64),
        bag_offsets=np.array([0, 2], np.int64), shows=np.array([2, 1, 1], np.float32),
        clicks=np.array([1, 0, 0], np.float32), slot_bounds=np.array([0, 4], np.int64),
    )  # fmt: skip
    return (None, {"t": lookup}, None), keys


def test_step_inputs_name_the_keys_bits_and_counts():
    item, keys = _item()
    arrays = step_inputs(item)
    assert sorted(arrays) == ["clicks/t", "keys/t", "shows/t"]
    np.testing.assert_array_equal(arrays["keys/t"].view(np.uint64), keys)
    assert step_inputs(None) == {}


def test_cpu_staging_shares_the_arrays():
    item, _ = _item()
    arrays = step_inputs(item)
    got = InputStager(torch.device("cpu")).stage(arrays).take()
    for name, array in arrays.items():
        assert np.shares_memory(got[name].numpy(), array), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_cuda_staging_copies_on_a_side_stream():
    item, _ = _item()
    arrays = step_inputs(item)
    got = InputStager(torch.device("cuda", 0)).stage(arrays).take()
    for name, array in arrays.items():
        assert got[name].device.type == "cuda"
        np.testing.assert_array_equal(got[name].cpu().numpy(), array)
