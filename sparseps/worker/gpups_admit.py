"""Feature admission of a GPUPS pass's keys on the device, decided as the server decides it.

A table with ``Lifecycle(admission="count" | "score")`` creates a row for a key only once
its show/click counters pass the threshold (:mod:`sparseps.table.lifecycle`); until then
the key is *pending*: a pull reads zeros, its gradients are dropped, only its counters
grow. On the push that admits it, the row is made with its initial value and that push's
gradient is applied. GPUPS trains a pass on the device, so the device makes the same
decision step by step:

- at the build, each owned key's state comes from its server (``PSClient.pull_counts``:
  whether it is a row, a pending key's counters), and a pending key's row is zeros
  (what a pull reads), its initial value kept aside (``fill_initial``, the server's);
- each step, after the step's counts are added, a pending key whose counters before the
  pass plus the pass's so far reach the threshold is admitted: its row becomes the
  initial value and the rule steps it with the gradient of this step; the gradients of
  keys still pending are dropped;
- the write-back writes the rows of admitted keys (``write_rows``: a new row starts from
  its pending counters, plus the pass's) and pushes the counts of keys still pending
  with zero gradients: the server adds them to the pending counters, and admits none,
  since their total is the one the device found under the threshold (count and score
  only grow with counts).

``"probability"`` draws per push: a hash of the table seed, the key and ``attempt =
floor(show before the push)`` (:mod:`sparseps.table.lifecycle`), no generator state. The
device draws the same word for each pending key of a step (the key's hash part at the
build, :func:`draw_base`; the attempt's part per step, :func:`draw_words`, in int64
arithmetic that wraps as the server's uint64 does). The write-back's push of a key still
pending draws with the attempt of the key's first step of that (sub-)pass, a draw the
device already found failing, so the server admits none. Split tables (the CTR accessor)
under admission are refused.
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import Admission, TableConfig
from ..core.hashing import GOLDEN, MIX_C1, MIX_C2, mix64_array
from ..errors import ConfigError
from ..table.initializers import fill_initial
from ..table.lifecycle import seed_word
from .gpups_device import to_device

__all__ = ["DeviceAdmission", "check_admission", "draw_base", "draw_words"]


def _signed(word: np.uint64) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return int(np.array(word, np.uint64).view(np.int64))


_C1, _C2, _GOLDEN = _signed(MIX_C1), _signed(MIX_C2), _signed(GOLDEN)


def draw_base(keys: np.ndarray, seed: int) -> np.ndarray:
    """The key's part of the server's admission draw, ``mix64(key ^ mix64(seed_word))``,
    as int64 (the bits of the uint64)."""
    salt = mix64_array(np.array([seed_word(seed)], np.uint64))[0]
    return mix64_array(keys, int(salt)).view(np.int64)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical shift of int64 bits (torch's ``>>`` on int64 is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 tensors: multiplications wrap modulo 2**64 as the
    server's uint64 ones do (tests/worker/test_gpups_admit.py: bit-equal on CPU)."""
    x = (x ^ _shift_right(x, 30)) * _C1
    x = (x ^ _shift_right(x, 27)) * _C2
    return x ^ _shift_right(x, 31)


def draw_words(base: torch.Tensor, attempt: torch.Tensor) -> torch.Tensor:
    """The server's draws in [0, 1) (float64) for keys of hash part ``base`` at
    ``attempt`` (int64 ``floor(show before the push)``)."""
    word = _mix64(base + attempt * _GOLDEN)
    return _shift_right(word, 11).double() * (1.0 / 9007199254740992.0)


def check_admission(config: TableConfig) -> None:
    """Raise ``ConfigError`` for an admission GPUPS cannot decide on the device."""
    admission = config.lifecycle.admission
    if admission != Admission.ALWAYS and config.accessor.split:
        raise ConfigError(
            f"table {config.name!r}: Strategy(mode='gpups') trains a split table (the CTR "
            f"accessor) only with admission='always', got {admission.value!r}; use "
            "mode='sync' or 'async' for this table"
        )


class DeviceAdmission:
    """The admission state of one device table's keys (see the module docstring).

    Args:
        config: the table's config.
        keys: uint64 ``[n]`` the table's keys, in the device table's order.
        counts: float32 ``[n, 3]`` (``pull_counts``: is a row, pending show, click).
        device: the device table's device.
    """

    def __init__(self, config: TableConfig, keys: np.ndarray, counts: np.ndarray,
                 device: torch.device) -> None:  # fmt: skip
        self.lifecycle = config.lifecycle
        pending = np.flatnonzero(counts[:, 0] == 0)
        initial = np.zeros((keys.size, config.dim), np.float32)
        fill_initial(initial, pending, keys[pending], config.dim, config.initializer, config.seed)
        # the arrays are this build's own (``counts`` a fresh copy in the table's order):
        # on CPU the tensors are their memory, on CUDA ``to_device`` copies; no clones
        self.initial = to_device(initial, device)
        self.admitted = to_device(counts[:, 0] > 0, device)
        self.prior_show = to_device(counts[:, 1], device, np.float32)
        self.prior_click = to_device(counts[:, 2], device, np.float32)
        self.base = None  # probability: each key's part of the draw
        if self.lifecycle.admission == Admission.PROBABILITY:
            self.base = to_device(draw_base(keys, config.seed), device)

    def admit(self, rows: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor,
              weights: torch.Tensor, before: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Admit the pending ``rows`` (unique) whose counters now pass; their rows become
        the initial value. Returns the mask of ``rows`` the rule steps (rows now).

        Args:
            rows: int64 ``[u]`` rows of this step; shows, clicks: the table's pass
                counters ``[n]`` with this step's already added; weights: the table's;
                before: the pass's shows of ``rows`` before this step (probability: the
                draw's attempt).
        """
        waiting = ~self.admitted[rows]
        if bool(waiting.any()):
            new = rows[waiting]
            show = self.prior_show[new] + shows[new]
            click = self.prior_click[new] + clicks[new]
            policy = self.lifecycle
            if policy.admission == Admission.COUNT:
                ok = show >= float(policy.admit_count)
            elif policy.admission == Admission.PROBABILITY:
                assert self.base is not None
                attempt = torch.floor(self.prior_show[new] + before[waiting]).long()
                ok = draw_words(self.base[new], attempt) < policy.admit_probability
            else:  # score, in float64 from the float32 counters, as the server computes
                show64, click64 = show.double(), click.double()
                value = (show64 - click64) * policy.nonclick_coeff + click64 * policy.click_coeff
                ok = value >= policy.admit_score
            now = new[ok]
            weights[now] = self.initial[now]
            self.admitted[now] = True
        return self.admitted[rows]
