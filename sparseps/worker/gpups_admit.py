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

``"probability"`` draws per push (a hash of the key and the shows before it), so a pass's
counts pushed at once would draw differently: GPUPS refuses it. Split tables (the CTR
accessor) under admission are refused too.
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import Admission, TableConfig
from ..errors import ConfigError
from ..table.initializers import fill_initial
from .gpups_device import to_device

__all__ = ["DeviceAdmission", "check_admission"]


def check_admission(config: TableConfig) -> None:
    """Raise ``ConfigError`` for an admission GPUPS cannot decide on the device."""
    admission = config.lifecycle.admission
    if admission == Admission.PROBABILITY:
        raise ConfigError(
            f"table {config.name!r}: Strategy(mode='gpups') cannot use "
            "Lifecycle(admission='probability'): the server draws once per push, and a "
            "pass's counts reach it in one write-back; use admission='count' or 'score' "
            "(decided on the device exactly as the server would), or mode='sync'/'async'"
        )
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
        self.initial = to_device(initial, device).clone()
        self.admitted = to_device(counts[:, 0] > 0, device).clone()
        self.prior_show = to_device(counts[:, 1], device, np.float32).clone()
        self.prior_click = to_device(counts[:, 2], device, np.float32).clone()

    def admit(self, rows: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor,
              weights: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Admit the pending ``rows`` (unique) whose counters now pass; their rows become
        the initial value. Returns the mask of ``rows`` the rule steps (rows now).

        Args:
            rows: int64 ``[u]`` rows of this step; shows, clicks: the table's pass
                counters ``[n]`` with this step's already added; weights: the table's.
        """
        waiting = ~self.admitted[rows]
        if bool(waiting.any()):
            new = rows[waiting]
            show = self.prior_show[new] + shows[new]
            click = self.prior_click[new] + clicks[new]
            policy = self.lifecycle
            if policy.admission == Admission.COUNT:
                ok = show >= float(policy.admit_count)
            else:  # score, in float64 from the float32 counters, as the server computes
                show64, click64 = show.double(), click.double()
                value = (show64 - click64) * policy.nonclick_coeff + click64 * policy.click_coeff
                ok = value >= policy.admit_score
            now = new[ok]
            weights[now] = self.initial[now]
            self.admitted[now] = True
        return self.admitted[rows]
