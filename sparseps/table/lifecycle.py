"""Feature lifecycle: admission of new keys, daily decay and shrink (DESIGN §2.5).

``score = (show - click) * nonclick_coeff + click * click_coeff``.

Admission decides when a key that is not yet a row becomes one. Until then the key is
*pending*: only its show/click counters (and unseen days) are kept, its gradients are
dropped and a pull returns zeros. Policies, evaluated on the counters *including* the
current push:

- ``always``: every pushed key is admitted.
- ``count``: admitted once ``show >= admit_count``.
- ``score``: admitted once ``score >= admit_score``.
- ``probability``: each push that carries the key admits it with probability
  ``admit_probability``. The draw is a hash of ``(seed, key, attempt)`` with ``attempt =
  floor(show before this push)``, so every shard, replay and restore makes the same
  decision (no random generator state).

Decay multiplies show/click by a rate and ages unseen days; shrink selects rows whose
score is below ``shrink_score`` or unseen for more than ``shrink_unseen_days`` days. The
same two passes run over pending keys, so pending counters cannot pile up forever.
"""

from __future__ import annotations

import numpy as np

from ..config import Accessor, Admission, Lifecycle
from ..core.hashing import GOLDEN, mix64
from ..core.jit import njit
from .hashmap_kernels import FULL

__all__ = [
    "admit",
    "base_keep",
    "decay_slots",
    "delta_keep",
    "reset_delta_rows",
    "seed_word",
    "shrink_select",
    "shrink_select_rows",
    "score",
]

ADMISSION_CODES = {
    Admission.ALWAYS: 0,
    Admission.COUNT: 1,
    Admission.PROBABILITY: 2,
    Admission.SCORE: 3,
}
_ADMIT_SALT = 0xBB67AE8584CAA73B


def seed_word(seed: int) -> np.uint64:
    """The per-table word mixed into admission draws (distinct from init words)."""
    return np.uint64(seed) ^ np.uint64(_ADMIT_SALT)


def score(show: np.ndarray, click: np.ndarray, policy: Lifecycle) -> np.ndarray:
    """Paddle's show_click_score, vectorised (float64, as the compiled passes compute it
    from the stored float32 counters)."""
    show, click = np.asarray(show), np.asarray(click, np.float64)
    return (show - click) * policy.nonclick_coeff + click * policy.click_coeff


@njit(nogil=True, cache=True)
def _admit(pending, pids, is_new, keys, shows, clicks, mode, count, probability, threshold,
           nonclick, click_coeff, salt, admitted, prior_show, prior_click):  # fmt: skip  # pragma: no cover
    golden = GOLDEN
    seed_mixed = mix64(salt)
    for i in range(pids.shape[0]):
        p = pids[i]
        if is_new[i]:
            pending[p, 0] = 0.0
            pending[p, 1] = 0.0
        s = pending[p, 0]
        c = pending[p, 1]
        prior_show[i] = s
        prior_click[i] = c
        attempt = np.uint64(np.int64(np.floor(s)))
        s = s + shows[i]
        c = c + clicks[i]
        pending[p, 0] = s
        pending[p, 1] = c
        pending[p, 2] = -1.0  # pushed since the last decay
        if mode == 1:
            ok = s >= count
        elif mode == 3:
            ok = (s - c) * nonclick + c * click_coeff >= threshold
        elif mode == 2:
            word = mix64(mix64(keys[i] ^ seed_mixed) + attempt * golden)
            ok = np.float64(word >> np.uint64(11)) * (1.0 / 9007199254740992.0) < probability
        else:
            ok = True
        admitted[i] = ok


def admit(pending, pids, is_new, keys, shows, clicks, policy: Lifecycle, seed: int):
    """Add a push's counters to pending keys and decide which are admitted now.

    Args:
        pending: float32 ``[P, 3]`` pending counters (show, click, unseen).
        pids, is_new: pending ids of ``keys`` and whether each was just inserted.
        keys, shows, clicks: the merged (unique) keys of the push and their counts.
        policy: the table's lifecycle.
        seed: the table seed.

    Returns:
        ``(admitted bool [m], prior_show float32 [m], prior_click float32 [m])``; the priors
        are the counters before this push (a new row starts from them, then the push's own
        counts are added like for any row).
    """
    m = keys.shape[0]
    admitted = np.empty(m, np.bool_)
    prior_show = np.empty(m, np.float32)
    prior_click = np.empty(m, np.float32)
    _admit(
        pending, pids, is_new, keys, shows, clicks, ADMISSION_CODES[policy.admission],
        float(policy.admit_count), policy.admit_probability, policy.admit_score,
        policy.nonclick_coeff, policy.click_coeff, seed_word(seed),
        admitted, prior_show, prior_click,
    )  # fmt: skip
    return admitted, prior_show, prior_click


