"""One table's shard of a GPUPS pass, resident on a device.

:class:`DeviceTable` holds the rows a worker owns for one pass (the keys of the pass
whose owner, ``server_of(key, W)``, is this worker): a sorted key array and the rows'
embedding, optimizer state and show/click counts, all torch tensors on the device. The
rows arrive whole from the servers (``PSClient.pull_full``: embedding and state) or, for
keys of the previous pass, from that pass's result (:mod:`.gpups_build`). A lookup
is one ``torch.searchsorted``; an update merges the gradients of repeated keys
(``index_add_``) and runs the table's rule as torch kernels
(:mod:`sparseps.optim.device_rules`). At the end of the pass :meth:`DeviceTable.result`
gives what goes back to the servers (``PSClient.write_rows``): each row's final
embedding and state, and its counts.

Worked example (dim 2, keys owned by this worker ``[9, 4]``)::

    keys  -> sorted [4, 9]      weights [[.1, .2], [.3, .4]]   shows [0, 0]
    find([9, 9, 4]) -> [1, 1, 0]
    apply([1, 1, 0], grads [[1, 0], [1, 0], [0, 1]], shows [1, 1, 1], clicks [0, 1, 0])
        merged gradient of row 1: [2, 0]; shows [1, 2], clicks [0, 1]

Bytes per key on the device: :func:`bytes_per_key` (key, embedding, optimizer state,
show and click).
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import Admission, TableConfig
from ..errors import InputError
from ..optim.device_rules import apply_table_rules, step_rows
from .gpups_admit import DeviceAdmission
from .gpups_device import to_device

__all__ = ["DeviceTable", "bytes_per_key"]


def bytes_per_key(config: TableConfig) -> int:
    """Device bytes of one row: int64 key, embedding, optimizer state, show, click; under
    admission also the initial embedding, the admitted flag and the counters before the
    pass (:mod:`.gpups_admit`)."""
    admission = 0 if config.lifecycle.admission == Admission.ALWAYS else 4 * config.dim + 9
    return 8 + 4 * (config.full_width + 2) + admission


class DeviceTable:
    """The rows of one table that this worker owns for a pass (see the module docstring).

    Args:
        config: the table's config (its ``rule`` runs on the device).
        keys: uint64 ``[n]`` unique keys.
        embedding: float32 ``[n, dim]`` of each row (as the servers hold it).
        state: float32 ``[n, state_dim]`` optimizer state of each row.
        device: the torch device the rows live on.
        counts: float32 ``[n, 3]`` from ``pull_counts`` for a table under admission
            (:mod:`.gpups_admit`); None: admission "always".
    """

    def __init__(
        self,
        config: TableConfig,
        keys: np.ndarray,
        embedding: np.ndarray,
        state: np.ndarray,
        device: torch.device,
        *,
        counts: np.ndarray | None = None,
    ) -> None:
        self.config = config
        self.device = device
        order = np.argsort(keys.view(np.int64), kind="stable")  # int64 order: torch sorts int64
        self.keys = keys[order]
        # no clones: these arrays are made here (a view of them on CPU, a copy on CUDA);
        # a clone of a pass's table cost its build 0.02-0.15 s on the loaded 2-core box
        self._sorted = to_device(self.keys.view(np.int64), device)
        # one [n, dim + state_dim] matrix, the server's row layout: on a CPU device the
        # server's compiled rule kernels step it in place (optim.device_rules.step_rows)
        whole = np.concatenate([embedding[order], state[order]], axis=1, dtype=np.float32)
        self.rows = to_device(whole, device)
        dim = embedding.shape[1]
        self.weights, self.state = self.rows[:, :dim], self.rows[:, dim:]
        self.shows = torch.zeros(self.keys.size, dtype=torch.float32, device=device)
        self.clicks = torch.zeros_like(self.shows)
        self.admission = (
            None if counts is None else DeviceAdmission(config, self.keys, counts[order], device)
        )

    def __len__(self) -> int:
        return int(self.keys.size)

    @property
    def nbytes(self) -> int:
        return len(self) * bytes_per_key(self.config)

    def find(self, keys: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Row index of each key (int64 tensor on the device); every key must be held.
        ``keys``: uint64 host keys, or their int64 bits already on the device.

        Raises:
            InputError: a key is not in this shard (the pass's working set was built
                from other data than the pass trains on).
        """
        if isinstance(keys, torch.Tensor):
            query = keys
        else:
            query = to_device(np.ascontiguousarray(keys).view(np.int64), self.device)
        if query.numel() == 0:
            return query
        if len(self) == 0:
            index = torch.zeros_like(query)
            missing = query.numel()
        else:
            index = torch.searchsorted(self._sorted, query).clamp_max_(len(self) - 1)
            missing = int((self._sorted[index] != query).sum())
        if missing:
            raise InputError(
                f"GPUPS table {self.config.name!r}: {missing} of {query.numel()} keys of a "
                f"batch are not in this worker's shard of the pass ({len(self)} keys); the "
                "pass trained on other data than its working set was built from (do not "
                "change an InMemoryDataset during a pass)"
            )
        return index

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """Current embeddings of rows ``index``: float32 ``[len(index), dim]``, on the device
        (a new tensor: the step's leaf, whose gradient :meth:`apply` takes)."""
        return self.weights.index_select(0, index)

    def apply(
        self, index: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> None:
        """One optimizer step: gradients of repeated rows summed, then the rule once per row.

        Args:
            index: int64 ``[n]`` rows (repeats allowed: one per worker that used the key).
            grads: float32 ``[n, dim]``; shows, clicks: float32 ``[n]``; on the device.
        """
        if index.numel() == 0:
            return
        unique, inverse = torch.unique(index, return_inverse=True)
        merged = grads.new_zeros((unique.numel(), grads.shape[1]))
        merged.index_add_(0, inverse, grads)
        before = None if self.admission is None else self.shows.index_select(0, unique)
        self.shows.index_add_(0, index, shows)
        self.clicks.index_add_(0, index, clicks)
        if self.admission is not None:  # pending keys: admitted now, or their grads dropped
            assert before is not None
            stepped = self.admission.admit(unique, self.shows, self.clicks, self.weights, before)
            unique, merged = unique[stepped], merged[stepped]
        if self.config.accessor.split:  # two rules over the row's two parts
            apply_table_rules(self.config, self.weights, self.state, unique, merged)
        else:
            step_rows(self.config.rule, self.rows, unique, merged, self.config.dim)

    @property
    def full_width(self) -> int:
        return int(self.weights.shape[1] + self.state.shape[1])

    def result(self) -> dict[str, np.ndarray]:
        """What goes back to the servers (``PSClient.write_rows``), on the host.

        Returns:
            ``{"key", "rows" (final embedding + optimizer state, float32
            ``[n, dim + state_dim]``), "show", "click", "admitted" (bool: a row to
            write; the others are keys still pending admission)}``.
        """
        return {
            "key": self.keys,
            "rows": self.rows.cpu().numpy(),  # on CPU a view: the table is done with
            "show": self.shows.cpu().numpy(),
            "click": self.clicks.cpu().numpy(),
            "admitted": (
                np.ones(len(self), bool)
                if self.admission is None
                else self.admission.admitted.cpu().numpy()
            ),
        }
