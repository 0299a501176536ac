"""A plain-numpy reference of the CTR accessor's rules (the oracle of the accessor tests).

:class:`CtrReference` keeps one Python record per key and applies, push by push, what
docs/table.md ("Accessor") says a split table does: merge repeated keys, add the counts
(show, click, delta score by Paddle's show_click_score), step the embed part with its
rule, then the embedx part: step it if the row has one, create it (initial value and
state, then this push's step) once the row's score reaches ``embedx_threshold``, else
drop its gradient. Pulls (with ``cvm``: show and click first), decay, shrink and the
delta/base save filters follow the same page. It is written for clarity over speed
(Python loops over keys and elements, float64 like the kernels, one float32 rounding per
stored value) and supports the rules the accessor tests use: ``SparseAdagrad`` and
``SGD``; float16 embedx storage rounds with numpy's ``float16`` (nearest, ties to even,
saturated at 65504).

Initial values come from :func:`sparseps.table.initializers.initial_values` (a pure
function of seed and key, tested on its own): element ``j`` of a key's pulled vector is
element ``j`` of its initializer's sequence, the embed part's initializer for the first
``embed_dim`` elements and the table's for the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..config import EmbedxDtype, TableConfig
from ..table.initializers import initial_values

__all__ = ["CtrReference"]

F32_MAX = float(np.finfo(np.float32).max)


def _f32(x: float) -> float:
    return float(np.float32(min(max(x, -F32_MAX), F32_MAX)))


@dataclass
class _Row:
    embed: list[float]
    embed_state: list[float]
    show: float = 0.0
    click: float = 0.0
    delta: float = 0.0
    unseen: float = 0.0
    embedx: list[float] | None = None
    embedx_state: list[float] = field(default_factory=list)


def _step(rule, w: list[float], state: list[float], g: list[float], half: bool) -> None:
    """One step of ``rule`` on ``w``/``state`` in place (float64 inside, float32 out)."""
    low, high = rule.clip if rule.clip is not None else (-math.inf, math.inf)
    if rule.name == "sparse_adagrad":
        g2sum = max(state[0], 0.0)
        step = rule.lr * math.sqrt(rule.initial_g2sum / (rule.initial_g2sum + g2sum))
        added = 0.0
        for j in range(len(w)):
            grad = g[j] + rule.l2 * w[j]
            added += grad * grad
            w[j] = _store(min(max(w[j] - step * grad, low), high), half)
        state[0] = _f32(g2sum + added / len(w))
    elif rule.name == "sgd":
        for j in range(len(w)):
            w[j] = _store(min(max(w[j] - rule.lr * (g[j] + rule.l2 * w[j]), low), high), half)
    else:
        raise NotImplementedError(f"CtrReference: rule {rule.name!r}")


def _store(x: float, half: bool) -> float:
    if half:  # straight from float64 to the nearest half (no float32 rounding between)
        return float(np.float16(min(max(x, -65504.0), 65504.0)))
    return _f32(x)


class CtrReference:
    """The accessor's rules on one table, in numpy (see the module docstring).

    Args:
        config: a config whose accessor has ``embed_dim=1`` (admission "always").
    """

    def __init__(self, config: TableConfig) -> None:
        self.config = config
        self.accessor = config.accessor
        self.policy = config.lifecycle
        self.embed_rule = self.accessor.embed_rule_or(config.rule)
        self.half = self.accessor.embedx_dtype is EmbedxDtype.FLOAT16
        self.rows: dict[int, _Row] = {}

    def score(self, show, click) -> float:
        return (show - click) * self.policy.nonclick_coeff + click * self.policy.click_coeff

    def _initial(self, key: int) -> tuple[list[float], list[float]]:
        keys = np.array([key], np.uint64)
        edim = self.accessor.embed_dim
        embed = initial_values(keys, edim, self.accessor.embed_initializer, self.config.seed)
        vector = initial_values(keys, self.config.dim, self.config.initializer, self.config.seed)
        return [float(v) for v in embed[0]], [_store(float(v), self.half) for v in vector[0, edim:]]

    # -- ops --------------------------------------------------------------------------
    def push(self, keys, grads, shows=None, clicks=None) -> None:
        n = len(keys)
        shows = np.ones(n, np.float32) if shows is None else shows
        clicks = np.zeros(n, np.float32) if clicks is None else clicks
        merged: dict[int, list] = {}
        for i, key in enumerate(int(k) for k in keys):  # sums in occurrence order, float32
            if key not in merged:
                merged[key] = [grads[i].astype(np.float32).copy(), np.float32(shows[i]),
                               np.float32(clicks[i])]  # fmt: skip
            else:
                merged[key][0] = merged[key][0] + grads[i]
                merged[key][1] = np.float32(merged[key][1] + shows[i])
                merged[key][2] = np.float32(merged[key][2] + clicks[i])
        edim = self.accessor.embed_dim
        for key, (g, show, click) in merged.items():
            row = self.rows.get(key)
            if row is None:
                embed, _ = self._initial(key)
                state = [float(v) for v in self.embed_rule.initial_state(edim)]
                row = self.rows[key] = _Row(embed, state)
            s, c = float(show), float(click)
            row.show = _f32(row.show + s)
            row.click = _f32(row.click + c)
            row.delta = _f32(row.delta + ((s - c) * self.policy.nonclick_coeff
                                          + c * self.policy.click_coeff))  # fmt: skip
            row.unseen = -1.0
            grad = [float(v) for v in g]
            _step(self.embed_rule, row.embed, row.embed_state, grad[:edim], False)
            if row.embedx is None and (
                self.score(row.show, row.click) >= self.accessor.embedx_threshold
            ):
                _, row.embedx = self._initial(key)
                xdim = self.config.dim - edim
                row.embedx_state = [float(v) for v in self.config.rule.initial_state(xdim)]
            if row.embedx is not None:
                _step(self.config.rule, row.embedx, row.embedx_state, grad[edim:], self.half)

    def pull(self, keys) -> np.ndarray:
        cvm = 2 if self.accessor.cvm else 0
        out = np.zeros((len(keys), cvm + self.config.dim), np.float32)
        for i, key in enumerate(int(k) for k in keys):
            row = self.rows.get(key)
            if row is None:
                embed, embedx = self._initial(key)
                out[i, cvm : cvm + len(embed)] = embed
                if self.accessor.embedx_threshold == 0:
                    out[i, cvm + len(embed) :] = embedx
                continue
            if cvm:
                out[i, :2] = row.show, row.click
            out[i, cvm : cvm + len(row.embed)] = row.embed
            if row.embedx is not None:
                out[i, cvm + len(row.embed) :] = row.embedx
        return out

    def has_embedx(self) -> set[int]:
        return {key for key, row in self.rows.items() if row.embedx is not None}

    def decay(self, rate: float) -> None:
        for row in self.rows.values():
            row.show = float(np.float32(row.show * rate))
            row.click = float(np.float32(row.click * rate))
            row.unseen = 0.0 if row.unseen < 0 else row.unseen + 1.0

    def shrink(self) -> list[int]:
        """Paddle's delete: score below ``delete_threshold`` or unseen for longer than
        ``delete_after_unseen_days``; returns the deleted keys, sorted."""
        dead = sorted(
            key for key, row in self.rows.items()
            if self.score(np.float32(row.show), np.float32(row.click)) < self.policy.shrink_score
            or row.unseen > self.policy.shrink_unseen_days
        )  # fmt: skip
        for key in dead:
            del self.rows[key]
        return dead

    def base_keep(self) -> set[int]:
        """Keys a base save keeps: score >= base_threshold."""
        return {k for k, r in self.rows.items()
                if self.score(r.show, r.click) >= self.policy.base_score}  # fmt: skip

    def delta_keep(self) -> set[int]:
        """Keys a delta save keeps (Paddle's Save(param=1), plus "changed": delta > 0)."""
        return {
            k for k in self.base_keep()
            if (row := self.rows[k]).delta > 0 and row.delta >= self.accessor.delta_threshold
            and max(row.unseen, 0.0) <= self.accessor.delta_keep_days
        }  # fmt: skip

    def reset_delta(self) -> None:
        for key in self.delta_keep():
            self.rows[key].delta = 0.0
