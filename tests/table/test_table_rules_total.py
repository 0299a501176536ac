"""Issue 28: every rule is total over finite input, checked step by step against float64.

For each rule, hypothesis draws the rule's parameters (including the edges of their
documented ranges and FTRL with ``beta = l2 = 0``), a starting state (weights, and
optimizer state up to float32's max: "counters near their limits", set through
``import_rows``) and a few pushes of gradients mixing 0, float32 subnormals, +-1e-30,
+-1e30, +-3.4e38 and arbitrary finite float32 values. Each push goes through a real
``SparseTable``; it must not raise, every value must stay finite, and every touched row
must equal a float64 numpy reference of the same formula (written below from the rule's
docstring, with the same guards: saturation at float32's max, FTRL's flush of
``|g| < 2**-63``, non-negative state), applied to the row's float32 state *before* the
step and rounded to float32 once. Dense tables run the same kernels (SGD, Adagrad,
Adam): checked the same way through ``DenseTable``.

Tolerance: ``rtol = 1e-6, atol = 1e-40`` on the float32 results. Both sides do the same
float64 operations in the same order (the kernels do not use fast-math), so results are
normally bit-equal; the tolerance allows one float32 rounding step (~6e-8 relative) where
a last-bit float64 difference (e.g. a sum reduced in another order: row-wise Adagrad's
mean of squares) straddles a float32 rounding boundary. Below float32's normal range
(< 1.2e-38) a value keeps fewer significant bits, and a state that is itself subnormal
(Adam's moments with lr and eps at the bottom of their range) carries that loss into the
next step: a CI run found a weight of -9.92e-41 off by 1.5e-43 (0.16%). Differences under
1e-40 are therefore accepted; any real error in a formula is many orders larger. Adam's
weights get more where its bias corrections are ill-conditioned (``_adam_rtol``).
Examples are derandomized (a fixed seed per test), so a run cannot fail by chance.
Long runs (2000 pushes of the same tiny or huge gradient) are checked the same way.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparseps import optim
from sparseps.config import Initializer, TableConfig
from sparseps.optim.numerics import F32_MAX, F32_TINY
from sparseps.table import DenseTable, SparseTable

DIM = 3
KEYS = np.array([1, 2, 3, 4], np.uint64)
RTOL, ATOL = 1e-6, 1e-40
SUBNORMAL = float(np.float32(1e-45))
EXTREME = [0.0, -0.0, SUBNORMAL, -SUBNORMAL, 1e-40, -1e-40, 1e-30, -1e-30, 1e-20, 2.0**-63,
           -(2.0**-64), 1.0, -1.0, 1e30, -1e30, F32_MAX, -F32_MAX]  # fmt: skip
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
grad_value = st.one_of(st.sampled_from(EXTREME), f32)
nonneg_state = st.one_of(
    st.sampled_from([0.0, SUBNORMAL, 1e-30, 1.0, 2.0**24 - 1, 2.0**24, 1e30, F32_MAX]),
    st.floats(0, F32_MAX, width=32),
)
clips = st.sampled_from([None, (-1.0, 1.0), (-1e300, 1e300), (0.0, 0.5)])


# -- float64 references (the formulas of the rules' docstrings, with their guards) -------
def _fit(x):
    return np.clip(x, -F32_MAX, F32_MAX)  # NaN passes through, as in the kernels


def _clip(w, clip):
    return w if clip is None else np.minimum(np.maximum(w, clip[0]), clip[1])


def ref_sgd(rule, w, state, g):
    return _fit(_clip(w - rule.lr * (g + rule.l2 * w), rule.clip)), state


def ref_adagrad(rule, w, state, g):
    g = g + rule.l2 * w
    acc = np.maximum(state, 0.0) + g * g
    w = w - rule.lr * g / (np.sqrt(acc) + rule.eps)
    return _fit(_clip(w, rule.clip)), _fit(acc)


def ref_rowwise(rule, w, state, g):
    full = g + rule.l2 * w
    acc = np.maximum(state[:, 0], 0.0) + (full * full).sum(axis=1) / w.shape[1]
    step = rule.lr / (np.sqrt(acc) + rule.eps)
    w = w - step[:, None] * full
    return _fit(_clip(w, rule.clip)), _fit(acc)[:, None]


def ref_adam(rule, w, state, g):
    dim = w.shape[1]
    m, v, t = state[:, :dim], state[:, dim : 2 * dim], state[:, 2 * dim :]
    t = np.maximum(t, 0.0) + 1.0
    step_size = rule.lr / (1.0 - rule.beta1**t)
    correction2 = np.sqrt(1.0 - rule.beta2**t)
    g = g + rule.l2 * w
    m = rule.beta1 * m + (1.0 - rule.beta1) * g
    v = rule.beta2 * np.maximum(v, 0.0) + (1.0 - rule.beta2) * g * g
    w = w - step_size * m / (np.sqrt(v) / correction2 + rule.eps)
    return _fit(_clip(w, rule.clip)), _fit(np.concatenate([m, v, t], axis=1))


def ref_ftrl(rule, w, state, g):
    dim = w.shape[1]
    z, n_old = state[:, :dim], np.maximum(state[:, dim:], 0.0)
    g = np.where(np.abs(g) < 2.0**-63, 0.0, g)
    n_new = _fit(n_old + g * g)
    sigma = (np.sqrt(n_new) - np.sqrt(n_old)) / rule.alpha
    z = _fit(z + g - sigma * w)
    denominator = (rule.beta + np.sqrt(n_new)) / rule.alpha + rule.l2
    safe = np.where(denominator > 0, denominator, 1.0)
    w = np.where(
        (np.abs(z) <= rule.l1) | (denominator <= 0), 0.0, -(z - np.sign(z) * rule.l1) / safe
    )
    return _fit(_clip(w, rule.clip)), np.concatenate([z, n_new], axis=1)


def ref_sparse_adagrad(rule, w, state, g):
    full = g + rule.l2 * w
    g2sum = np.maximum(state[:, 0], 0.0)  # the step uses the accumulator before it
    step = rule.lr * np.sqrt(rule.initial_g2sum / (rule.initial_g2sum + g2sum))
    w = w - step[:, None] * full
    g2sum = g2sum + (full * full).sum(axis=1) / w.shape[1]
    return _fit(_clip(w, rule.clip)), _fit(g2sum)[:, None]


REFERENCES = {
    "sparse_adagrad": ref_sparse_adagrad,
    "sgd": ref_sgd,
    "adagrad": ref_adagrad,
    "rowwise_adagrad": ref_rowwise,
    "adam": ref_adam,
    "ftrl": ref_ftrl,
}

# -- rule parameters, including the edges of the documented ranges ----------------------
scale = st.sampled_from([F32_TINY, 1e-6, 0.01, 0.05, 1.0, 1e10, F32_MAX])
small_scale = st.sampled_from([1e-4, 0.01, 0.1, 1.0])
nonneg = st.sampled_from([0.0, 1e-6, 0.01, 1.0, 1e10])
beta = st.sampled_from([0.0, 0.5, 0.9, 0.999, 0.9999999, 1.0 - 2.0**-52])

RULES = {
    "sgd": st.tuples(scale, st.sampled_from([0.0, 1e-3, 1.0, 1.99]), clips)
    .filter(lambda a: a[0] * a[1] < 2)  # lr * l2 >= 2 is refused (tested below)
    .map(lambda a: optim.SGD(lr=a[0], l2=a[1], clip=a[2])),
    "adagrad": st.builds(
        optim.Adagrad,
        lr=scale,
        eps=scale,
        l2=nonneg,
        clip=clips,
        initial_accumulator=st.sampled_from([0.0, 0.1, F32_MAX]),
    ),  # fmt: skip
    "rowwise_adagrad": st.builds(optim.RowwiseAdagrad, lr=scale, eps=scale, l2=nonneg, clip=clips),
    "sparse_adagrad": st.builds(
        optim.SparseAdagrad, lr=scale, initial_g2sum=scale, l2=nonneg, clip=clips
    ),
    "adam": st.builds(
        optim.Adam, lr=scale, beta1=beta, beta2=beta, eps=scale, l2=nonneg, clip=clips
    ),
    "ftrl": st.builds(
        optim.FTRL,
        alpha=scale,
        beta=st.sampled_from([0.0, 1e-30, 1.0]),
        l1=st.sampled_from([0.0, 1e-3, 10.0]),
        l2=st.sampled_from([0.0, 1.0]),
        clip=clips,
    ),  # fmt: skip
}


def _table(rule) -> SparseTable:
    config = TableConfig(name="t", dim=DIM, rule=rule, initializer=Initializer.zeros())
    return SparseTable(config)


def _rows(table: SparseTable) -> tuple[np.ndarray, np.ndarray]:
    columns = table.export_rows()
    order = np.argsort(columns["key"])
    return columns["embedding"][order], columns["state"][order]


def _start(rule, draw) -> tuple[np.ndarray, np.ndarray]:
    """Starting weights and state: any finite weights; state within the rule's domain."""
    width = rule.state_dim(DIM)
    weights = draw(st.lists(grad_value, min_size=KEYS.size * DIM, max_size=KEYS.size * DIM))
    w = np.array(weights, np.float32).reshape(KEYS.size, DIM)
    values = draw(st.lists(nonneg_state, min_size=KEYS.size * width, max_size=KEYS.size * width))
    state = np.array(values, np.float32).reshape(KEYS.size, width)
    if rule.name in ("adam", "ftrl"):  # adam's m and ftrl's z take either sign
        signs = draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=state.size,
                              max_size=state.size))  # fmt: skip
        signed = state * np.array(signs, np.float32).reshape(state.shape)
        state[:, :DIM] = signed[:, :DIM]
    return w, state


