"""The scaled-job tests' job and checks (tests/elastic/test_scale_launched.py under the
local launcher, tests/launch/test_ray_backend.py under Ray): the job script, ``sparseps
scale`` through the command line, the stall while scaled, and the check that a scaled job
saved what the unscaled one did.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from .environ import CHECKOUT

__all__ = [
    "JOB",
    "STALL_BOUND_S",
    "StallWatch",
    "assert_same_training",
    "first_divergence",
    "scale",
    "stall_while_scaled",
    "step_times",
    "tables",
]

JOB = CHECKOUT / "tests" / "elastic" / "scripts" / "train_job.py"
# The longest a training step may wait while servers join or leave: a step waits only for
# the cut-over of the shards it touches (measured: tens to a few hundred ms on this box).
STALL_BOUND_S = 5.0
# A step's usual length when the job made no step outside the scaled windows.
STEP_PACE_S = 0.06


def scale(log_dir: Path, *args: str, capsys) -> dict:
    """``sparseps scale LOG_DIR ARGS --json`` through the command line's entry point."""
    from ..cli import main

    capsys.readouterr()
    code = main(["scale", str(log_dir), *args, "--json"])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    with capsys.disabled():
        print(printed.out.splitlines()[0])
    return json.loads(printed.out.splitlines()[-1])


def step_times(out: Path) -> np.ndarray:
    """The wall times of worker 0's training steps (the job's ``OUT/steps.0.json``)."""
    return np.array(json.loads((out / "steps.0.json").read_text())["times"])


