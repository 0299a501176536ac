"""What a pass saves: a pure function of the pass's place in its day.

Rules (``K = save.delta_every``, ``M = save.checkpoint_every``; ``i`` = the pass's index
within its day, from 0; ``n`` = passes in that day):

- the last pass of a day (``i == n - 1``) decays and shrinks the tables, then saves a
  **base** inference model and a **checkpoint**;
- any other pass saves a **delta** when ``(i + 1) % K == 0`` (``K = 0``: never) — or a
  base instead if the model directory has none yet (a delta needs a base to apply to);
- and a **checkpoint** when ``(i + 1) % M == 0``.

Both counters restart every day. The end of a day always writes a base and a checkpoint,
so counting from the day's start spaces the saves evenly after each of those; counting by
the global ``seq`` would instead put a save right after the end-of-day one whenever a
day's pass count is not a multiple of ``K`` or ``M``. Being pure, the plan of a redone pass
(after a crash) is the plan it had the first time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["PassPlan", "plan_days", "plan_pass"]


@dataclass(frozen=True)
class PassPlan:
    """The saves of one pass, in the order the driver runs them.

    Attributes:
        end_of_day: decay + shrink after training (before the saves).
        inference: ``"base"``, ``"delta"`` or ``None`` (no inference save).
        checkpoint: save a checkpoint (after the inference save).
    """

    end_of_day: bool
    inference: str | None
    checkpoint: bool


def plan_pass(
    index: int, passes_in_day: int, *, delta_every: int, checkpoint_every: int, has_base: bool
) -> PassPlan:
    """The saves of pass ``index`` (0-based) of a day of ``passes_in_day`` passes.

    Args:
        delta_every, checkpoint_every: ``save.delta_every`` (0: no deltas) and
            ``save.checkpoint_every`` (>= 1).
        has_base: the model directory already holds a complete base inference model.

    Raises:
        ConfigError: an argument is out of range (names it and the value).
    """
    if passes_in_day < 1 or not 0 <= index < passes_in_day:
        raise ConfigError(
            f"plan_pass: index must be in [0, passes_in_day) and passes_in_day >= 1; got "
            f"index={index}, passes_in_day={passes_in_day}"
        )
    if delta_every < 0 or checkpoint_every < 1:
        raise ConfigError(
            f"plan_pass: save.delta_every must be >= 0 and save.checkpoint_every >= 1; got "
            f"{delta_every} and {checkpoint_every}"
        )
    if index == passes_in_day - 1:
        return PassPlan(end_of_day=True, inference="base", checkpoint=True)
    inference = None
    if delta_every and (index + 1) % delta_every == 0:
        inference = "delta" if has_base else "base"
    return PassPlan(
        end_of_day=False, inference=inference, checkpoint=(index + 1) % checkpoint_every == 0
    )


def plan_days(
    passes_per_day: Sequence[int],
    *,
    delta_every: int,
    checkpoint_every: int,
    has_base: bool = False,
) -> list[list[PassPlan]]:
    """The plans of consecutive days (``passes_per_day[d]`` passes on day ``d``).

    ``has_base`` is the model directory's state before the first pass; it turns true at
    the first inference save.
    """
    out = []
    for passes_in_day in passes_per_day:
        day = []
        for index in range(passes_in_day):
            plan = plan_pass(
                index, passes_in_day, delta_every=delta_every,
                checkpoint_every=checkpoint_every, has_base=has_base,
            )  # fmt: skip
            has_base = has_base or plan.inference is not None
            day.append(plan)
        out.append(day)
    return out
