"""``MappedTable`` (a base's rows read from its memory-mapped Arrow files, deltas in
memory over them) against ``EmbeddingTable`` (every row copied into memory, the
predictor before issue 60) as the oracle: the same lookups, bit for bit, through random
upserts and deletes, over several files, with the index built in memory and shared
through files by two tables as two processes would."""

from __future__ import annotations

import numpy as np

from sparseps.checkpoint.mapped_table import MappedTable, RowIndex
from sparseps.checkpoint.predictor import EmbeddingTable
from sparseps.config import TableConfig
from sparseps.files import shards


def base_files(tmp_path, config, rng, files=3, rows=500):
    paths, columns, oracle = [], [], EmbeddingTable.empty(config)
    # distinct keys 1 + 997 k under 2**40, drawn as indices k: the keys (and the rng's state)
    # of choosing from np.arange(1, 1 << 40, 997), without filling its 8.8 GB (20-48 s)
    drawn = rng.choice(len(range(1, 1 << 40, 997)), files * rows, replace=False)
    keys = (1 + 997 * drawn).astype(np.uint64)
    for i in range(files):
        mine = keys[i * rows : (i + 1) * rows]
        embedding = rng.normal(size=(rows, config.pull_dim)).astype(np.float32)
        name = f"t.base-{i:05d}-of-{files:05d}.arrow"
        shards.write_shard(tmp_path, name, {"key": mine, "embedding": embedding}, {"kind": "base"})
        paths.append(tmp_path / name)
        columns.append(shards.read_shard(tmp_path / name, copy=False)[1])
        oracle = oracle.upsert(mine, embedding)
    return paths, columns, oracle, keys


def test_mapped_lookups_equal_the_in_memory_table(tmp_path):
    rng = np.random.default_rng(11)
    config = TableConfig(name="t", dim=4)
    paths, columns, oracle, keys = base_files(tmp_path, config, rng)
    shared = [
        MappedTable.of_files(
            config, paths, columns, RowIndex.shared([c["key"] for c in columns], tmp_path, "i")
        )
        for _ in range(2)  # the second maps the index the first wrote
    ]
    assert shared[0].index.files == shared[1].index.files and shared[0].index.files
    tables = [MappedTable.of_files(config, paths, columns, None), *shared]
    for table in tables:
        assert table.index.where.dtype == np.int64
        assert not table.parts[0].flags.writeable  # a read-only map of the file
    unknown = rng.integers(1 << 41, 1 << 42, 200, dtype=np.uint64)
    for step in range(12):
        asked = np.concatenate([rng.choice(keys, 300), unknown[:50], rng.choice(unknown, 20)])
        expected = oracle.lookup(asked)
        for table in tables:
            np.testing.assert_array_equal(table.lookup(asked), expected)
            np.testing.assert_array_equal(table.keys, oracle.keys)
            assert table.row_count == oracle.row_count == oracle.keys.size
        changed = np.concatenate([rng.choice(keys, 40), rng.choice(unknown, 10)])
        if step % 3 == 2:
            oracle = oracle.delete(changed)
            tables = [t.delete(changed) for t in tables]
        else:
            rows = rng.normal(size=(changed.size, config.pull_dim)).astype(np.float32)
            oracle = oracle.upsert(changed, rows)
            tables = [t.upsert(changed, rows) for t in tables]
    assert tables[0].nbytes == tables[1].nbytes > 0


def test_a_key_in_two_files_takes_the_later_files_row(tmp_path):
    config = TableConfig(name="t", dim=2)
    key = np.array([7, 3], np.uint64)
    first = np.ones((2, 2), np.float32)
    for i, rows in enumerate((first, 2 * first)):
        shards.write_shard(tmp_path, f"f{i}.arrow", {"key": key, "embedding": rows}, {"kind": "b"})
    paths = [tmp_path / "f0.arrow", tmp_path / "f1.arrow"]
    columns = [shards.read_shard(p, copy=False)[1] for p in paths]
    table = MappedTable.of_files(config, paths, columns, None)
    np.testing.assert_array_equal(table.lookup(key), 2 * first)
