"""Live migration (issue 23): a job grows from 2 to 3 servers and back to 2 while a thread
keeps pushing; afterwards every row (embedding, optimizer state, counters) equals an
in-process oracle that applied the same pushes, each row lives on its owner only, and the
longest wait between two completed pushes stays under a stated bound."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from sparseps.config import Lifecycle, TableConfig
from sparseps.core.placement import Placement, rebalance
from sparseps.elastic import ElasticClient, MoveRaceError, install_placement, migrate, scale
from sparseps.elastic.migrate import STEPS
from sparseps.elastic.peers import Peers
from sparseps.elastic.server_moves import ROW_BUFS
from sparseps.errors import DeadlineError, ProtocolError, RemoteError, UnavailableError
from sparseps.optim import Adagrad
from sparseps.table import SparseTable
from sparseps.testing import LocalCluster, local_cluster, wait_until

DIM = 4
VSHARDS = 256
POOL = np.arange(1, 4001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
# the longest a push may wait across a cut-over (measured: tens of ms on a loaded box)
GAP_BOUND_S = 10.0


def _config() -> TableConfig:
    return TableConfig(name="emb", dim=DIM, rule=Adagrad(lr=0.1))


def _batch(step: int):
    rng = np.random.default_rng(step)
    keys = rng.choice(POOL, size=300)  # duplicates on purpose: the client merges them
    grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
    clicks = (rng.random(len(keys)) < 0.1).astype(np.float32)
    return keys, grads, clicks


def _rows_of(peers: Peers, endpoint: str) -> dict[str, np.ndarray]:
    result, bufs = peers.call(
        endpoint, "move_export", "emb", [np.arange(VSHARDS)], {"dirty": False}
    )
    return dict(zip(ROW_BUFS, bufs[: len(ROW_BUFS)], strict=True))


def _sorted(columns: dict) -> dict:
    order = np.argsort(columns["key"])
    return {name: np.asarray(columns[name])[order] for name in ROW_BUFS}


def _assert_rows_equal(peers: Peers, endpoints: list[str], want: dict) -> None:
    """Every row of every server equals ``want`` (bit for bit), each on its owner only."""
    placement = peers.placement(endpoints[0])[0]
    found = [_rows_of(peers, endpoint) for endpoint in endpoints]
    for rank, rows in enumerate(found):
        assert (placement.owner_of(rows["key"]) == rank).all(), f"server {rank}: foreign rows"
    got = _sorted({n: np.concatenate([f[n] for f in found]) for n in ROW_BUFS})
    want = _sorted(want)
    for name in ROW_BUFS:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@dataclasses.dataclass
class _Job:
    """Local servers with a placement installed, the Peers that migrate their shards, and
    the in-process oracle of their table."""

    cluster: LocalCluster
    endpoints: list[str]
    peers: Peers
    placement: Placement  # the one installed at the start
    oracle: SparseTable

    def push(self, client: ElasticClient, seed: int) -> None:
        """``_batch(seed)`` through ``client`` (acknowledged), then into the oracle."""
        keys, grads, clicks = _batch(seed)
        client.push("emb", keys, grads, clicks=clicks).wait()
        self.oracle.push(keys, grads, clicks=clicks)


@contextlib.contextmanager
def _elastic_job(
    config: TableConfig, *, servers: int, ranks: list[int], environ: dict | None = None
) -> Iterator[_Job]:
    """``servers`` local servers, the default placement over ``ranks`` installed; the
    oracle keeps every row in memory (a tiered table's values are the same)."""
    oracle = SparseTable(dataclasses.replace(config, memory_rows=None))
    with local_cluster(servers=servers, timeout=30, environ=environ) as cluster:
        endpoints = list(cluster.endpoints)
        peers = Peers(timeout=30)
        try:
            placement = Placement.default(endpoints, VSHARDS, ranks=ranks)
            install_placement(peers, placement)
            yield _Job(cluster, endpoints, peers, placement, oracle)
        finally:
            peers.close()


class _Pusher(threading.Thread):
    """Pushes batch after batch through an elastic client, and into the oracle once acked."""

    def __init__(self, client: ElasticClient, oracle: SparseTable) -> None:
        super().__init__(daemon=True)
        self.client, self.oracle = client, oracle
        self.stop_at = 10**9
        self.done: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            step = 0
            while step < self.stop_at:
                keys, grads, clicks = _batch(step)
                self.client.push("emb", keys, grads, clicks=clicks).wait()
                self.oracle.push(keys, grads, clicks=clicks)
                self.done.append(time.monotonic())
                step += 1
        except BaseException as exc:  # re-raised by the test
            self.error = exc

    def wait_steps(self, count: int, timeout: float = 60.0) -> None:
        target = len(self.done) + count
        moved = lambda: len(self.done) >= target or self.error is not None  # noqa: E731
        wait_until(moved, timeout, f"pushes to pass {target} (stalled at {len(self.done)})")
        assert self.error is None, self.error
        assert len(self.done) >= target, f"pushes stalled at {len(self.done)}"


@pytest.mark.parametrize("tiered", [False, True], ids=["in-memory", "tiered"])
def test_grow_2_to_3_and_back_mid_training_rows_equal_the_oracle(tmp_path, tiered):
    # tiered: 300 of each server's ~1300-2000 rows in memory, the rest on its disk; the
    # dirty rounds of a move read their few rows where they are (restore.export_keys)
    config = dataclasses.replace(_config(), memory_rows=300) if tiered else _config()
    environ = {"SPARSEPS_DISK_DIR": str(tmp_path)} if tiered else None
    with _elastic_job(config, servers=3, ranks=[0, 1], environ=environ) as job:
        endpoints, peers, oracle = job.endpoints, job.peers, job.oracle
        with ElasticClient(endpoints[:2]) as client:
            client.create_table(config)
            pusher = _Pusher(client, oracle)
            pusher.start()
            try:
                pusher.wait_steps(10)
                t0 = time.monotonic()
                grown = scale(peers, endpoints, [0, 1, 2])
                pusher.wait_steps(10)
                middle = {r: len(_rows_of(peers, endpoints[r])["key"]) for r in range(3)}
                # every pre-copy round runs (none settles): rows copied 4 times
                shrunk = scale(peers, endpoints, [0, 1], settle_rows=0, max_rounds=3)
                t1 = time.monotonic()
                pusher.wait_steps(10)
            finally:
                pusher.stop_at = 0
                pusher.join(60)
            assert pusher.error is None, pusher.error
            done = np.array(pusher.done)
            window = done[(done >= t0) & (done <= t1 + GAP_BOUND_S)]
            gap = float(np.max(np.diff(np.concatenate([[t0], window])))) if len(window) else t1 - t0
            print(f"\nelastic: grow {grown}\nelastic: shrink {shrunk}\n"
                  f"elastic: {len(done)} pushes, longest gap during migration {gap * 1000:.1f} ms, "
                  f"client placement refreshes {client.refreshes}")  # fmt: skip
            assert gap < GAP_BOUND_S
            assert grown.vshards_moved == shrunk.vshards_moved == VSHARDS // 3
            assert middle[2] > 0 and middle[0] > 0 and middle[1] > 0  # the new server took rows
            assert client.placement.version == 3
            np.testing.assert_array_equal(client.pull("emb", POOL).wait(), oracle.pull(POOL))
        assert len(_rows_of(peers, endpoints[2])["key"]) == 0  # drained
        _assert_rows_equal(peers, endpoints, oracle.export_rows())
        # the drained server can go: the job goes on without it
        peers.call(endpoints[2], "stop")
        job.cluster.processes[2].wait(30)
        with ElasticClient(endpoints[:2]) as client:  # the placement no longer names server 2
            job.push(client, 10**6)
            np.testing.assert_array_equal(client.pull("emb", POOL).wait(), oracle.pull(POOL))


# -- table-wide ops during a move, and a driver that dies mid-move ---------------------------


def _lifecycle_config() -> TableConfig:
    # decay halves show/click; shrink deletes rows seen about once without a click
    return TableConfig(name="emb", dim=DIM, rule=Adagrad(lr=0.1),
                       lifecycle=Lifecycle(decay_rate=0.5, shrink_score=0.2))  # fmt: skip


def _wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    wait_until(predicate, timeout, what, interval=0.005)


class _Paused:
    """``on_step`` of a migration that stops at one step until released (bounded)."""

    def __init__(self, step: str, then=None) -> None:
        self.step, self.then = step, then
        self.reached, self.go = threading.Event(), threading.Event()

    def __call__(self, name: str) -> None:
        if name == self.step:
            self.reached.set()
            assert self.go.wait(60), f"migration paused at {name} was never released"
        if self.then is not None:
            self.then(name)


def _in_thread(target) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(("ok", target()))
        except BaseException as exc:  # re-raised by the test
            out.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _result(thread: threading.Thread, out: list):
    thread.join(60)
    assert out, "the thread did not finish"
    kind, value = out[0]
    if kind == "error":
        raise value
    return value


def test_decay_shrink_and_save_while_shards_move_equal_the_oracle(tmp_path):
    """A decay issued after the first copy and a shrink issued at the freeze wait for the
    move (the servers in it refuse them) and then apply once to every row; a save taken
    between the bump and the drop (the sources still hold the moved rows) holds each row
    once and loads back equal."""
    with _elastic_job(_lifecycle_config(), servers=3, ranks=[0, 1]) as job:
        endpoints, peers, oracle = job.endpoints, job.peers, job.oracle
        with ElasticClient(endpoints[:2], retry_for=60) as client:
            client.create_table(_lifecycle_config())
            for step in range(12):
                job.push(client, step)
            saved: dict = {}

            def save_at_bump(name: str) -> None:
                if name == "bump":  # sources still hold the moved rows (no drop yet)
                    _result(*decayed)
                    with ElasticClient(endpoints[:2]) as other:
                        saved["files"] = other.save("emb", tmp_path / "ckpt")
                    saved["rows"] = oracle.export_rows()

            # grow 2 -> 3: decay while server 2 holds copies of rows 0 and 1 still own
            paused = _Paused("copy", then=save_at_bump)
            grow = _in_thread(lambda: scale(peers, endpoints, [0, 1, 2], on_step=paused))
            assert paused.reached.wait(60)
            job.push(client, 100)  # lands at the sources, copied as dirty
            waits = client.move_waits

            def decay():
                client.decay("emb")
                oracle.decay()

            decayed = _in_thread(decay)
            _wait_for(lambda: client.move_waits > waits, "the decay to be refused")
            paused.go.set()
            _result(*grow)
            assert "files" in saved
            _assert_rows_equal(peers, endpoints, oracle.export_rows())

            # shrink 3 -> 2: a shrink while the source is frozen
            paused = _Paused("freeze")
            back = _in_thread(lambda: scale(peers, endpoints, [0, 1], on_step=paused))
            assert paused.reached.wait(60)
            waits = client.move_waits
            shrunk = _in_thread(lambda: client.shrink("emb"))
            _wait_for(lambda: client.move_waits > waits, "the shrink to be refused")
            paused.go.set()
            _result(*back)
            deleted = _result(*shrunk)
            want_deleted = oracle.shrink()
            assert len(want_deleted) > 0
            np.testing.assert_array_equal(deleted, np.sort(want_deleted))
            _assert_rows_equal(peers, endpoints, oracle.export_rows())

            # the save made mid-move loads back to exactly its rows
            client.load("emb", saved["files"])
            _assert_rows_equal(peers, endpoints, saved["rows"])


def test_a_decay_sent_under_an_old_placement_is_refused_and_sent_again(monkeypatch):
    """A bump lands on the servers between the client's placement refresh and its send
    (as when a migration ends while a decay waits for it): the servers refuse the decay,
    whose placement version is not theirs, and get it again under the new placement, so
    the rows moved to the new server get it too. Applied under the old placement, the
    new server was never asked (rows without the decay) or, with a refusal in the same
    call, the client took it for a race with a move's start (a MoveRaceError in a
    clean-clone CI run)."""
    with _elastic_job(_lifecycle_config(), servers=3, ranks=[0, 1]) as job:
        endpoints, peers, oracle = job.endpoints, job.peers, job.oracle
        with ElasticClient(endpoints[:2], retry_for=60) as client:
            client.create_table(_lifecycle_config())
            for step in range(6):
                job.push(client, step)
            assert client.placement.version == job.placement.version
            scale(peers, endpoints, [0, 1, 2])  # the client sees none of it
            refresh, skipped = client.refresh_placement, []

            def stale_first(*args, **kwargs):  # the bump lands just after this refresh
                if not skipped:
                    skipped.append(client.placement.version)
                    return client.placement
                return refresh(*args, **kwargs)

            monkeypatch.setattr(client, "refresh_placement", stale_first)
            waits = client.move_waits
            client.decay("emb")
            oracle.decay()
            assert skipped == [job.placement.version]
            assert client.move_waits > waits  # refused once for its old version
            assert client.placement.version > job.placement.version
            _assert_rows_equal(peers, endpoints, oracle.export_rows())


class _Crash(Exception):
    pass


def _crash_after(step: str):
    def on_step(name: str) -> None:
        if name == step:
            raise _Crash(step)

    return on_step


def test_a_driver_stopped_after_each_step_is_completed_by_running_it_again():
    """The driver dies after each step in turn (grow and shrink alternately); a push and
    a decay issued meanwhile wait, running the migration again (``migrate`` with the same
    placement, or ``scale`` with the same ranks) completes it: rows equal the oracle, each
    on its owner, and no server keeps refusing (table-wide ops and pushes go through)."""
    with _elastic_job(_lifecycle_config(), servers=3, ranks=[0, 1]) as job:
        endpoints, peers, oracle = job.endpoints, job.peers, job.oracle
        with ElasticClient(endpoints[:2], retry_for=60) as client:
            client.create_table(_lifecycle_config())
            ranks = [0, 1]
            for index, step in enumerate(STEPS):
                job.push(client, 1000 + index)
                ranks = [0, 1] if len(ranks) == 3 else [0, 1, 2]
                new = rebalance(peers.newest(endpoints), ranks, endpoints)
                try:
                    migrate(peers, new, on_step=_crash_after(step))
                except _Crash:
                    pass
                else:
                    raise AssertionError(f"the driver was not stopped after {step}")
                keys, grads, clicks = _batch(2000 + index)  # may wait for a frozen shard
                pushed = _in_thread(
                    lambda k=keys, g=grads, c=clicks: client.push("emb", k, g, clicks=c).wait()
                )
                # the same call again: migrate, or scale with the same ranks
                report = scale(peers, endpoints, ranks) if index % 2 else migrate(peers, new)
                _result(*pushed)
                oracle.push(keys, grads, clicks=clicks)
                client.decay("emb", 0.9)
                oracle.decay(0.9)
                placement = peers.newest(endpoints)
                assert placement.live_ranks() == ranks, (step, placement.live_ranks())
                assert report.version >= new.version
                _assert_rows_equal(peers, endpoints, oracle.export_rows())
            np.testing.assert_array_equal(client.pull("emb", POOL).wait(), oracle.pull(POOL))


def _begin_receiving(peers: Peers, current: Placement, new: Placement) -> None:
    """What the driver does first: the destinations of ``current -> new`` start receiving."""
    for (_, dst), vshards in current.moves(new).items():
        peers.call(new.endpoints[dst], "move_begin", None, [vshards], {"receive": 1})


def test_a_table_wide_op_racing_the_start_of_a_move_is_redone_or_refused(tmp_path):
    """The destinations of a 3 -> 2 shrink already receive (they refuse) while the source
    has not begun (it applies): a save is sent again whole after the move and loads back
    equal (each row once); a decay raises MoveRaceError instead of applying twice."""
    with _elastic_job(_lifecycle_config(), servers=3, ranks=[0, 1, 2]) as job:
        endpoints, peers, oracle = job.endpoints, job.peers, job.oracle
        with ElasticClient(endpoints, retry_for=60) as client:
            client.create_table(_lifecycle_config())
            for step in range(6):
                job.push(client, step)
            for index, (op, done) in enumerate(
                [
                    ("save", lambda: client.save("emb", tmp_path / "ckpt")),
                    ("decay", lambda: client.decay("emb")),
                ]
            ):
                if index:
                    scale(peers, endpoints, [0, 1, 2])  # back to 3: shrink again
                current = peers.newest(endpoints)
                new = rebalance(current, [0, 1], endpoints)
                _begin_receiving(peers, current, new)
                waits = client.move_waits
                running = _in_thread(done)
                _wait_for(lambda w=waits: client.move_waits > w, f"the {op} to be refused")
                migrate(peers, new)
                if op == "save":
                    files = _result(*running)
                    assert sorted({f["rank"] for f in files}) == [0, 1]  # sent again
                    assert client.move_waits >= waits + 2
                    client.load("emb", files)
                    _assert_rows_equal(peers, endpoints, oracle.export_rows())
                else:
                    with pytest.raises(MoveRaceError, match="raced the start"):
                        _result(*running)


def test_a_move_that_never_ends_fails_table_wide_ops_in_time_and_bad_begins_are_refused():
    """A driver that died after the begin and is never re-run: a decay fails after the
    client's placement_retry_s with the setting named (the servers apply nothing); a
    receive-begin of shards the server owns, or with a malformed flag, is refused and the
    server lives on; re-running the migration then unblocks the decay."""
    with _elastic_job(_lifecycle_config(), servers=2, ranks=[0, 1]) as job:
        endpoints, peers = job.endpoints, job.peers
        current = job.placement
        with ElasticClient(endpoints, retry_for=0.5) as client:
            client.create_table(_lifecycle_config())
            new = rebalance(current, [0], endpoints)
            with pytest.raises(_Crash):
                migrate(peers, new, on_step=_crash_after("begin"))
            t0 = time.monotonic()
            with pytest.raises(DeadlineError, match=r"placement_retry_s"):
                client.decay("emb")
            assert time.monotonic() - t0 < 10
            owned = np.flatnonzero(current.owners == 0)[:3]
            with pytest.raises(RemoteError, match="still this server's"):
                peers.call(endpoints[0], "move_begin", None, [owned], {"receive": 1})
            with pytest.raises(ProtocolError, match="receive"):
                peers.call(endpoints[0], "move_begin", None, [owned], {"receive": "yes"})
            assert sorted(p["rank"] for p in client.ping()) == [0, 1]  # both live on
            migrate(peers, new)
            client.decay("emb")


# -- a server of the move dies ---------------------------------------------------------------

# How soon a move must fail once its destination's process is gone: the dropped connection
# is noticed at once (milliseconds); the Peers' timeout (30 s) is what a wait for the dead
# server used to cost.
DEATH_BOUND_S = 5.0


@pytest.mark.parametrize("killed_after", ["begin", "final_copy"])
def test_a_destination_killed_mid_move_fails_it_at_once_naming_that_server(killed_after):
    """A 2 -> 3 grow whose destination (server 2) is SIGKILLed after the begin (its next
    call is the copy's import) or after the final copy (the bump): the migration raises
    UnavailableError naming server 2 and its address, the step it stopped after, well
    within the Peers' 30 s timeout. The job goes on: a migration that leaves the dead
    server out completes (frozen shards are served again) and rows equal the oracle."""
    with _elastic_job(_config(), servers=3, ranks=[0, 1]) as job:
        endpoints, peers = job.endpoints, job.peers
        with ElasticClient(endpoints[:2]) as client:
            client.create_table(_config())
            job.push(client, 0)
            killed: list[float] = []

            def kill(name: str) -> None:
                if name == killed_after:
                    job.cluster.kill(2)
                    killed.append(time.monotonic())

            with pytest.raises(UnavailableError) as raised:
                migrate(peers, rebalance(job.placement, [0, 1, 2], endpoints), on_step=kill)
            took = time.monotonic() - killed[0]
            error = raised.value
            print(f"\nkilled after {killed_after}: failed {took * 1000:.1f} ms later: {error}")
            assert (error.rank, error.address) == (2, endpoints[2])
            assert f"server 2 at {endpoints[2]}" in str(error)
            assert f"after its step {killed_after!r}" in str(error)
            assert took < DEATH_BOUND_S < peers.timeout
            scale(peers, endpoints, [0, 1])  # the dead server is skipped at once (lost)
            job.push(client, 1)
            np.testing.assert_array_equal(client.pull("emb", POOL).wait(), job.oracle.pull(POOL))
