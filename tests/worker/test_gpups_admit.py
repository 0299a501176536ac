"""The device's admission draw equals the server's (probability admission in GPUPS).

``gpups_admit.draw_words`` computes splitmix64 in int64 torch arithmetic; the server's
compiled ``lifecycle.admit`` in uint64. Same keys, attempts and seeds: the same decisions,
including keys and attempts whose words overflow int64 (the wrapping multiplications).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparseps.config import Lifecycle
from sparseps.table.lifecycle import admit
from sparseps.worker.gpups_admit import draw_base, draw_words


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_device_draws_decide_as_the_server(seed):
    rng = np.random.default_rng(seed)
    keys = np.concatenate([rng.integers(0, 2**63, 4000, dtype=np.uint64) * np.uint64(2) + np.uint64(1),
                           np.array([0, 1, 2**64 - 1], np.uint64)])  # fmt: skip
    shows_before = rng.integers(0, 50, keys.size).astype(np.float32)
    for probability in (0.05, 0.5, 0.97):
        policy = Lifecycle(admission="probability", admit_probability=probability)
        pending = np.zeros((keys.size, 3), np.float32)
        pending[:, 0] = shows_before
        pids = np.arange(keys.size, dtype=np.int64)
        ones = np.ones(keys.size, np.float32)
        server, _, _ = admit(pending, pids, np.zeros(keys.size, bool), keys, ones,
                             np.zeros(keys.size, np.float32), policy, seed)  # fmt: skip
        base = torch.from_numpy(draw_base(keys, seed))
        attempt = torch.from_numpy(shows_before.astype(np.int64))
        device = (draw_words(base, attempt) < probability).numpy()
        np.testing.assert_array_equal(device, server)
        assert 0 < server.sum() < keys.size  # both outcomes were drawn
