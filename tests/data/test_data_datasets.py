"""QueueDataset / InMemoryDataset: file split, batching, passes, shuffles, preload."""

import time

import numpy as np
import pytest
import torch
import xxhash

from sparseps.cli import main
from sparseps.data import CRITEO, Batch, InMemoryDataset, QueueDataset, Schema, shard
from sparseps.data import sources as sources_module
from sparseps.data.schema import ID_FILE_SHIFT
from sparseps.errors import ConfigError, DeadlineError
from sparseps.testing import wait_until


def write_files(folder, rows_per_file: list[int]) -> list[str]:
    """Criteo TSV files whose row r of file f has label parity and C1 = 'f-r'."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for f, rows in enumerate(rows_per_file):
        lines = [
            "\t".join([str(r % 2), *[str(r)] * 13, f"{f}-{r}", *["ab"] * 25]) for r in range(rows)
        ]
        path = folder / f"part-{f:05d}.tsv"
        path.write_text("".join(line + "\n" for line in lines))
        paths.append(str(path))
    return paths


def c1(f: int, r: int) -> int:
    return xxhash.xxh64_intdigest(f"{f}-{r}".encode(), xxhash.xxh64_intdigest(b"C1", 0))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("num_files", [1, 2, 5, 6])
def test_every_file_is_read_by_exactly_one_worker(tmp_path, world, num_files):
    files = write_files(tmp_path / "d", [3 + f for f in range(num_files)])
    seen_files, seen_ids = [], []
    for rank in range(world):
        ds = QueueDataset(str(tmp_path / "d"), CRITEO, batch_size=4, rank=rank, world=world)
        seen_files += ds.files
        seen_ids += [i for b in ds for i in b.ids.tolist()]
        assert ds.stats().files == len(shard(files, rank, world))
    assert sorted(seen_files) == files  # each once, none missing (some workers may get none)
    want = [(f << ID_FILE_SHIFT) | r for f in range(num_files) for r in range(3 + f)]
    assert sorted(seen_ids) == want


def test_rank_and_world_come_from_the_environment(tmp_path, monkeypatch):
    files = write_files(tmp_path / "d", [2, 2, 2, 2, 2])
    env = {
        "SPARSEPS_ROLE": "worker", "SPARSEPS_RANK": "1", "SPARSEPS_SERVERS": "127.0.0.1:1",
        "SPARSEPS_WORKER_NUM": "2", "SPARSEPS_MASTER": "127.0.0.1:2", "SPARSEPS_LOG_DIR": "log",
        "SPARSEPS_JOB_ID": "t",
    }  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert QueueDataset(files, CRITEO, batch_size=4).files == files[1::2]
    monkeypatch.setenv("SPARSEPS_ROLE", "server")
    monkeypatch.setenv("SPARSEPS_RANK", "0")
    with pytest.raises(ConfigError, match="SPARSEPS_ROLE=server"):
        QueueDataset(files, CRITEO, batch_size=4)
    for key in env:
        monkeypatch.delenv(key)
    assert QueueDataset(files, CRITEO, batch_size=4).files == files  # local mode: 0 of 1


def test_folders_are_expanded_sorted_and_markers_skipped(tmp_path):
    files = write_files(tmp_path / "d", [1, 1, 1])
    (tmp_path / "d" / "_SUCCESS").write_text("")
    (tmp_path / "d" / ".hidden").write_text("junk")
    ds = QueueDataset([str(tmp_path / "d"), files[0]], CRITEO, batch_size=4)
    assert ds.files == files


@pytest.mark.parametrize("batch_size", [1, 5, 16, 1000])
@pytest.mark.parametrize("threads", [1, 2])
def test_batches_cover_every_sample_once_across_chunks(tmp_path, monkeypatch, batch_size, threads):
    monkeypatch.setattr(sources_module, "CHUNK_BYTES", 700)  # many chunks per file
    write_files(tmp_path / "d", [37, 0, 50])
    ds = QueueDataset(str(tmp_path / "d"), CRITEO, batch_size=batch_size, threads=threads)
    batches = list(ds)
    assert all(len(b) == batch_size for b in batches[:-1]) and 0 < len(batches[-1]) <= batch_size
    whole = Batch.concat(batches)
    whole.validate(CRITEO)
    order = np.argsort(whole.ids)
    ids = whole.ids[order]
    files, rows = ids >> ID_FILE_SHIFT, ids & ((1 << ID_FILE_SHIFT) - 1)
    assert ids.tolist() == [
        (f << ID_FILE_SHIFT) | r for f, n in ((0, 37), (2, 50)) for r in range(n)
    ]
    np.testing.assert_array_equal(whole.label[order], rows % 2)
    np.testing.assert_allclose(whole.dense[order, 3], np.log1p(rows), rtol=1e-6)
    c1_values = whole.slots["C1"].take(order).values
    assert c1_values.tolist() == [c1(int(f), int(r)) for f, r in zip(files, rows, strict=True)]
    if threads == 1:  # one reader: file and line order
        assert whole.ids.tolist() == ids.tolist()
    dropped = list(QueueDataset(str(tmp_path / "d"), CRITEO, batch_size=batch_size, drop_last=True))
    assert sum(len(b) for b in dropped) == 87 // batch_size * batch_size


def test_iterating_again_is_a_new_pass_and_an_early_stop_does_not_hang(tmp_path, monkeypatch):
    monkeypatch.setattr(sources_module, "CHUNK_BYTES", 300)
    write_files(tmp_path / "d", [100, 100, 100])
    ds = QueueDataset(str(tmp_path / "d"), CRITEO, batch_size=10, threads=2, queue_size=1)
    start = time.monotonic()
    for i, _ in enumerate(ds):
        if i == 2:
            break  # readers are blocked on the full queue; closing must release them
    assert time.monotonic() - start < 10
    assert sum(len(b) for b in ds) == 300
    assert len(ds.stats().passes) == 2 and ds.stats().passes[1].rows == 300


@pytest.mark.parametrize(("threads", "queue_size"), [(1, 1), (2, 3)])
def test_a_stalled_consumer_leaves_a_bounded_number_of_chunks_buffered(
    tmp_path, monkeypatch, threads, queue_size
):
    from sparseps.data import dataset as dataset_module

    monkeypatch.setattr(sources_module, "CHUNK_BYTES", 300)  # ~100 chunks in all
    write_files(tmp_path / "d", [100, 100, 100])
    parsed = []  # rows of every chunk the readers have parsed so far
    real = dataset_module.read_file

    def counting(*args, **kwargs):
        for chunk in real(*args, **kwargs):
            parsed.append(len(chunk.batch))
            yield chunk

    monkeypatch.setattr(dataset_module, "read_file", counting)
    ds = QueueDataset(
        str(tmp_path / "d"), CRITEO, batch_size=1, threads=threads, queue_size=queue_size
    )
    batches = iter(ds)
    first = next(batches)  # the consumer holds one chunk, then stalls
    # the queue's chunks, plus one chunk per reader blocked in put(), plus the one held
    bound = queue_size + threads + 1
    wait_until(lambda: len(parsed) >= bound, 10, f"the readers to fill the buffer ({bound} chunks)")
    # what is tested is that nothing more happens: no event marks an absence, so the
    # consumer stays stalled well past the time it took to fill the buffer
    time.sleep(0.5)
    assert len(parsed) == bound, parsed
    rest = sum(len(b) for b in batches)  # resuming delivers every sample exactly once
    assert len(first) + rest == 300 == sum(parsed) and len(parsed) > 3 * bound


def test_batch_fields_go_to_torch_without_copies(tmp_path):
    write_files(tmp_path / "d", [20])
    batch = next(iter(QueueDataset(str(tmp_path / "d"), CRITEO, batch_size=8)))
    for array in (batch.label, batch.dense, batch.slots["C1"].offsets):
        assert torch.from_numpy(array).data_ptr() == array.ctypes.data
    values = batch.slots["C1"].values
    assert torch.from_numpy(values.view(np.int64)).data_ptr() == values.ctypes.data
    assert len(batch) == 8 and batch.dense.shape == (8, 13)


def test_in_memory_load_shuffle_iterate_release(tmp_path):
    write_files(tmp_path / "d", [30, 25])
    ds = InMemoryDataset(str(tmp_path / "d"), CRITEO, batch_size=16)
    with pytest.raises(ConfigError, match="load_into_memory"):
        list(ds)
    ds.load_into_memory()
    assert len(ds) == 55
    before = Batch.concat(list(ds))
    ds.local_shuffle(seed=3)
    after = Batch.concat(list(ds))
    assert [len(b) for b in ds] == [16, 16, 16, 7]
    assert not np.array_equal(after.ids, before.ids)
    assert sorted(after.ids.tolist()) == sorted(before.ids.tolist())
    # samples move whole: label, dense and ids stay together
    where = {int(i): k for k, i in enumerate(before.ids)}
    rows = np.array([where[int(i)] for i in after.ids])
    np.testing.assert_array_equal(after.label, before.label[rows])
    np.testing.assert_array_equal(after.dense, before.dense[rows])
    assert after.slots["C1"].values.tolist() == before.slots["C1"].take(rows).values.tolist()
    again = InMemoryDataset(str(tmp_path / "d"), CRITEO, batch_size=16)
    again.load_into_memory()
    again.local_shuffle(seed=3)
    np.testing.assert_array_equal(Batch.concat(list(again)).ids, after.ids)  # seeded
    ds.global_shuffle(seed=1)  # no process group: a local shuffle
    assert sorted(Batch.concat(list(ds)).ids.tolist()) == sorted(before.ids.tolist())
    ds.release_memory()
    assert len(ds) == 0


def test_preload_overlaps_with_other_work(tmp_path):
    # a converter that takes a while per file (like a real pipe_command reading remote
    # storage): a load takes at least its pipe_s whatever the machine's load, a floor that
    # shows the overlap without comparing two timed loads (which a loaded box may slow
    # unevenly)
    pipe_s = 1.0
    folder = tmp_path / "d"
    folder.mkdir()
    for f in range(2):
        (folder / f"part-{f}").write_text("".join(f"click:{r % 2} 1:{r}\n" for r in range(500)))
    schema = Schema("click", (), ("1",))
    ds = InMemoryDataset(str(folder), schema, 64, pipe_command=f"sleep {pipe_s}; cat")
    ds.load_into_memory()  # compile (or load the cached) kernels outside the timing
    ds.release_memory()
    start = time.perf_counter()
    ds.preload_into_memory()
    started_s = time.perf_counter() - start
    time.sleep(2 * pipe_s)  # the main thread's other work (e.g. training on the previous day)
    start = time.perf_counter()
    ds.wait_preload_done(timeout=60)
    waited_s = time.perf_counter() - start
    assert len(ds) == 1000
    # a load inside the preload call, or one that only began at the wait, would spend at
    # least pipe_s there; the background load had the other work's 2 x pipe_s to finish
    # in (room for a loaded box)
    assert started_s < pipe_s and waited_s < pipe_s, (started_s, waited_s)


def test_wait_preload_done_times_out(tmp_path, monkeypatch):
    write_files(tmp_path / "d", [10])
    ds = InMemoryDataset(str(tmp_path / "d"), CRITEO, batch_size=4)
    real = ds.load_into_memory
    # a load that takes 1 s: the deadline under test passes while it runs
    monkeypatch.setattr(ds, "load_into_memory", lambda: (time.sleep(1.0), real()))
    ds.preload_into_memory()
    with pytest.raises(DeadlineError, match="preload_into_memory"):
        ds.wait_preload_done(timeout=0.05)
    ds.wait_preload_done(timeout=30)
    assert len(ds) == 10


def test_global_shuffle_across_two_worker_processes(global_shuffles):
    results = global_shuffles["plain"]  # files 300, 200, 250, 150 (see conftest.py)
    assert [int(r["before"]) for r in results] == [550, 350]
    all_ids = np.concatenate([r["ids"] for r in results])
    want = [(f << ID_FILE_SHIFT) | r for f, n in enumerate([300, 200, 250, 150]) for r in range(n)]
    assert sorted(all_ids.tolist()) == want  # the same multiset of samples, none lost or doubled
    for rank, r in enumerate(results):
        origin = (r["ids"] >> ID_FILE_SHIFT) % 2  # the worker that read the sample's file
        assert (origin == rank).sum() > 50 and (origin != rank).sum() > 50  # mixed both ways
        rows = r["ids"] & ((1 << ID_FILE_SHIFT) - 1)
        np.testing.assert_array_equal(r["labels"], rows % 2)  # content travelled with the id
        files = r["ids"] >> ID_FILE_SHIFT
        assert r["c1"].tolist() == [c1(int(f), int(k)) for f, k in zip(files, rows, strict=True)]


def test_bad_arguments_name_the_field(tmp_path):
    files = write_files(tmp_path / "d", [1])
    cases = [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=4, threads=0), "threads"),
        (dict(batch_size=4, queue_size=True), "queue_size"),
        (dict(batch_size=4, format="xml"), "format='xml'"),
        (dict(batch_size=4, rank=2, world=2), "rank=2, world=2"),
        (dict(batch_size=4, rank=0), "both rank and world"),
        (dict(batch_size=4, pipe_command="cat", format="parquet"), "parquet"),
    ]
    for kwargs, text in cases:
        with pytest.raises(ConfigError, match=text):
            QueueDataset(files, CRITEO, **kwargs)
    with pytest.raises(ConfigError, match="schema"):
        QueueDataset(files, "criteo", batch_size=4)
    with pytest.raises(ConfigError, match="repeated: C1"):
        Schema("label", ("I1",), ("C1", "C1"))
    with pytest.raises(ConfigError, match="dense_transform"):
        Schema("label", ("I1",), ("C1",), dense_transform="sqrt")
    assert main(["gen-data", "--rows", "10", "--out", str(tmp_path / "g"), "--files", "0"]) == 1
