"""File checksums (issue 30): every save records SHA-256 and xxh3-128 of each file; a load
or verify checks xxh3-128 when the record has it, and SHA-256 for files saved before.

Either way a changed byte is caught and named; a record with a bad or no checksum is
refused with an error naming the file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import xxhash

from sparseps import optim
from sparseps.checkpoint import inspect_cli
from sparseps.config import TableConfig
from sparseps.errors import CheckpointError, InputError
from sparseps.files import manifest as mf
from sparseps.files import shards
from sparseps.rpc.protocol import Request
from sparseps.server.handlers import ServerState

CONFIG = TableConfig(name="emb", dim=4, rule=optim.Adagrad(lr=0.1), seed=3)


def _shard(folder: Path, rows: int = 5000) -> dict:
    keys = np.arange(1, rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    columns = {"key": keys, "embedding": np.ones((rows, 4), np.float32)}
    return shards.write_shard(folder, "emb.base-00000-of-00001.arrow", columns, {"kind": "base"})


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0x01]))


def test_a_save_records_both_checksums_of_the_whole_file(tmp_path):
    record = _shard(tmp_path)
    data = Path(record["path"]).read_bytes()
    assert record["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["xxh3_128"] == xxhash.xxh3_128_hexdigest(data)
    assert mf.file_record(Path(record["path"])) == {
        "size": len(data), "sha256": record["sha256"], "xxh3_128": record["xxh3_128"],
    }  # fmt: skip
    assert mf.entry_of(record) == mf.file_record(Path(record["path"]))
    # bigger than one read block: the one-pass hashing is the whole file's
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).bytes(3 * (1 << 20) + 17))
    assert shards.checksums_of(big) == {
        "xxh3_128": xxhash.xxh3_128_hexdigest(big.read_bytes()),
        "sha256": hashlib.sha256(big.read_bytes()).hexdigest(),
    }


def test_a_load_verifies_xxh3_and_not_sha256_when_both_are_recorded(tmp_path):
    record = _shard(tmp_path)
    # a wrong sha256 beside the right xxh3_128 passes: only xxh3_128 was computed
    meta, columns = shards.read_shard(record["path"], sha256="0" * 64, xxh3_128=record["xxh3_128"])
    assert meta["kind"] == "base" and columns["key"].size == 5000
    with pytest.raises(CheckpointError, match="xxh3_128 does not match"):
        shards.read_shard(record["path"], sha256=record["sha256"], xxh3_128="0" * 32)


@pytest.mark.parametrize("kind", ["xxh3_128", "sha256"])
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_changed_byte_is_caught_by_either_checksum(tmp_path, kind, where):
    """Anywhere in the file: the Arrow header, the column data, the footer."""
    record = _shard(tmp_path)
    path = Path(record["path"])
    _flip(path, {"start": 2, "middle": record["bytes"] // 2, "end": record["bytes"] - 3}[where])
    with pytest.raises(CheckpointError) as err:
        shards.read_shard(path, **{kind: record[kind]})
    assert f"{kind} does not match" in str(err.value) and str(path) in str(err.value)
    entry = {"size": record["bytes"], kind: record[kind]}  # new (both) or old (sha256 only)
    if kind == "xxh3_128":
        entry["sha256"] = record["sha256"]
    with pytest.raises(CheckpointError) as err:
        mf.verify(tmp_path, {"files": {path.name: entry}})
    assert f"{path}: checksum mismatch ({kind}" in str(err.value)


def _old_style_checkpoint(folder: Path) -> Path:
    """A model folder as sparseps wrote it before xxh3_128: records hold size + sha256."""
    folder.mkdir()
    record = _shard(folder)
    data = Path(record["path"]).read_bytes()
    files = {record["name"]: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    manifest = {"format": "sparseps-inference", "version": 1, "created": "2026-11-20T00:00:00Z",
                "kind": "base", "sequence": 0, "files": files, "tables": {}, "state": {}}  # fmt: skip
    (folder / mf.MANIFEST).write_text(json.dumps(manifest))
    return Path(record["path"])


def _inspect(folder: Path) -> int:
    return inspect_cli.run(argparse.Namespace(directory=str(folder), progress=False))


def test_a_folder_saved_before_xxh3_still_verifies_by_sha256(tmp_path, capsys):
    folder = tmp_path / "old"
    path = _old_style_checkpoint(folder)
    assert set(mf.verify(folder)["files"]) == {path.name}
    assert _inspect(folder) == 0
    _flip(path, 100)
    with pytest.raises(CheckpointError, match=r"checksum mismatch \(sha256"):
        mf.verify(folder)
    assert _inspect(folder) == 1
    assert f"INVALID {path}: checksum mismatch (sha256" in capsys.readouterr().out


def test_inspect_checks_a_new_folder_by_xxh3(tmp_path, capsys):
    folder = tmp_path / "new"
    folder.mkdir()
    record = _shard(folder)
    mf.write_manifest(folder, "sparseps-inference", {record["name"]: mf.entry_of(record)},
                      kind="base", sequence=0, tables={}, state={})  # fmt: skip
    assert _inspect(folder) == 0
    _flip(Path(record["path"]), record["bytes"] // 2)
    assert _inspect(folder) == 1
    assert "checksum mismatch (xxh3_128" in capsys.readouterr().out


@pytest.mark.parametrize(
    "entry, problem",
    [({"size": 0}, "has no checksum"), ({"size": 0, "xxh3_128": 7}, "must be a hex string")],
)
def test_a_record_without_a_usable_checksum_is_refused(tmp_path, entry, problem):
    path = tmp_path / "a.arrow"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        mf.verify(tmp_path, {"files": {"a.arrow": entry}})
    assert problem in str(err.value) and "a.arrow" in str(err.value)


def _server() -> ServerState:
    state = ServerState(0, 1, "127.0.0.1:1")
    state.handle(Request(op="create_table", id=1, table="emb", bufs={},
                         args={"config": CONFIG.to_dict()}))  # fmt: skip
    return state


def _load(state: ServerState, files: list) -> dict:
    result, _ = state.handle(Request(op="load", id=2, table="emb", bufs={}, args={"files": files}))
    return result


def test_a_server_loads_records_with_either_checksum_and_refuses_a_bad_one(tmp_path):
    state = _server()
    keys = np.arange(1, 301, dtype=np.uint64)
    state.sparse["emb"].table.push(keys, np.ones((300, 4), np.float32))
    records, _ = state.handle(Request(op="save", id=3, table="emb", bufs={},
                                      args={"directory": str(tmp_path)}))  # fmt: skip
    old_style = [{k: v for k, v in r.items() if k != "xxh3_128"} for r in records]
    for files in (records, old_style, [r["path"] for r in records]):
        assert _load(_server(), files)["rows"] == 300
    bad = [{**records[0], "xxh3_128": 12}]
    with pytest.raises(InputError, match="checksum 'xxh3_128' must be a hex string"):
        _load(_server(), bad)