def stall_while_scaled(out: Path, t0: float, t_mid: float, t1: float) -> tuple[float, int]:
    """The longest gap between two of worker 0's steps from the first scale's start
    (``t0``) to the second's end (``t1``) or the gate, whichever came first, and how many
    steps that window holds; asserts that training went on while the job was grown
    (``t0``..``t_mid``) and while it was shrunk (``t_mid``..``t1``), each window ending
    at the gate if worker 0 reached it first.

    How many steps a window must hold follows the job's own pace before the first scale
    (a loaded machine slows every step, scaled or not; the steps after ``t1`` are not
    that pace: the test opens the gate there, which ends worker 0's step sleep): a fifth
    of the steps that pace fits in the window, at least one and at most five. A scale
    that held training up for the whole window fails it whenever the window is two steps
    long or more."""
    times = step_times(out)
    before = np.diff(times[times < t0])
    pace = float(np.median(before)) if before.size else STEP_PACE_S
    # worker 0 waits at the gate (no steps, by design) once it gets there: on a loaded
    # machine a slow first scale lets it get there before the second one ends
    gate_at = float((out / "at_gate").read_text())
    for lo, hi, what in ((t0, t_mid, "grown"), (t_mid, t1, "shrunk")):
        hi = min(hi, gate_at)
        steps = np.count_nonzero((times >= lo) & (times <= hi))
        fits = (hi - lo) / pace
        if fits < 2:  # too short to tell: the stall bound below still holds it
            continue
        need = int(min(5, max(1, fits // 5)))
        assert steps >= need, (
            f"training did not go on while the job was {what}: {steps} steps in "
            f"{hi - lo:.2f} s, where its pace ({pace * 1000:.0f} ms a step) fits {fits:.0f}; "
            f"steps at (s from the first scale's start) {np.round(times - t0, 2).tolist()}, "
            f"scales {t_mid - t0:.2f} and {t1 - t0:.2f}, gate {gate_at - t0:.2f}"
        )
    inside = times[(times >= t0) & (times <= min(t1, gate_at))]
    window = np.concatenate([[t0], inside])
    return float(np.max(np.diff(window))), len(inside)


class StallWatch:
    """Dumps every role's stacks (``sparseps diagnose``) once, when worker 0 makes no step
    for ``quiet_s`` while watched, so that a stall the checks report says where each role
    waited (it cannot be seen after the job ended: by then nobody waits).

    Worker 0 appends a line to ``OUT/steps.live`` per step (the job script); its waits at
    the gate are not stalls (the watch ends once ``OUT/at_gate`` exists). Use as a context
    manager around the scales and the job's end (a stall may outlast the scales);
    :meth:`report` is the dump's summary and the roles' stacks ("" when none was taken).
    """

    def __init__(self, out: Path, log_dir: Path, quiet_s: float = 2.0) -> None:
        self._live, self._at_gate, self._log_dir = out / "steps.live", out / "at_gate", log_dir
        self._quiet_s = quiet_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self.folder: Path | None = None

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _watch(self) -> None:
        from ..observe.diagnose import diagnose

        size, since = -1, time.monotonic()
        while not self._stop.wait(0.1) and not self._at_gate.exists():
            now_size = self._live.stat().st_size if self._live.exists() else 0
            if now_size != size:
                size, since = now_size, time.monotonic()
            elif time.monotonic() - since > self._quiet_s:
                quiet = time.monotonic() - since
                self.folder = diagnose(self._log_dir, reason=f"no step for {quiet:.1f} s").folder
                return

    def report(self) -> str:
        if self.folder is None:
            return ""
        parts = [f"--- stacks when worker 0 had made no step for {self._quiet_s:g} s "
                 f"({self.folder})"]  # fmt: skip
        for path in [self.folder / "summary.txt", *sorted(self.folder.glob("[sw]*.*.txt"))]:
            if path.exists():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)


def tables(ckpt: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every saved sparse file kind (``deep_emb.shard`` ...), its rows sorted by key."""
    parts: dict[str, list] = {}
    for path in sorted(ckpt.glob("*.arrow")):
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        parts.setdefault(path.name.rsplit("-", 3)[0], []).append(table)
    out = {}
    for kind, kind_tables in parts.items():
        table = pa.concat_tables(kind_tables)
        order = np.argsort(table.column("key").to_numpy())
        out[kind] = {
            name: np.stack(table.column(name).to_numpy(zero_copy_only=False))[order]
            if pa.types.is_fixed_size_list(table.schema.field(name).type)
            or pa.types.is_list(table.schema.field(name).type)
            else table.column(name).to_numpy()[order]
            for name in table.column_names
        }
    return out


def assert_same_training(want: Path, got: Path) -> None:
    """The job that wrote ``got`` (its OUT folder) saved what the one that wrote ``want``
    did, bit for bit: every row of every saved table (embedding, optimizer state,
    counters; pending admission counters too) and every dense parameter."""
    try:
        _assert_same_saves(want, got)
    except AssertionError as exc:  # when the jobs' training first differed, for the report
        raise AssertionError(f"{exc}\n{first_divergence(want, got)}") from None


def first_divergence(want: Path, got: Path) -> str:
    """The first step (per worker) whose predictions differ between the two jobs, and
    when it ran in the job that wrote ``got`` (from its OUT/steps.R.json)."""
    lines = []
    for path in sorted(want.glob("steps.*.json")):
        a = json.loads(path.read_text())
        b = json.loads((got / path.name).read_text())
        sums_a, sums_b = a.get("prediction_sums", []), b.get("prediction_sums", [])
        differ = [i for i, (x, y) in enumerate(zip(sums_a, sums_b, strict=False)) if x != y]
        if not differ:
            lines.append(f"{path.name}: every step's predictions equal ({len(sums_b)} steps)")
            continue
        i = differ[0]
        times = b["times"]
        lines.append(f"{path.name}: predictions first differ at step {i} of {len(sums_b)} "
                     f"(wall time {times[i]:.3f}, steps from {times[0]:.3f} to {times[-1]:.3f})")  # fmt: skip
    return "\n".join(lines)


def _assert_same_saves(want: Path, got: Path) -> None:
    want_rows, got_rows = tables(want / "ckpt"), tables(got / "ckpt")
    assert sorted(got_rows) == sorted(want_rows) and want_rows["deep_emb.shard"]["key"].size > 0
    for kind in want_rows:
        assert sorted(got_rows[kind]) == sorted(want_rows[kind]), kind
        for column in want_rows[kind]:
            np.testing.assert_array_equal(got_rows[kind][column], want_rows[kind][column],
                                          err_msg=f"{kind}.{column}")  # fmt: skip
    dense_want, dense_got = np.load(want / "dense.npz"), np.load(got / "dense.npz")
    for name in dense_want.files:
        np.testing.assert_array_equal(dense_got[name], dense_want[name], err_msg=name)