def _import(table: SparseTable, w: np.ndarray, state: np.ndarray) -> None:
    n = KEYS.size
    table.import_rows({
        "key": KEYS, "embedding": w, "state": state,
        "show": np.ones(n, np.float32), "click": np.zeros(n, np.float32),
        "delta_score": np.zeros(n, np.float32), "unseen_days": np.zeros(n, np.int32),
    })  # fmt: skip


def _step_and_compare(name, rule, table, grads, where=""):
    w, state = _rows(table)
    table.push(KEYS, grads)  # must not raise
    got_w, got_state = _rows(table)
    assert np.isfinite(got_w).all() and np.isfinite(got_state).all(), where
    with np.errstate(all="ignore"):
        want_w, want_state = REFERENCES[name](
            rule, w.astype(np.float64), state.astype(np.float64), grads.astype(np.float64)
        )
    rtols = _adam_rtol(rule, state) if name == "adam" else np.full(len(got_w), RTOL)
    if _close(got_w, want_w, rtols[:, None]) and _close(got_state, want_state, RTOL):
        return  # what the asserts below accept; they run (and explain) when it is not
    for row, rtol in enumerate(rtols):
        np.testing.assert_allclose(got_w[row], want_w[row].astype(np.float32), rtol=rtol,
                                   atol=ATOL, err_msg=f"{name} weights row {row} {where}")  # fmt: skip
    np.testing.assert_allclose(got_state, want_state.astype(np.float32), rtol=RTOL, atol=ATOL,
                               err_msg=f"{name} state {where}")  # fmt: skip


