"""One GPUPS training step on the device: rows to the model, gradients to the rule.

Built by :class:`~sparseps.worker.gpups.GpuPsMode` for each (sub-)pass over its device
tables (:class:`~.gpups_table.DeviceTable`, this worker's shard of each table). Per step
and per group of tables read through one dedup:

1. **rows** (:meth:`DeviceSteps.rows`): the batch's unique keys (host: they are the
   batch's input) are sent to their owners, worker ``server_of(key, W)`` (one host
   all-to-all of keys; none with one worker); each owner finds them in its table
   (``torch.searchsorted``) and sends the rows back, device to device (NCCL on CUDA,
   gloo on CPU; :class:`~.gpups_device.DeviceExchange`). The rows come out as fresh
   device tensors: the step's leaves, bound to the model.
2. **update** (:meth:`DeviceSteps.apply`): the leaves' gradients, with the batch's
   show/click counts, go back to the owners (one device all-to-all), which sum them per
   key and run the table's rule (:mod:`sparseps.optim.device_rules`); the dense
   gradient is summed over the workers on the device and the dense rule steps the
   model's parameters there (:class:`~.gpups_device.DeviceDense`).

Nothing of a row, a gradient or the dense model crosses to the host: what does is the
batch's input (keys, counts, the model's features) and what the metrics read (the
predictions and the loss).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..core import collectives
from ..core.routing import server_of
from ..errors import InputError
from .gpups_device import DeviceDense, DeviceExchange, to_device
from .gpups_table import DeviceTable

__all__ = ["DeviceSteps"]


class _Route:
    """One group's keys of one step: who owns each, and where they sit in the owner's table."""

    def __init__(self, order, send: list[int], recv: list[int], index: torch.Tensor) -> None:
        self.order, self.send, self.recv, self.index = order, send, recv, index


class DeviceSteps:
    """The steps of one (sub-)pass over this worker's device tables (module docstring).

    Args:
        shards: ``{table: DeviceTable}`` this worker owns for the pass.
        groups: the tables read through one dedup (every worker routes them alike).
        configs: ``{table: TableConfig}``.
        exchange: the device collectives.
        dense: the dense model's device optimizer row (None: no dense parameters).
        timeout: seconds a host collective may wait.
    """

    def __init__(self, shards: dict[str, DeviceTable], groups: list[list[str]], configs: dict,
                 exchange: DeviceExchange, dense: DeviceDense | None, *, timeout: float) -> None:  # fmt: skip
        self.shards, self.groups, self.configs = shards, groups, configs
        self.exchange, self.dense, self.timeout = exchange, dense, timeout
        # seconds of the steps in the exchanges (waiting for the other workers included)
        # and in the rules (sparse and dense); on CUDA the launches, not the kernels
        self.seconds = {"exchange_s": 0.0, "rule_s": 0.0}
        self.world = exchange.world
        self.device = exchange.device
        # this step's inputs on the device (gpups_inputs.step_inputs' names), staged
        # while the step before computed
        self.inputs: dict[str, torch.Tensor] = {}
        self._routes: dict[str, _Route] = {}
        self._announced: dict[str, tuple] = {}  # this step's routing, from announce()

    def announce(self, keys: dict[str, np.ndarray] | None, batch_size: int) -> tuple[bool, int]:
        """The step's header and routing in one collective: ``(any worker has data, the
        global batch size)``; each group's keys are grouped by owner now, and what every
        worker sends to this one is known (the keys' exchange then needs no counts).

        Args:
            keys: ``{table: unique keys}`` of this worker's batch (None: no data left).
            batch_size: its samples (0 without data).
        """
        self._announced = {}
        routing = []
        for group in self.groups:
            wanted = group_keys(keys or {}, group)
            order, counts = self._owners(wanted)
            self._announced[group[0]] = (wanted, order, counts)
            routing.append(counts)
        header = np.concatenate([[int(keys is not None), batch_size], *routing]).astype(np.int64)
        if self.world == 1:
            return bool(header[0]), int(header[1])
        start = time.perf_counter()
        every = np.stack(
            collectives.all_gather_arrays(
                header[None], sizes=np.ones(self.world, np.int64), timeout=self.timeout
            )
        )[:, 0]
        self.seconds["exchange_s"] += time.perf_counter() - start
        for g, group in enumerate(self.groups):  # what each worker sends here
            wanted, order, counts = self._announced[group[0]]
            recv = every[:, 2 + g * self.world + self.exchange.rank]
            self._announced[group[0]] = (wanted, order, counts, recv)
        return bool(every[:, 0].any()), int(every[:, 1].sum())

    def _owners(self, keys: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        if self.world == 1:
            return None, np.array([keys.size], np.int64)
        owner = server_of(keys, self.world) if keys.size else np.zeros(0, np.int64)
        order = np.argsort(owner, kind="stable")
        return order, np.bincount(owner, minlength=self.world).astype(np.int64)

    def rows(self, keys: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """``{table: float32 [U, dim] device tensor}`` of the step's keys (a collective)."""
        out: dict[str, torch.Tensor] = {}
        for group in self.groups:
            announced = self._announced.pop(group[0], None)
            if announced is None:  # not announced: route here (two collectives)
                wanted = group_keys(keys, group)
                order, counts = self._owners(wanted)
                known = None
            else:
                wanted, order, counts, *known_list = announced
                known = known_list[0] if known_list else None
            if order is None:
                received, recv_counts = wanted, counts
            else:
                start = time.perf_counter()
                received, recv_counts = collectives.all_to_all_rows(
                    wanted[order], counts, known, timeout=self.timeout
                )
                self.seconds["exchange_s"] += time.perf_counter() - start
            # one worker: the batch's own keys, staged on the device (gpups_inputs)
            staged = self.inputs.get(f"keys/{group[0]}") if order is None else None
            # a group's shards hold equal keys
            index = self.shards[group[0]].find(received if staged is None else staged)
            send, recv = counts.tolist(), recv_counts.tolist()
            parts = [self.shards[name].gather(index) for name in group]
            if order is not None:
                start = time.perf_counter()
                back = self.exchange.all_to_all(torch.cat(parts, dim=1), recv, send)
                self.seconds["exchange_s"] += time.perf_counter() - start
                ordered = torch.empty_like(back)
                ordered[to_device(order, back.device)] = back
                widths = [self.configs[name].dim for name in group]
                parts = [p.clone() for p in torch.split(ordered, widths, dim=1)]
            out.update(zip(group, parts, strict=True))
            self._routes[group[0]] = _Route(order, send, recv, index)
        return {name: out[name] for name in keys}

    def apply(self, grads: list, dense_grad) -> None:
        """Send the step's gradients to their owners, step the rules; step the dense rule.

        Args:
            grads: ``[(table, keys, grad, shows, clicks)]``: grad a device tensor (or a
                host array: a worker with no data left), shows/clicks host arrays.
            dense_grad: the flat dense gradient (a device tensor, or a host array).
        """
        device = self.device
        by_table = {g[0]: g[1:] for g in grads}
        if self.dense is not None and not isinstance(dense_grad, torch.Tensor):
            dense_grad = to_device(dense_grad, device, np.float32)
        dense_total = None if self.dense is None or self.world > 1 else dense_grad
        for g, group in enumerate(self.groups):
            route = self._routes.pop(group[0])  # rows() ran this step, data or not
            size = route.index.numel() if route.order is None else int(route.order.size)
            columns = []
            for name in group:
                grad = by_table[name][1] if name in by_table else None
                if grad is None or not isinstance(grad, torch.Tensor):
                    grad = torch.zeros((size, self.configs[name].dim), device=device)
                columns.append(grad)
            for kind in ("shows", "clicks"):  # staged on the device with the step's keys
                count = self.inputs.get(f"{kind}/{group[0]}")
                if count is None:  # no data left on this worker
                    count = torch.zeros(size, dtype=torch.float32, device=device)
                columns.append(count.reshape(-1, 1))
            packed = torch.cat(columns, dim=1)
            if route.order is not None:
                packed = packed[to_device(route.order, device)]
                rides = dense_grad if g == 0 and self.dense is not None else None
                start = time.perf_counter()
                packed, dense_total = self._exchange_grads(packed, route, rides)
                self.seconds["exchange_s"] += time.perf_counter() - start
            shows, clicks = packed[:, -2], packed[:, -1]
            start = time.perf_counter()
            at = 0
            for name in group:
                dim = self.configs[name].dim
                self.shards[name].apply(route.index, packed[:, at : at + dim], shows, clicks)
                at += dim
            self.seconds["rule_s"] += time.perf_counter() - start
        if self.dense is not None:
            assert dense_total is not None, "the first group's exchange carries it"
            start = time.perf_counter()
            self.dense.step(dense_total)
            self.seconds["rule_s"] += time.perf_counter() - start

    def _exchange_grads(self, packed: torch.Tensor, route: _Route, dense) -> tuple:
        """The rows ``packed`` (grouped by owner) to their owners, with ``dense`` (the
        dense gradient, or None) to every worker in the same all-to-all; returns
        ``(rows received, the dense gradients summed in rank order, or None)``: every
        worker sums the same vectors in the same order, so the copies stay identical."""
        if dense is None:
            return self.exchange.all_to_all(packed, route.send, route.recv), None
        width, size = packed.shape[1], dense.numel()
        parts = torch.split(packed, route.send)
        flat = torch.cat([t for part in parts for t in (part.reshape(-1), dense.reshape(-1))])
        send = [n * width + size for n in route.send]
        recv = [n * width + size for n in route.recv]
        got = torch.split(self.exchange.all_to_all(flat, send, recv), recv)
        rows = torch.cat(
            [part[: n * width].reshape(n, width) for part, n in zip(got, route.recv, strict=True)]
        )
        total = got[0][route.recv[0] * width :].clone()
        for part, n in zip(got[1:], route.recv[1:], strict=True):
            total += part[n * width :]
        return rows, total


def group_keys(keys: dict[str, np.ndarray], group: list[str]) -> np.ndarray:
    """The keys a group of tables shares this step (empty when this worker has no data)."""
    first = keys.get(group[0], np.empty(0, np.uint64))
    for name in group[1:]:
        other = keys.get(name, np.empty(0, np.uint64))
        if other is not first and not np.array_equal(other, first):
            raise InputError(
                f"GPUPS: tables {group[0]!r} and {name!r} were read through one dedup when "
                "the pass was built but got different keys in this step; every batch of a "
                "pass must carry the same slots"
            )
    return first
