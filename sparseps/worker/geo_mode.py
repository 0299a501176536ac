"""Geo mode: workers train local copies for ``k_steps`` steps, then push deltas.

``Strategy(mode="geo")``; the interface is :class:`~sparseps.worker.modes.TrainingMode`.
"""

from __future__ import annotations

import numpy as np

from ..config import Lifecycle, TableConfig
from ..core import collectives
from ..core.keysets import unique_inverse
from ..table import DenseTable, SparseTable
from .modes import DENSE_TABLE, TrainingMode

__all__ = ["GeoMode"]


class GeoMode(TrainingMode):
    """Local training for ``k_steps`` steps, then parameter deltas go to the servers.

    Each worker keeps, per table, a local table of the rows it has used (trained with the
    table's own rule, whose state persists across windows) and a base copy of their values
    as last fetched. Every ``k_steps`` it pushes ``local - base`` for the keys touched in
    the window (servers add it, with the window's show/click counts), then refreshes those
    keys from the servers. Keys not touched in a window keep their last fetched value.

    The local copy holds every row the worker used, unless ``Strategy.geo_keep_windows``
    is set: then a row unused for that many windows is dropped from it (the local tables'
    own lifecycle does the bookkeeping: a decay per window ages rows not pushed in it, a
    shrink drops those older than the limit).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_dense_on_servers()
        self.workers = max(collectives.world_size(), 1)  # dense deltas are averaged over them
        self.local_dense = None
        if self.dense.size:
            self.base_dense = self.dense.values()
            self.local_dense = DenseTable(
                DENSE_TABLE, self.dense.size, rule=self.dense_rule, init=self.base_dense
            )
        self.local: dict[str, SparseTable] = {}
        self.base: dict[str, SparseTable] = {}
        self.touched: dict[str, list] = {}
        for config in self.tables:
            self._register(config)

    def _register(self, config: TableConfig) -> None:
        keep = self.config.keep_windows
        # admission happens on the servers; locally every used key is a row. decay_rate 1:
        # the local decay only ages rows (show/click are not used locally).
        lifecycle = (
            Lifecycle()
            if keep is None
            else Lifecycle(decay_rate=1.0, shrink_score=0.0, shrink_unseen_days=keep - 1)
        )
        local = TableConfig(
            name=config.name,
            dim=config.dim,
            rule=config.rule,
            initializer=config.initializer,
            lifecycle=lifecycle,
            seed=config.seed,
        )
        self.local[config.name] = SparseTable(local)
        self.base[config.name] = SparseTable(local)
        self.touched[config.name] = []

    def pull_rows(self, keys: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Training pulls read the worker's local copy (missing rows fetched first)."""
        return {t: self._pull_local(t, k) for t, k in keys.items()}

    def _pull_local(self, table: str, keys: np.ndarray) -> np.ndarray:
        local = self.local[table]
        missing = keys[~local.contains(keys)]
        if missing.size:
            fresh = self.client.pull(table, missing).wait()
            for target in (local, self.base[table]):
                target.import_rows(_rows_columns(target, missing, fresh))
        return local.pull(keys)

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        for table, keys, grad, shows, clicks in grads:
            self.local[table].push(keys, grad, shows=shows, clicks=clicks)
            self.touched[table].append((keys, shows, clicks))
        if self.local_dense is not None:
            self.local_dense.push(np.ascontiguousarray(dense_grad, np.float32))
            self.dense.set(self.local_dense.pull())
        self.step += 1
        if self.step % self.config.k_steps == 0:
            self._sync()

    def _sync(self) -> None:
        handles, windows = [], {}
        for name, parts in self.touched.items():
            if not parts:
                continue
            keys, inverse = unique_inverse(np.concatenate([p[0] for p in parts]))
            shows = np.bincount(inverse, np.concatenate([p[1] for p in parts]), keys.size).astype(
                np.float32
            )
            clicks = np.bincount(inverse, np.concatenate([p[2] for p in parts]), keys.size).astype(
                np.float32
            )
            delta = self.local[name].pull(keys) - self.base[name].pull(keys)
            handles.append(self.client.push_delta(name, keys, delta, shows=shows, clicks=clicks))
            windows[name] = keys
            parts.clear()
        if self.local_dense is not None:
            # averaged, not summed: every worker trains every dense parameter, so the sum
            # of N workers' deltas is N steps of the same size from the same start (it
            # diverged at low click rates: test AUC 0.55-0.75 at 4% clicks against 0.83
            # with the average; docs/training.md). Sparse deltas stay summed: most keys
            # are touched by one worker in a window.
            handles.append(self.client.push_dense_delta(DENSE_TABLE, self._dense_delta()))
        for handle in handles:
            handle.wait()
        for name, keys in windows.items():
            fresh = self.client.pull(name, keys).wait()
            zeros = np.zeros(keys.size, np.float32)
            for target in (self.local[name], self.base[name]):
                # move the embedding to the fresh value, keep the optimizer state
                target.push_delta(keys, fresh - target.pull(keys), shows=zeros, clicks=zeros)
        if self.config.keep_windows is not None:
            # local and base saw the same pushes this window, so they drop the same rows
            for name in self.local:
                for target in (self.local[name], self.base[name]):
                    target.decay(1.0)
                    target.shrink()
        self.refresh_dense()

    def finish_pass(self) -> None:
        self.quiesce()
        self.refresh_dense()

    def _dense_delta(self) -> np.ndarray:
        """This worker's share of the window's dense change: its delta over the workers."""
        assert self.local_dense is not None
        return (self.local_dense.pull() - self.base_dense) / np.float32(self.workers)

    def quiesce(self) -> None:
        self._sync()
        collectives.barrier(timeout=self.collective_timeout)

    def refresh_dense(self) -> None:
        if self.local_dense is not None:
            self.base_dense = self.client.pull_dense(DENSE_TABLE).wait()
            self.local_dense.set(self.base_dense)
            self.dense.set(self.base_dense)


def _rows_columns(table: SparseTable, keys: np.ndarray, embedding: np.ndarray) -> dict:
    n = keys.size
    return {
        "key": keys,
        "embedding": np.ascontiguousarray(embedding, np.float32),
        "state": np.zeros((n, table.layout.state_dim), np.float32),
        "show": np.zeros(n, np.float32),
        "click": np.zeros(n, np.float32),
        "unseen_days": np.zeros(n, np.int32),
        "delta_score": np.zeros(n, np.float32),
    }
