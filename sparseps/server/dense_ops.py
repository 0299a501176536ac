"""``DenseOps``: the dense-table ops (a model's non-embedding weights, one float32 vector
per table): create, pull, push (with the values after the step when asked: one round
trip for an async worker's step), geo's delta and set. The vector and
its optimizer state are a :class:`~sparseps.table.dense.DenseTable`; saving and loading
them are file ops (:mod:`sparseps.server.file_ops`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError, InputError
from .entries import TableEntry, config_differences

if TYPE_CHECKING:
    from ..rpc.protocol import Request
    from ..table.dense import DenseTable
    from .entries import Answer, Tables

__all__ = ["DenseOps"]


class DenseOps:
    """The dense-table ops of one server (one shard copy).

    Args:
        tables: the dense tables placed on this server.
    """

    def __init__(self, tables: Tables[DenseTable]) -> None:
        self.tables = tables
        self.rank = tables.rank

    def read_back(self, request: Request) -> list[np.ndarray]:
        """What a repeated update still reads: it is not applied again, but a
        ``push_dense`` that asked for the values after its step gets the current ones."""
        if request.op == "push_dense" and request.args.get("pull"):
            return self.pull_dense(request)[1]
        return []

    def create_dense(self, request: Request) -> Answer:
        from ..optim import rule_from_dict
        from ..table import DenseTable

        name, size = str(request.table), request.args["size"]
        # Bounded so that pull_dense/push_dense fit in one message, which also bounds the
        # table with its optimizer state to about 3 * max_message_bytes of memory.
        largest = request.limits.max_dense_size
        if not 1 <= size <= largest:
            raise ConfigError(
                f"server {self.rank}: create_dense {request.table!r}: size must be 1..{largest} "
                f"floats, got {size}; a dense table travels whole in one message of at most "
                f"Limits.max_message_bytes={request.limits.max_message_bytes} bytes (raise the "
                "servers' --max-message-bytes and the client's Limits, or split the table)"
            )
        rule = rule_from_dict(request.args["rule"])
        spec = {"size": size, "rule": rule.to_dict()}
        init = request.bufs.get("values")
        if init is not None and init.shape != (size,):
            raise InputError(
                f"create_dense {request.table!r}: init has shape {init.shape}, expected ({size},)"
            )
        with self.tables.creating:
            entry = self.tables.get(name)
            if entry is not None:
                if entry.spec == spec:
                    return {"created": False}, []
                diff = config_differences(entry.spec, spec)
                raise ConfigError(
                    f"server {self.rank}: dense table {request.table!r} already exists with a different spec: "
                    + "; ".join(diff)
                )
            table = DenseTable(name, size, rule=rule, init=None if init is None else np.array(init))
            self.tables.add(name, TableEntry(table, spec=spec))
        return {"created": True}, []

    def _dense_values(
        self, request: Request
    ) -> tuple[TableEntry[DenseTable], DenseTable, np.ndarray]:
        entry = self.tables.entry(request)
        values = request.bufs["values"]
        if values.shape != (entry.spec["size"],):
            raise InputError(
                f"{request.op} {request.table!r}: got {values.shape[0]} values, the table has {entry.spec['size']}"
            )
        return entry, entry.table, values

    def pull_dense(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        with entry.lock.read():
            values = entry.table.pull()
        return None, [values]

    def push_dense(self, request: Request) -> Answer:
        entry, table, values = self._dense_values(request)
        with entry.lock.write():
            table.push(values)
            fresh = [table.pull()] if request.args.get("pull") else []
        return None, fresh

    def push_dense_delta(self, request: Request) -> Answer:
        entry, table, values = self._dense_values(request)
        with entry.lock.write():
            table.add(values)
        return None, []

    def set_dense(self, request: Request) -> Answer:
        entry, table, values = self._dense_values(request)
        with entry.lock.write():
            table.set(values)
        return None, []
