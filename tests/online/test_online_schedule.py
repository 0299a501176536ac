"""The per-pass save schedule (pure) and the driver running it with a fake trainer."""

from __future__ import annotations

import pytest

from sparseps.errors import ConfigError
from sparseps.online.schedule import PassPlan, plan_days, plan_pass

EOD = PassPlan(end_of_day=True, inference="base", checkpoint=True)


def _short(plan: PassPlan) -> str:
    """``E`` end of day, ``b``/``d`` base/delta, ``c`` checkpoint, ``-`` nothing."""
    if plan.end_of_day:
        assert plan == EOD
        return "E"
    text = {"base": "b", "delta": "d", None: ""}[plan.inference] + ("c" if plan.checkpoint else "")
    return text or "-"


def _days(lengths, **knobs) -> list[str]:
    return [" ".join(_short(p) for p in day) for day in plan_days(lengths, **knobs)]


def test_every_pass_saves_a_delta_and_a_checkpoint():
    assert _days([3, 2], delta_every=1, checkpoint_every=1) == ["bc dc E", "dc E"]


def test_delta_and_checkpoint_every_few_passes_restart_each_day():
    # days of 7, 5 and 3 passes: counters restart after each end-of-day base + checkpoint
    assert _days([7, 5, 3], delta_every=2, checkpoint_every=3) == [
        "- b c d - dc E",
        "- d c d E",
        "- d E",
    ]


def test_days_of_different_lengths_and_no_deltas():
    assert _days([4, 1, 6], delta_every=0, checkpoint_every=4) == [
        "- - - E",
        "E",
        "- - - c - E",
    ]


def test_first_save_is_a_base_when_the_directory_has_none():
    assert _days([5], delta_every=2, checkpoint_every=5) == ["- b - d E"]
    assert _days([5], delta_every=2, checkpoint_every=5, has_base=True) == ["- d - d E"]
    # a one-pass day is all end of day
    assert plan_pass(0, 1, delta_every=3, checkpoint_every=7, has_base=False) == EOD


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((3, 3, 1, 1), "index=3, passes_in_day=3"),
        ((-1, 3, 1, 1), "index=-1"),
        ((0, 0, 1, 1), "passes_in_day=0"),
        ((0, 2, -1, 1), "save.delta_every"),
        ((0, 2, 1, 0), "save.checkpoint_every"),
    ],
)
def test_bad_arguments_are_named(args, message):
    index, passes_in_day, delta_every, checkpoint_every = args
    with pytest.raises(ConfigError, match=message):
        plan_pass(index, passes_in_day, delta_every=delta_every,
                  checkpoint_every=checkpoint_every, has_base=True)  # fmt: skip