def base_keep(show, click, lifecycle: Lifecycle) -> np.ndarray:
    """Rows a base inference save keeps: ``score >= base_score`` (Paddle's
    ``base_threshold``)."""
    return score(show, click, lifecycle) >= lifecycle.base_score


def delta_keep(show, click, delta_score, unseen_days, lifecycle: Lifecycle,
               accessor: Accessor) -> np.ndarray:  # fmt: skip
    """Rows a delta inference save keeps (Paddle's ``CtrCommonAccessor::Save(param=1)``):
    changed since the last delta save (``delta_score > 0``) by at least
    ``delta_threshold``, seen within ``delta_keep_days``, and scoring at least the base
    threshold."""
    return (
        (delta_score > 0)
        & (delta_score >= accessor.delta_threshold)
        & (unseen_days <= accessor.delta_keep_days)
        & base_keep(show, click, lifecycle)
    )


@njit(nogil=True, cache=True)
def _reset_delta(rows, stat0, nonclick, click_coeff, base, threshold, keep_days):
    # pragma: no cover - compiled
    for r in range(rows.shape[0]):
        show = np.float64(rows[r, stat0])
        click = np.float64(rows[r, stat0 + 1])
        delta = rows[r, stat0 + 2]
        unseen = max(rows[r, stat0 + 3], 0.0)  # -1: pushed since the last decay (0 days)
        if (
            delta > 0
            and delta >= threshold
            and unseen <= keep_days
            and (show - click) * nonclick + click * click_coeff >= base
        ):
            rows[r, stat0 + 2] = 0.0


def reset_delta_rows(rows: np.ndarray, stat0: int, lifecycle: Lifecycle,
                     accessor: Accessor) -> None:  # fmt: skip
    """Zero the delta_score of the rows of ``rows`` that :func:`delta_keep` keeps (rows
    of deleted ids too: harmless, a reused id's row is written whole)."""
    _reset_delta(rows, stat0, lifecycle.nonclick_coeff, lifecycle.click_coeff,
                 lifecycle.base_score, accessor.delta_threshold,
                 float(accessor.delta_keep_days))  # fmt: skip


@njit(nogil=True, cache=True)
def decay_slots(sstate, svals, storage, show_col, unseen_col, rate):  # pragma: no cover - compiled
    """show, click *= rate; unseen: -1 (pushed since last decay) -> 0, else += 1."""
    for s in range(sstate.shape[0]):
        if sstate[s] != FULL:
            continue
        r = svals[s]
        storage[r, show_col] *= rate
        storage[r, show_col + 1] *= rate
        unseen = storage[r, unseen_col]
        storage[r, unseen_col] = 0.0 if unseen < 0 else unseen + 1.0


@njit(nogil=True, cache=True)
def _shrink_select(sstate, skeys, svals, storage, show_col, unseen_col, nonclick, click_coeff,
                   min_score, max_unseen, out):  # fmt: skip  # pragma: no cover
    n = 0
    for s in range(sstate.shape[0]):
        if sstate[s] != FULL:
            continue
        r = svals[s]
        show = storage[r, show_col]
        click = storage[r, show_col + 1]
        value = (show - click) * nonclick + click * click_coeff
        if value < min_score or storage[r, unseen_col] > max_unseen:
            out[n] = skeys[s]
            n += 1
    return n


def shrink_select(index, storage, show_col: int, unseen_col: int, policy: Lifecycle) -> np.ndarray:
    """Sorted uint64 keys of ``index`` whose rows the policy deletes."""
    skeys, svals, sstate = index.slots()
    return _select(sstate, skeys, svals, len(index), storage, show_col, unseen_col, policy)


def shrink_select_rows(keys, ids, storage, show_col: int, unseen_col: int, policy: Lifecycle):
    """:func:`shrink_select` over the rows ``ids`` (of ``keys``) in the given order (the disk
    tier passes them in id order: a sequential read of its file)."""
    full = np.full(keys.shape[0], FULL, np.uint8)
    return _select(full, keys, ids, keys.shape[0], storage, show_col, unseen_col, policy)


def _select(sstate, skeys, svals, size, storage, show_col, unseen_col, policy) -> np.ndarray:
    out = np.empty(size, np.uint64)
    n = _shrink_select(
        sstate, skeys, svals, storage, show_col, unseen_col, policy.nonclick_coeff,
        policy.click_coeff, policy.shrink_score, float(policy.shrink_unseen_days), out,
    )  # fmt: skip
    return np.sort(out[:n])
