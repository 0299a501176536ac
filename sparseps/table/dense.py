"""``DenseTable``: a flat float32 vector (the dense model) updated by a rule on a server.

The vector and its optimizer state are stored as one row ``[values | state]`` so the
same compiled kernels as the sparse rows apply (SGD, Adagrad, Adam).

The step runs on a spare copy of the row, which replaces the row only when it is all
finite (two buffers, swapped; no allocation per push): an error anywhere before the swap
(including one injected through :class:`~sparseps.table.push.PushHooks`) leaves the table
unchanged. The rules are total over finite input (:mod:`sparseps.optim.numerics`), so a
finite gradient always makes a finite step; the finiteness check is the last line of
defence, and what geo mode's ``add`` meets when ``values + delta`` overflows float32
(rejected, InputError).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.validate import check_int
from ..errors import ConfigError, InputError
from ..optim import DENSE_RULES, Adam
from . import input_checks as checks

if TYPE_CHECKING:
    from ..optim.base import Rule
    from .push import PushHooks

__all__ = ["DenseTable"]

_ROW0 = np.zeros(1, np.int64)


class DenseTable:
    """A dense parameter vector with its optimizer state.

    Args:
        name: table name (for messages).
        size: number of float32 parameters (>= 1).
        rule: SGD, Adagrad or Adam (default ``Adam()``).
        init: float32-convertible ``[size]`` starting values; None = zeros.
        hooks: test hooks (:class:`~sparseps.table.push.PushHooks`); None in production.
    """

    def __init__(
        self,
        name: str,
        size: int,
        rule: Rule | None = None,
        init: np.ndarray | None = None,
        *,
        hooks: PushHooks | None = None,
    ) -> None:
        self.name = name
        self._hooks = hooks
        self.size = check_int(f"DenseTable({name!r})", "size", size, ge=1, le=2**31 - 1)
        self.rule = Adam() if rule is None else rule
        if not isinstance(self.rule, DENSE_RULES):
            accepted = [cls.__name__ for cls in DENSE_RULES]
            raise ConfigError(
                f"DenseTable({name!r}).rule: got {self.rule!r}, expected one of {accepted}"
            )
        self.state_dim = self.rule.state_dim(self.size)
        self._row = np.zeros((1, self.size + self.state_dim), np.float32)
        self._row[0, self.size :] = self.rule.initial_state(self.size)
        self._spare = np.empty_like(self._row)  # the next step is computed here
        if init is not None:
            values = np.asarray(init)
            if values.shape != (self.size,) or not np.issubdtype(values.dtype, np.number):
                raise InputError(
                    f"DenseTable({name!r}): init must be a numeric array of shape ({self.size},), "
                    f"found dtype {values.dtype}, shape {values.shape}"
                )
            self._check_finite("init", values.astype(np.float32))
            self._row[0, : self.size] = values

    def _vector(self, op: str, values) -> np.ndarray:
        vector = checks.check_contiguous_vector(
            f"{self.name}.{op}", "values", values, self.size, np.float32
        )
        self._check_finite(op, vector)
        return vector

    def _check_finite(self, op: str, values: np.ndarray) -> None:
        if not np.isfinite(values).all():
            bad = np.flatnonzero(~np.isfinite(values))
            raise InputError(
                f"{self.name}.{op}: {bad.size} NaN/inf value(s), first at index {int(bad[0])}; "
                "rejected, the table is unchanged"
            )

    def pull(self) -> np.ndarray:
        """A copy of the values, float32 ``[size]``."""
        return self._row[0, : self.size].copy()

    def push(self, grad: np.ndarray) -> None:
        """One optimizer step with the float32 ``[size]`` gradient.

        Raises:
            InputError: a bad gradient (wrong dtype/shape, NaN/inf; the table is
                unchanged). A finite gradient always gives a finite step.
        """
        grad = self._vector("push", grad)
        spare = self._spare
        np.copyto(spare, self._row)
        # The built-in kernels check every value they write in registers and say so
        # (True): then the pass over the whole row in _commit would find nothing.
        vouched = self.rule.update(spare, _ROW0, grad.reshape(1, self.size), self.size) is True
        if self._hooks is not None:
            self._hooks.mid_apply("push", self.name, 1, 1)
        self._commit("push", spare, checked=vouched)

    def add(self, delta: np.ndarray) -> None:
        """Geo mode: ``values += delta`` (rejected, unchanged, if a value would be NaN/inf)."""
        delta = self._vector("add", delta)
        spare = self._spare
        np.copyto(spare, self._row)
        with np.errstate(over="ignore"):  # checked just below
            spare[0, : self.size] += delta
        if self._hooks is not None:
            self._hooks.mid_apply("add", self.name, 1, 1)
        self._commit("add", spare)

    def _commit(self, op: str, spare: np.ndarray, *, checked: bool = False) -> None:
        """Make ``spare`` the values unless a value in it is not finite (``checked``: the
        kernel that wrote it vouched that none is)."""
        if not checked and not np.isfinite(spare[0]).all():
            where = np.flatnonzero(~np.isfinite(spare[0]))
            part = "value" if where[0] < self.size else "optimizer state"
            index = where[0] if where[0] < self.size else where[0] - self.size
            raise InputError(
                f"{self.name}.{op}: the step would make {where.size} value(s) non-finite (first: "
                f"{part} {int(index)}); rejected, the table is unchanged; lower the learning "
                "rate or the gradient"
            )
        self._row, self._spare = spare, self._row

    def set(self, values: np.ndarray) -> None:
        """Overwrite the values (the optimizer state is kept)."""
        self._row[0, : self.size] = self._vector("set", values)

    def export(self) -> dict[str, np.ndarray]:
        """``{"values": float32 [size], "state": float32 [state_dim]}`` (copies)."""
        return {"values": self.pull(), "state": self._row[0, self.size :].copy()}

    def import_(self, d: dict) -> None:
        """Restore from :meth:`export` output (bit-exact)."""
        if not isinstance(d, dict) or set(d) != {"values", "state"}:
            found = sorted(d) if isinstance(d, dict) else type(d).__name__
            raise InputError(
                f"{self.name}.import_: expected keys ['state', 'values'], found {found}"
            )
        values = self._vector("import_", d["values"])
        state = checks.check_contiguous_vector(
            f"{self.name}.import_", "state", d["state"], self.state_dim, np.float32
        )
        self._row[0, : self.size] = values
        self._row[0, self.size :] = state