def _close(got: np.ndarray, want: np.ndarray, rtol) -> bool:
    """Whether the asserts of :func:`_step_and_compare` pass, decided in one ``isclose``
    over all rows (the comparison ``assert_allclose`` makes, same dtypes) instead of one
    assert per row: the long runs take 10k steps. NaN anywhere is left to the asserts."""
    want = want.astype(np.float32)
    return bool(np.isclose(got, want, rtol=rtol, atol=ATOL, equal_nan=False).all())


def _adam_rtol(rule, state: np.ndarray) -> np.ndarray:
    """Per-row tolerance of Adam's weights: ``1 - beta**t`` cancels when beta is within a
    few ulps of 1 and t is small, so the last bit of ``pow`` (numba's binds to the
    process's libm ``pow``, numpy has its own; a CI run, t = 1.75 and beta2 = 1 - 2**-52,
    saw 13%) is amplified by ``2**-52 / (1 - beta**t)``. Rows where that is negligible
    keep RTOL; a wrong formula is off by far more than either."""
    t = np.maximum(state[:, 2 * DIM :].astype(np.float64), 0.0) + 1.0
    with np.errstate(all="ignore"):
        gaps = [1.0 - rule.beta1**t, 1.0 - rule.beta2**t]
    amplified = sum(np.where(g > 0, 2.0**-52 / g, 0.0) for g in gaps)
    return RTOL + 4.0 * amplified[:, 0]  # one per row


@st.composite
def _case(draw, name):
    rule = draw(RULES[name])
    w, state = _start(rule, draw)
    steps = draw(st.integers(1, 6))
    grads = [
        np.array(
            draw(st.lists(grad_value, min_size=KEYS.size * DIM, max_size=KEYS.size * DIM)),
            np.float32,
        ).reshape(KEYS.size, DIM)  # fmt: skip
        for _ in range(steps)
    ]
    return rule, w, state, grads


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_is_total_and_matches_float64_reference(name):
    @SETTINGS
    @given(case=_case(name))
    def check(case):
        rule, w, state, grads = case
        table = _table(rule)
        _import(table, w, state)
        for step, g in enumerate(grads):
            _step_and_compare(name, rule, table, g, f"step {step} of {rule}")

    check()


