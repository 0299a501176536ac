"""A secure job's worker group runs over CURVE and behaves as gloo does (issue 52).

Real worker processes (tests/security/scripts/group_worker.py) meet on a CURVE store and
form their group as ``sps.init()`` does in a ``--secure`` job. Three of them go through
every check but the refused key (a group of its own per check: a worker process costs
seconds of CPU, a group milliseconds); two others try to join with different keys.
Shown here:

- every collective sparseps issues (and torch's own: all-reduce with each op, broadcast,
  all-gather of lists, tensors and objects, all-to-all, barrier, isend/irecv in either
  order) gives the oracle's values on three workers; float sums are the rank-order sum,
  bit for bit, on every worker;
- a worker holding another job's keys cannot join, and both sides say so at once;
- a worker that crashes or leaves fails the others' collective within seconds (not the
  collective's timeout), as a named ``UnavailableError``;
- a collective that a worker never joins is a ``DeadlineError`` naming the setting, and
  the group is unusable afterwards (as gloo's is), saying why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from sparseps.rpc.mesh import GONE_GRACE_S
from sparseps.rpc.security import write_job_keys
from sparseps.rpc.transport import free_port
from sparseps.testing import run_ranks
from sparseps.testing.environ import clean_environ

pytestmark = pytest.mark.timeout(180)

WORKER = Path(__file__).resolve().parent / "scripts" / "group_worker.py"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys") / "job"
    write_job_keys(folder)
    return folder


def _run(mode: str, world: int, keys: Path, out: Path, group_keys: dict[int, Path] | None = None):
    master = f"127.0.0.1:{free_port()}"
    out.mkdir(parents=True, exist_ok=True)

    def argv(rank: int) -> list:
        extra = [group_keys[rank]] if group_keys and rank in group_keys else []
        return [mode, rank, world, master, keys, out, *extra]

    results = run_ranks(
        WORKER, world, argv, timeout_s=150, env=clean_environ(), check=False, rank0_last=True
    )
    return [r.returncode for r in results], "\n".join(r.output for r in results)


def _record(out: Path, rank: int) -> dict:
    return json.loads((out / f"result.{rank}.json").read_text())


@dataclass(frozen=True)
class Phases:
    """The run of group_worker.py's ``phases`` mode: exit codes, output, folder."""

    codes: list
    output: str
    out: Path

    def record(self, rank: int, phase: str):
        """Rank ``rank``'s record of ``phase``, failing with the workers' output if the
        run did not get there."""
        path = self.out / f"result.{rank}.json"
        record = json.loads(path.read_text()) if path.exists() else {}
        assert phase in record, (rank, phase, record, self.output[-4000:])
        return record[phase]


@pytest.fixture(scope="module")
def phases(keys, tmp_path_factory) -> Phases:
    out = tmp_path_factory.mktemp("phases")
    codes, output = _run("phases", 3, keys, out)
    return Phases(codes, output, out)


def test_every_collective_matches_the_oracle_on_three_workers(phases):
    world = 3
    for r in range(world):
        assert phases.record(r, "backend") == "sparseps_curve"
    results = [dict(np.load(phases.out / f"result.{r}.npz")) for r in range(world)]
    rngs = [np.random.default_rng(r) for r in range(world)]
    for n in (10, 50_000):  # one round, then reduce-scatter + all-gather
        drawn = [rng.standard_normal(n).astype(np.float32) for rng in rngs]
        expected = drawn[0] + drawn[1] + drawn[2]  # float32, in rank order
        for r in range(world):
            assert results[r][f"sum_{n}"].tobytes() == expected.tobytes(), (n, r)
    metrics = sum(rng.integers(0, 1 << 40, 100_000) for rng in rngs)
    dense = [rng.standard_normal(30_000) for rng in rngs]
    for r, got in enumerate(results):
        assert got["max"].tolist() == [2, 0, 7] and got["min"].tolist() == [0, -2, 7]
        assert np.array_equal(got["metrics_sum"], metrics)
        assert got["dense_sum"].tobytes() == ((dense[0] + dense[1]) + dense[2]).tobytes()
        assert got["broadcast"].tolist() == [2] * 5
        assert got["param_broadcast"].tolist() == [1.0] * 3
        high = np.uint64(1) << np.uint64(63)
        rows = [(np.arange(q * 10, dtype=np.uint64) + high).reshape(-1, 2) for q in range(world)]
        assert np.array_equal(got["gathered"], np.concatenate(rows))
        assert got["gathered"].dtype == np.uint64
        counts = [(q + r) % 3 for q in range(world)]  # what worker q sends here
        assert got["all_to_all_counts"].tolist() == counts
        assert got["all_to_all"].tolist() == sum(
            ([r + 10 * q] * c for q, c in enumerate(counts)), []
        )
        assert np.array_equal(got["gather_rows"], np.concatenate(
            [np.full((q, 3), q, np.int64) for q in range(world)]))  # fmt: skip
        assert got["p2p"].tolist() == [q if q != r else -1 for q in range(world)]
        assert got["objects"].tolist() == list(range(world))
        assert int(got["counts_all_reduce"]) == 1  # collectives.all_reduce_sum was counted


def test_a_worker_with_another_jobs_keys_cannot_join(tmp_path, keys):
    other = tmp_path / "other"
    write_job_keys(other)
    codes, output = _run("join", 2, keys, tmp_path / "out", group_keys={1: other})
    assert codes == [0, 0], output[-4000:]
    for rank in (0, 1):
        error = _record(tmp_path / "out", rank).get("error", "")
        assert error.startswith("GroupError"), (rank, error)
        assert "refused the key" in error and "same job keys" in error, error


def test_a_group_formed_from_the_environment_is_the_secure_one(phases):
    """An online job's regroup calls ``init_process_group(worker_backend(), ...)`` with no
    options: the keys and the interface come from the worker's SPARSEPS_* variables."""
    for rank in range(3):
        record = phases.record(rank, "environ")
        assert record == {"backend": "sparseps_curve", "sum": [6]}, record


@pytest.mark.parametrize("mode", ["crash", "leave"])
def test_a_worker_that_dies_or_leaves_fails_the_others_at_once(phases, mode):
    record = phases.record(0, mode)
    assert record["error"].startswith("UnavailableError"), record
    assert "rank 1 left the group" in record["error"], record
    # the collective's own limit is 120 s: the peer's death is noticed, not waited out
    limit = GONE_GRACE_S + 10 if mode == "crash" else 10
    assert record["waited_s"] < limit, record
    # rank 1 died by the crash (the last phase), the others exited cleanly after theirs
    assert phases.codes == [0, 3, 0], phases.output[-4000:]


def test_a_collective_a_worker_never_joins_is_a_named_deadline(phases):
    record = phases.record(0, "late")
    assert record["error"].startswith("DeadlineError"), record
    assert "Strategy.collective_timeout" in record["error"], record
    assert 1.8 <= record["error_s"] < 10, record
    # afterwards the group is unusable, at once, and says since when
    assert record["after"].startswith("UnavailableError"), record
    assert "ran past its 2 s limit" in record["after"], record
    assert record["after_s"] - record["error_s"] < 1.0, record
