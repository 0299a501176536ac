"""Work stealing (``split="steal"``): files from a queue shared by the job, exactly once.

- the ticket queue hands every item to exactly one claimer, with threads and processes;
- stealing datasets played by threads read disjoint files covering the data, every row
  once, and a slow reader takes fewer files;
- a journaled pass cut short and run again reads only the files not finished;
- a launched job (real processes) with one worker 3x slower: it reads about a third of
  what a fast worker reads, and every row is trained exactly once.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist

from sparseps.data import CRITEO, InMemoryDataset, QueueDataset
from sparseps.data.schema import ID_FILE_SHIFT
from sparseps.data.steal import WorkQueue
from sparseps.errors import ConfigError
from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "steal_job.py"


def _line(n: int) -> str:
    dense = "\t".join(str((n * 7 + i) % 13) for i in range(13))
    cats = "\t".join(f"{(n * 31 + i * 17) % 97:x}" for i in range(26))
    return f"{n % 2}\t{dense}\t{cats}"


def _write(folder: Path, files: int, rows: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        text = "\n".join(_line(f * rows + i) for i in range(rows)) + "\n"
        (folder / f"part-{f:03d}.tsv").write_text(text)
    return folder


def _files_of(ids: np.ndarray) -> set[int]:
    return set(np.unique(ids >> ID_FILE_SHIFT).tolist())


# -- the ticket queue ----------------------------------------------------------------------


def test_queue_threads_claim_each_item_once():
    store, items, skip = dist.HashStore(), 400, frozenset({3, 7, 399})
    got: list[list[int]] = [[] for _ in range(8)]

    def claim(k: int) -> None:
        q = WorkQueue(store, "sparseps/steal/t/0", items, skip)
        while (item := q.claim()) is not None:
            got[k].append(item)

    threads = [threading.Thread(target=claim, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    claimed = [i for g in got for i in g]
    assert len(claimed) == len(set(claimed)) == items - len(skip)
    assert set(claimed) == set(range(items)) - skip
    # another pass (namespace) starts from its own counter
    assert WorkQueue(store, "sparseps/steal/t/1", items).claim() == 0


def _claim_in_process(port: int, items: int, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    store.wait(["go"])  # every process starts claiming at once
    q = WorkQueue(store, "sparseps/steal/p/0", items)
    mine = []
    while (item := q.claim()) is not None:
        mine.append(item)
    results.put(mine)


def test_queue_processes_claim_each_item_once():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    ctx = multiprocessing.get_context("spawn")  # fork copies locks held by this process's threads
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_claim_in_process, args=(store.port, 300, results)) for _ in range(3)
    ]
    for p in procs:
        p.start()
    store.set("go", "1")
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    claimed = [i for g in got for i in g]
    assert sorted(claimed) == list(range(300))  # none twice, none lost


# -- datasets played by threads ------------------------------------------------------------


def _run_workers(folder: Path, world: int, pause: list[float], store, *,
                 crash_after: list[int] | None = None, **kw) -> list[dict]:  # fmt: skip
    """Play ``world`` workers in threads; worker r "crashes" after training
    ``crash_after[r]`` batches (it has taken one more, never trained)."""
    out: list[dict] = [{} for _ in range(world)]
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            ds = QueueDataset(str(folder), CRITEO, batch_size=8, rank=rank, world=world,
                              split="steal", store=store, **kw)  # fmt: skip
            ids = []
            for batch in ds:
                if crash_after is not None and len(ids) == crash_after[rank]:
                    break
                ids.append(batch.ids.copy())
                time.sleep(pause[rank])
            out[rank] = {
                "files": ds.files,
                "ids": np.concatenate(ids) if ids else np.zeros(0, np.int64),
            }
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


def test_steal_threads_every_row_once_slow_reads_less(tmp_path):
    folder = _write(tmp_path / "data", files=12, rows=16)
    out = _run_workers(folder, 3, [0.03, 0.01, 0.01], dist.HashStore())
    ids = np.concatenate([o["ids"] for o in out])
    assert len(ids) == len(np.unique(ids)) == 12 * 16
    files = [set(o["files"]) for o in out]
    assert sum(len(f) for f in files) == 12 and set().union(*files) == {
        str(p) for p in folder.iterdir()
    }
    for o in out:  # the files a worker says it read are the files of its rows
        assert {Path(f).name for f in o["files"]} == {
            f"part-{n:03d}.tsv" for n in _files_of(o["ids"])
        }
    assert 0 < len(files[0]) < 0.75 * max(len(files[1]), len(files[2]))


def test_steal_without_store_reads_what_static_would(tmp_path):
    folder = _write(tmp_path / "data", files=5, rows=4)
    alone = QueueDataset(str(folder), CRITEO, batch_size=8, rank=0, world=1, split="steal")
    assert sum(len(b) for b in alone) == 20 and len(alone.files) == 5
    split = QueueDataset(str(folder), CRITEO, batch_size=8, rank=1, world=2, split="steal")
    assert _files_of(np.concatenate([b.ids for b in split])) == {1, 3}


def test_in_memory_dataset_steals_while_loading(tmp_path):
    folder = _write(tmp_path / "data", files=6, rows=10)
    store, loaded = dist.HashStore(), []
    for rank in range(2):
        ds = InMemoryDataset(str(folder), CRITEO, batch_size=8, rank=rank, world=2,
                             split="steal", store=store)  # fmt: skip
        ds.load_into_memory()
        loaded.append(ds)
    assert len(loaded[0]) == 60 and len(loaded[1]) == 0  # the first took every file
    with pytest.raises(ConfigError, match="journal"):
        InMemoryDataset(str(folder), CRITEO, batch_size=8, journal=tmp_path / "j")
    with pytest.raises(ConfigError, match="split"):
        QueueDataset(str(folder), CRITEO, batch_size=8, split="dynamic")


def test_each_pass_has_its_own_queue(tmp_path):
    folder = _write(tmp_path / "data", files=4, rows=4)
    store = dist.HashStore()
    a, b = (
        QueueDataset(str(folder), CRITEO, batch_size=8, rank=r, world=2, split="steal", store=store)
        for r in range(2)
    )
    assert sum(len(x) for x in a) == 16 and sum(len(x) for x in b) == 0  # a took pass 0
    assert sum(len(x) for x in b) == 16 and len(b.files) == 4  # b's pass 1: everything
    assert sum(len(x) for x in a) == 0 and a.files == []  # a's pass 1: nothing left


# -- resume ---------------------------------------------------------------------------------


def test_resumed_pass_reads_only_unfinished_files(tmp_path):
    folder = _write(tmp_path / "data", files=10, rows=8)  # one batch of 8 per file
    journal, store = tmp_path / "journal", dist.HashStore()
    store.set_timeout(timedelta(seconds=30))
    # worker 0 trains 3 batches (files), worker 1 two; each then "crashes" holding a file
    cut = _run_workers(folder, 2, [0, 0], store, crash_after=[3, 2], journal=journal)
    seen = [o["ids"] for o in cut]
    finished = {
        json.loads(line)["item"] for f in journal.iterdir() for line in f.read_text().splitlines()
    }
    assert finished == _files_of(np.concatenate(seen)) and len(finished) == 5
    # the job starts again (a fresh store): the pass is resumed, finished files skipped
    out = _run_workers(folder, 2, [0, 0], dist.HashStore(), journal=journal)
    again = np.concatenate([o["ids"] for o in out])
    assert len(again) == len(np.unique(again)) == 5 * 8
    assert _files_of(again) == set(range(10)) - finished
    # that pass is complete now: the next start is a new, full pass
    out = _run_workers(folder, 2, [0, 0], dist.HashStore(), journal=journal)
    assert len(np.concatenate([o["ids"] for o in out])) == 80


# -- a launched job ------------------------------------------------------------------------


def test_launched_slow_worker_reads_a_third(tmp_path):
    folder = _write(tmp_path / "train", files=24, rows=32)
    out = tmp_path / "out"
    out.mkdir()
    env = clean_environ()
    cmd = [sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1", "--worker-num",
           "3", "--log-dir", str(tmp_path / "log"), str(JOB), "--train", str(folder), "--out",
           str(out), "--journal", str(tmp_path / "journal"), "--slow-rank", "0", "--slow-factor",
           "5", "--pause-s", "0.06", "--batch-size", "8"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = [np.load(out / f"worker-{r}.npz") for r in range(3)]
    ids = np.concatenate([w["ids"] for w in workers])
    assert len(ids) == len(np.unique(ids)) == 24 * 32  # every row trained exactly once
    files = [set(w["files"].tolist()) for w in workers]
    assert sum(len(f) for f in files) == 24 and len(set().union(*files)) == 24
    for w, f in zip(workers, files, strict=True):
        assert {Path(p).name for p in f} == {f"part-{n:03d}.tsv" for n in _files_of(w["ids"])}
    slow, fast = len(files[0]), min(len(files[1]), len(files[2]))
    print(f"files read per worker: {[len(f) for f in files]}, rows: "
          f"{[len(w['ids']) for w in workers]}")  # fmt: skip
    assert 0 < slow < 0.6 * fast
    # the trainer reported every file finished: the journals hold each file once
    finished = [
        json.loads(line)["item"]
        for f in (tmp_path / "journal").iterdir()
        for line in f.read_text().splitlines()
    ]
    assert sorted(finished) == list(range(24))


class _Crash(Exception):
    pass


def test_trainer_reports_trained_files_and_resume_skips_them(tmp_path):
    """A Trainer (local mode) cut after 5 of 12 batches: files count as finished only once
    trained (the prefetcher has read past them: reading is not enough); the pass run
    again trains exactly the rows of the other files."""
    import torch

    import sparseps as sps
    from sparseps.models import WideDeep

    folder = _write(tmp_path / "data", files=6, rows=16)  # 2 batches of 8 per file
    journal = tmp_path / "journal"
    sps.init()
    try:
        torch.manual_seed(0)
        model = WideDeep(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(8,))
        trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode="async"))
        trained: list[np.ndarray] = []

        def on_batch(step, stats, crash_at=None):
            trained.append(np.asarray(step.batch.ids).copy())
            if len(trained) == crash_at:
                raise _Crash

        ds = QueueDataset(str(folder), CRITEO, batch_size=8, split="steal", journal=journal)
        with pytest.raises(_Crash):
            trainer.train_from_dataset(ds, print_period=0, on_batch=lambda s, t: on_batch(s, t, 5))
        finished = {
            json.loads(line)["item"]
            for line in (journal / "worker-0.jsonl").read_text().splitlines()
        }
        assert finished == {0, 1}  # file 2 was read and half trained: not finished
        trained.clear()
        again = QueueDataset(str(folder), CRITEO, batch_size=8, split="steal", journal=journal)
        trainer.train_from_dataset(again, print_period=0, on_batch=on_batch)
        rows = np.concatenate(trained)
        assert len(rows) == len(np.unique(rows)) == 4 * 16
        assert _files_of(rows) == {2, 3, 4, 5}
        trainer.stop()
    finally:
        sps.stop()
