"""What a GPUPS worker keeps and exchanges on its device besides the pass's rows: the dense
model's optimizer row, and the collectives over device tensors.

- :class:`DeviceDense`: the dense parameters' optimizer row (values and state, the layout
  of :class:`~sparseps.table.DenseTable`) on the device. A step sums the workers'
  gradients (:class:`DeviceExchange`), runs the dense rule's device kernel
  (:func:`sparseps.optim.device_rules.step_rows`: the server's own kernel on a CPU
  device) on the row the model's parameters are views of. The host sees the row only
  when a checkpoint saves or loads it.
- :class:`DeviceExchange`: all-to-all and all-reduce of device tensors between the job's
  workers: an NCCL group on CUDA when every worker has a GPU of its own (made once, when
  the mode is built: every worker makes it), the job's own group (gloo) on CPU, and
  through host copies on gloo when workers share a GPU (NCCL refuses two ranks on one). The counts of an all-to-all are host integers
  (they come with the batch's keys, which are inputs); the rows and gradients stay on
  the device. With one worker every call returns its input.
- :func:`resolve_device`: the torch device of ``Strategy.device`` for a worker.
- :func:`to_device`: a host array onto the device (pinned memory and a non-blocking copy
  on CUDA; on CPU the array itself).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..core import collectives
from ..core.deadline import wait_collective
from ..errors import ConfigError
from ..optim.device_rules import step_rows

__all__ = ["DeviceDense", "DeviceExchange", "resolve_device", "to_device"]

_SETTING = "Strategy.collective_timeout"


def resolve_device(
    device: str, rank: int = 0, *, setting: str = "Strategy.device", role: str = "worker"
) -> torch.device:
    """The torch device of ``Strategy.device`` for worker ``rank`` (GPUs shared round-robin);
    ``setting`` and ``role`` name the knob and the process in the error (heter workers:
    ``--heter-device``, ``heter_worker``).

    Raises:
        ConfigError: ``device="cuda"`` and no CUDA device is visible.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{setting}='cuda': no CUDA device is visible to {role} {rank} "
            "(torch.cuda.is_available() is False: no GPU, no driver, a CPU-only torch, or "
            "CUDA_VISIBLE_DEVICES hides them); use device='cpu', or 'auto' to take a GPU "
            "only when there is one"
        )
    return torch.device("cuda", rank % torch.cuda.device_count())


def to_device(array: np.ndarray, device: torch.device, dtype=None) -> torch.Tensor:
    """``array`` as a tensor on ``device``: a view on CPU; on CUDA a copy through pinned
    memory that does not block the host (the stream orders it before its use)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array, dtype))
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


class DeviceExchange:
    """Collectives over device tensors (see the module docstring).

    Args:
        device: the worker's device.
        timeout: seconds a collective may wait (``Strategy.collective_timeout``).
    """

    def __init__(self, device: torch.device, timeout: float) -> None:
        self.world = collectives.world_size()
        self.device, self.timeout = device, timeout
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.group = None  # None: the default group (gloo on CPU tensors)
        self.backend = "local" if self.world == 1 else "gloo"
        # NCCL needs a GPU per worker; workers sharing a GPU exchange through the host
        own_gpu = device.type == "cuda" and torch.cuda.device_count() >= self.world
        if self.world > 1 and own_gpu:
            torch.cuda.set_device(device)
            self.group = dist.new_group(backend="nccl")  # every worker builds its mode
            self.backend = "nccl"
        self._staged = device.type == "cuda" and self.group is None

    def _wait(self, op: str, work) -> None:
        wait_collective(
            work, op=f"worker gpups {op}", timeout=self.timeout, rank=self.rank,
            setting=_SETTING, hint=f"see the other workers' logs, or raise {_SETTING}",
        )  # fmt: skip

    def all_to_all(self, rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        """Rows ``[sum(send[:j]), ...)`` of ``rows`` to worker j; returns what came, in
        rank order (``recv[j]`` rows from worker j)."""
        if self.world == 1:
            return rows
        source = rows.cpu() if self._staged else rows.contiguous()
        out = source.new_empty((sum(recv), *rows.shape[1:]))
        work = dist.all_to_all_single(out, source, recv, send, group=self.group, async_op=True)
        self._wait("all_to_all", work)
        return out.to(self.device) if self._staged else out

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over workers (in place)."""
        if self.world > 1:
            target = tensor.cpu() if self._staged else tensor
            work = dist.all_reduce(target, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            self._wait("all_reduce", work)
            if self._staged:
                tensor.copy_(target)
        return tensor


class DeviceDense:
    """The dense parameters' values and optimizer state on the device (module docstring).

    Args:
        params: the model's trainable parameters (``DenseParams.params`` order), on
            ``device``.
        rule: the dense rule (SGD, Adagrad, Adam).
        arrays: ``{"values": float32 [size], "state": float32 [state_dim]}``
            (``DenseTable.export``).
        device: where they live.
    """

    def __init__(self, params: list[nn.Parameter], rule, arrays: dict, device) -> None:
        self.params, self.rule, self.device = params, rule, device
        self.size = int(sum(p.numel() for p in params))
        self._row0 = torch.zeros(1, dtype=torch.int64, device=device)
        self.import_(arrays)

    def import_(self, arrays: dict) -> None:
        """Take ``DenseTable.export``'s arrays; the parameters get the values."""
        row = np.concatenate([arrays["values"], arrays["state"]], dtype=np.float32)
        self.row = to_device(row.reshape(1, -1), self.device).clone()  # DenseTable's layout
        self.values, self.state = self.row[:, : self.size], self.row[:, self.size :]
        self._to_params()

    def export(self) -> dict[str, np.ndarray]:
        """``DenseTable.export``'s arrays, on the host (a checkpoint's dense file)."""
        return {
            "values": self.values[0].cpu().numpy().copy(),
            "state": self.state[0].cpu().numpy().copy(),
        }

    def grads(self) -> torch.Tensor:
        """The flat float32 gradient of the last backward, on the device."""
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params
        ]
        return torch.cat(parts).to(torch.float32)

    def step(self, grad: torch.Tensor) -> None:
        """One step of the dense rule with the summed gradient ``grad`` ``[size]``."""
        step_rows(self.rule, self.row, self._row0, grad.reshape(1, -1), self.size)
        self._to_params()

    def _to_params(self) -> None:
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(self.values[0], self.params)
