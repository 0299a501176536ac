"""Work stealing with leases (issue 23): a worker killed mid-pass hands its claimed,
unfinished file to the others.

Real processes (spawned: a fork of this process, whose torch/zmq threads hold locks, once
hung a child) claim files of one pass from a real store (the job's zmq store server, on
loopback). Worker 2 is SIGKILLed two batches into its second file; the survivors wait,
see its heartbeat stop for ``lease_s``, and one of them reads that file from its start.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from sparseps.data.schema import ID_FILE_SHIFT
from sparseps.errors import ConfigError

pytestmark = pytest.mark.timeout(120)

FILES, ROWS, BATCH = 12, 40, 8  # 5 batches a file
KILL_AFTER = 7  # batches: all 5 of the victim's first file, 2 of its second
LEASE_S = 1.0


def _line(n: int) -> str:
    dense = "\t".join(str((n * 7 + i) % 13) for i in range(13))
    cats = "\t".join(f"{(n * 31 + i * 17) % 97:x}" for i in range(26))
    return f"{n % 2}\t{dense}\t{cats}"


def _write(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        text = "\n".join(_line(f * ROWS + i) for i in range(ROWS)) + "\n"
        (folder / f"part-{f:03d}.tsv").write_text(text)
    return folder


def _worker(address: str, folder: str, out: str, rank: int, pause: float, kill: int) -> None:
    """Read the pass, logging each batch's rows per file (flushed, so a kill keeps them).

    The survivors hold after their first batch until the victim has its second file: on a
    loaded box the victim's process could start so late that the survivors read every file
    first and the victim never reached its kill (it then exited 0)."""
    import time
    from datetime import timedelta

    from sparseps.data import CRITEO, QueueDataset
    from sparseps.store.client import StoreClient

    store = StoreClient(address, timeout_s=30, setting="test")
    store.wait(["go"])
    ds = QueueDataset(folder, CRITEO, batch_size=BATCH, rank=rank, world=3, split="steal",
                      store=store, lease_s=LEASE_S)  # fmt: skip
    with open(out, "w") as log:
        for n, batch in enumerate(ds, 1):
            files, rows = np.unique(batch.ids >> np.int64(ID_FILE_SHIFT), return_counts=True)
            log.write(
                json.dumps({"rows": dict(zip(files.tolist(), rows.tolist(), strict=True))}) + "\n"
            )
            log.flush()
            if kill and n == kill - 1:  # the first batch of its second file: claimed
                store.set("victim-has-its-second-file", "1")
            if n == kill:
                os.kill(os.getpid(), signal.SIGKILL)
            if not kill and n == 1:
                store.wait(["victim-has-its-second-file"], timedelta(seconds=90))
            time.sleep(pause)
        log.write(json.dumps({"taken_over": ds._share.taken_over}) + "\n")
    store.close()


def _rows(path: Path) -> tuple[dict[int, int], list[int]]:
    rows: dict[int, int] = {}
    taken: list[int] = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        for f, n in entry.get("rows", {}).items():
            rows[int(f)] = rows.get(int(f), 0) + n
        taken += entry.get("taken_over", [])
    return rows, taken


def test_killed_workers_unfinished_file_is_read_by_another(tmp_path):
    from sparseps.store.client import StoreClient, StoreServer

    folder = _write(tmp_path / "data")
    server = StoreServer("127.0.0.1", 0)
    store = StoreClient(server.address, timeout_s=30, setting="test")
    ctx = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"worker-{r}.jsonl" for r in range(3)]
    pauses, kills = [0.02, 0.02, 0.05], [0, 0, KILL_AFTER]
    procs = [
        ctx.Process(
            target=_worker, args=(server.address, str(folder), str(outs[r]), r, pauses[r], kills[r])
        )  # fmt: skip
        for r in range(3)
    ]
    try:
        for p in procs:
            p.start()
        store.set("go", "1")
        for p in procs:
            p.join(90)
        assert [p.exitcode for p in procs] == [0, 0, -signal.SIGKILL]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        store.close()
        server.close()

    victim, _ = _rows(outs[2])
    survivors = [_rows(outs[r]) for r in range(2)]
    # the victim handed out its first file whole and had 2 batches of its second
    handed = [f for f, n in victim.items() if n == ROWS]
    partial = [f for f, n in victim.items() if n < ROWS]
    assert len(handed) == 1 and len(partial) == 1 and victim[partial[0]] == 2 * BATCH
    # one survivor took the partial file over and read it from its start
    taken = [f for _, t in survivors for f in t]
    assert taken == partial
    read = [rows for rows, _ in survivors]
    for f in range(FILES):
        by_survivors = sum(r.get(f, 0) for r in read)
        assert sum(f in r for r in read) <= 1  # one reader per file
        # every file read once by a survivor, but the one the victim handed out whole
        assert by_survivors == (0 if f in handed else ROWS), (f, by_survivors)
    # at-least-once for the partial file's rows: 2 batches by the victim, all by a survivor
    assert victim[partial[0]] + sum(r.get(partial[0], 0) for r in read) == ROWS + 2 * BATCH


def test_lease_is_checked():
    from sparseps.data.steal import Lease

    for bad in (0, -1.0):
        with pytest.raises(ConfigError, match="lease_s"):
            Lease(bad)


def test_steal_key_shares_a_queue_whatever_was_built_before(tmp_path):
    """Datasets named by ``steal_key`` share their file queue even when the workers built
    a different number of stealing datasets before (a worker that joined later)."""
    import threading

    import torch.distributed as dist

    from sparseps.data import CRITEO, QueueDataset

    folder = _write(tmp_path / "data")
    store = dist.HashStore()
    QueueDataset(str(folder), CRITEO, batch_size=BATCH, rank=1, world=2, split="steal",
                 store=store)  # fmt: skip  # built by worker 1 only: the counts differ
    got: list[dict[int, int]] = [{}, {}]

    def read(rank: int) -> None:
        ds = QueueDataset(str(folder), CRITEO, batch_size=BATCH, rank=rank, world=2,
                          split="steal", store=store, steal_key="online/7/v1")  # fmt: skip
        for batch in ds:
            for f, n in zip(*np.unique(batch.ids >> np.int64(ID_FILE_SHIFT), return_counts=True),
                            strict=True):  # fmt: skip
                got[rank][int(f)] = got[rank].get(int(f), 0) + int(n)

    threads = [threading.Thread(target=read, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not set(got[0]) & set(got[1])  # no file read twice
    assert sorted([*got[0], *got[1]]) == list(range(FILES))
    assert all(n == ROWS for g in got for n in g.values())
