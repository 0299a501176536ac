"""Request gathering: the ``heter_step`` requests of several trainers as one device batch.

A heter worker serves many trainers. Served one request at a time, its device runs one
trainer's batch while the other trainers' requests wait; gathered, it runs theirs together
at full batch size, which is how a heter worker keeps an expensive chip busy. A window of
requests closes when it holds :attr:`GatherWindow.rows` rows or :attr:`GatherWindow.wait_s`
passed since its first request, whichever comes first (requests already queued are taken
without waiting). A request is never cut across two device batches.

How one device batch gives every request what its own step would give
(:meth:`HeterService.run <sparseps.worker.heter_service.HeterService.run>`): the model runs
forward once on the stacked rows; the loss then runs per request on that request's rows of
the output (so each request's loss, predictions and labels are its own, and so is its loss
scale); one backward over the sum of the scaled losses gives each request's embedding
outputs exactly the gradients of its own step, and the dense parameters the sum of the
requests' dense gradients, sent to the servers as one update. The equality holds for models
whose rows do not see each other (MLPs, cross networks, attention within a row); a layer
with batch statistics (batch norm in training mode) sees the gathered batch instead.

Heter in sync mode (:mod:`.heter_sync`) gathers differently: a step's window closes once
every trainer contributing to it arrived (no rows or time bound), its rows stacked in
trainer order.

Requests are stacked only when their shapes agree past the batch dimension (a module whose
slot count varies, or a different label width, makes a group of its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.validate import check_float, check_int
from ..errors import ProtocolError
from ..rpc.protocol import Request

__all__ = [
    "DeviceBatch",
    "GatherWindow",
    "Step",
    "check_sync",
    "gather_window",
    "group_steps",
    "window_full",
]


@dataclass(frozen=True)
class GatherWindow:
    """How long a heter worker gathers requests into one device batch.

    Attributes:
        rows: close the window once it holds this many rows (0: gathering off, one
            request per device batch, the heter worker of earlier releases).
        wait_s: close it this many seconds after its first request.
    """

    rows: int = 4096
    wait_s: float = 0.002

    def __post_init__(self) -> None:
        check_int("GatherWindow", "rows", self.rows, ge=0)
        check_float("GatherWindow", "wait_s", self.wait_s, ge=0)

    @property
    def on(self) -> bool:
        return self.rows > 0


def gather_window(mode: object) -> GatherWindow:
    """The window of the trainers' mode (``Heter.gather_rows``, ``Heter.gather_ms``); a
    mode of one's own without them gathers with the defaults."""
    default = GatherWindow()
    rows = getattr(mode, "gather_rows", default.rows)
    wait_ms = getattr(mode, "gather_ms", default.wait_s * 1000)
    return GatherWindow(rows=rows, wait_s=wait_ms / 1000)


@dataclass(frozen=True)
class Step:
    """One validated ``heter_step`` request and where its reply goes."""

    envelope: list
    request: Request
    shapes: list[list[int]]
    sync: tuple[int, int, int] | None = None  # heter in sync mode: (step, trainers, trainer)

    @property
    def rows(self) -> int:
        return int(self.request.bufs["dense"].shape[0])

    @property
    def key(self) -> tuple:
        """Steps of equal keys stack: the shapes past the batch dimension."""
        dense, labels = self.request.bufs["dense"], self.request.bufs["labels"]
        return (dense.shape[1], labels.shape[1], tuple(tuple(s[1:]) for s in self.shapes))


def group_steps(steps: Sequence[Step]) -> list[list[Step]]:
    """``steps`` cut into stackable groups, in the order of each group's first step (the
    steps of a sync step in trainer order: the same sums whatever the arrival order)."""
    groups: dict[tuple, list[Step]] = {}
    for step in steps:
        groups.setdefault(step.key, []).append(step)
    return [
        sorted(group, key=_trainer) if group[0].sync is not None else group
        for group in groups.values()
    ]


def _trainer(step: Step) -> int:
    return step.sync[2] if step.sync is not None else 0


def window_full(steps: Sequence[Step], rows: int, window: GatherWindow) -> bool:
    """Whether a window of ``steps`` (``rows`` rows) closes: every trainer of a sync step
    arrived, or the rows bound is reached."""
    sync = steps[0].sync if steps else None
    if sync is not None:
        return len(steps) >= sync[1]
    return rows >= window.rows


def check_sync(value: object) -> tuple[int, int, int] | None:
    """A ``heter_step``'s ``sync`` argument, ``[step, trainers, trainer]`` (None: async)."""
    if value is None:
        return None
    found = list(value) if isinstance(value, list) else []
    ok = (
        len(found) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) for v in found)
        and found[0] >= 0
        and 1 <= found[1] <= 1 << 16
        and 0 <= found[2] < 1 << 16
    )
    if not ok:
        raise ProtocolError(
            f"heter_step: 'sync' must be [step >= 0, trainers >= 1, trainer >= 0], got {value!r:.80}"
        )
    return int(found[0]), int(found[1]), int(found[2])


class DeviceBatch:
    """Steps of one key stacked along the batch dimension.

    Attributes:
        steps: the stacked steps, in arrival order.
        bounds: row ``[start, stop)`` of each step in the stacked arrays.
        dense: float32 ``[R, D]``, a writable copy (the model may read it in place).
        labels: float32 ``[R, 1 + K]``.
        outputs: one float32 ``[R, S, dim]`` per ``SparseEmbedding``, in module order.
    """

    def __init__(self, steps: Sequence[Step], split) -> None:
        self.steps = list(steps)
        stops = np.cumsum([s.rows for s in self.steps])
        self.bounds = list(zip([0, *stops[:-1].tolist()], stops.tolist(), strict=True))
        # concatenate copies: the stacked arrays are writable (received frames are not)
        self.dense = np.concatenate([s.request.bufs["dense"] for s in self.steps])
        self.labels = np.concatenate([s.request.bufs["labels"] for s in self.steps])
        per_step = [split(s.request.bufs["outputs"], s.shapes) for s in self.steps]
        self.outputs = [np.concatenate(parts) for parts in zip(*per_step, strict=True)]

    @property
    def rows(self) -> int:
        return int(self.dense.shape[0])

    def __len__(self) -> int:
        return len(self.steps)