RUN_VALUES = [SUBNORMAL, -1e-30, 1e-20, 1e30, -F32_MAX]


@pytest.mark.parametrize("name", sorted(RULES))
def test_long_runs_of_tiny_or_huge_gradients(name):
    """2000 pushes of one value (then of alternating sign), every step against float64."""
    rules = {
        "sgd": optim.SGD(lr=1.0), "adagrad": optim.Adagrad(), "rowwise_adagrad":
        optim.RowwiseAdagrad(), "adam": optim.Adam(), "ftrl": optim.FTRL(alpha=0.1, beta=0.0),
        "sparse_adagrad": optim.SparseAdagrad(clip=None),
    }  # fmt: skip
    rule = rules[name]
    for value in RUN_VALUES:
        table = _table(rule)
        table.push(KEYS, np.zeros((KEYS.size, DIM), np.float32))
        for step in range(2000):
            sign = 1.0 if step < 1000 or step % 2 else -1.0
            grads = np.full((KEYS.size, DIM), sign * value, np.float32)
            grads[0] = 0.0  # one row of zeros in every batch
            _step_and_compare(name, rule, table, grads, f"{value} step {step}")


DENSE = {"sgd": RULES["sgd"], "adagrad": RULES["adagrad"], "adam": RULES["adam"]}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense_rules_are_total_and_match_float64_reference(name):
    @SETTINGS
    @given(rule=DENSE[name], data=st.data())
    def check(rule, data):
        size = 4
        dense = DenseTable("head", size, rule=rule)
        for step in range(data.draw(st.integers(1, 6))):
            g = np.array(data.draw(st.lists(grad_value, min_size=size, max_size=size)), np.float32)
            before = dense.export()
            dense.push(g)  # must not raise
            after = dense.export()
            assert all(np.isfinite(v).all() for v in after.values())
            w = before["values"].astype(np.float64)[None]
            state = before["state"].astype(np.float64)[None]
            with np.errstate(all="ignore"):
                want_w, want_state = REFERENCES[name](rule, w, state, g.astype(np.float64)[None])
            where = f"step {step} of {rule}"
            np.testing.assert_allclose(after["values"], want_w[0].astype(np.float32),
                                       rtol=RTOL, atol=ATOL, err_msg=where)  # fmt: skip
            np.testing.assert_allclose(after["state"], want_state[0].astype(np.float32),
                                       rtol=RTOL, atol=ATOL, err_msg=where)  # fmt: skip

    check()


def test_the_issue_mixed_ftrl_push_succeeds_on_a_table():
    """Issue 28's repro, table level: beta = 0, a 1e-30 gradient between two 0.1s."""
    config = TableConfig(name="w", dim=1, rule=optim.FTRL(alpha=0.1, beta=0.0),
                         initializer=Initializer.zeros())  # fmt: skip
    table = SparseTable(config)
    table.push(np.array([1, 2], np.uint64), np.array([[0.5], [0.5]], np.float32))
    table.push(np.array([1, 20, 2], np.uint64), np.array([[0.1], [1e-30], [0.1]], np.float32))
    table.push(np.array([20], np.uint64), np.array([[0.0]], np.float32))  # n stays 0, z too
    rows = table.pull(np.array([1, 2, 20], np.uint64))
    assert np.isfinite(rows).all()
    assert rows[0, 0] == rows[1, 0] != 0.0  # both moved the same way
    assert rows[2, 0] == 0.0  # 1e-30 is flushed: no move


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: optim.SGD(lr=0.0), "SGD.lr"),
        (lambda: optim.SGD(lr=1e39), r"SGD.lr: got 1e\+39, expected a number in \[1.2e-38"),
        (lambda: optim.SGD(lr=1.0, l2=2.0), "lr \\* l2 = 2 must be < 2"),
        (lambda: optim.Adagrad(eps=1e-40), "Adagrad.eps"),
        (lambda: optim.Adagrad(initial_accumulator=1e39), "Adagrad.initial_accumulator"),
        (lambda: optim.RowwiseAdagrad(lr=float("inf")), "RowwiseAdagrad.lr"),
        (lambda: optim.Adam(beta1=1.0), "Adam.beta1"),
        (lambda: optim.Adam(eps=0.0), "Adam.eps"),
        (lambda: optim.FTRL(alpha=1e-39), "FTRL.alpha"),
        (lambda: optim.FTRL(l1=-1.0), "FTRL.l1"),
        (lambda: optim.FTRL(beta=1e39), "FTRL.beta"),
    ],
)
def test_parameters_that_cannot_work_are_refused(make, message):
    from sparseps.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        make()
