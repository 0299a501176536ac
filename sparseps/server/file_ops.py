"""``ShardFiles``: the server ops that read or write files: shard save/load, dense files,
inference saves.

They run on the server's pool threads, never in its request loop, because they take
seconds on large tables (:mod:`sparseps.server.loop`); the paths they are given were
checked against the server's file roots before (:mod:`sparseps.server.file_guard`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CheckpointError, InputError
from ..files import shards

if TYPE_CHECKING:
    from ..elastic.server_moves import ElasticMoves
    from ..rpc.protocol import Request
    from ..table import DenseTable, SparseTable
    from .entries import Answer, Tables
    from .ownership import KeyOwnership

__all__ = ["ShardFiles"]


class ShardFiles:
    """The file ops of one server (one shard copy).

    Args:
        sparse: the shard's sparse tables.
        dense: the dense tables placed on this server.
        ownership: which keys are this server's (what it saves and loads).
        elastic: the server's placement (a save records its version; these ops are
            refused during a move).
        num_servers: servers in the job (recorded in each file, and how a load filters).
    """

    # a tiered table is saved in parts of about this many bytes of rows (its rows may not
    # fit in memory at once); an instance attribute in tests
    save_part_bytes = 256 << 20

    def __init__(
        self,
        sparse: Tables[SparseTable],
        dense: Tables[DenseTable],
        ownership: KeyOwnership,
        *,
        elastic: ElasticMoves,
        num_servers: int,
    ) -> None:
        self.sparse = sparse
        self.dense = dense
        self.rank = sparse.rank
        self.num_servers = num_servers
        self.ownership = ownership
        self.elastic = elastic

    def save(self, request: Request) -> Answer:
        """Write this server's shard of the table: a rows file and a pending file.

        A table with ``memory_rows`` writes its rows in parts (``...-of-SSSSS.arrow``,
        then ``...-of-SSSSS.part-00001.arrow``, ...) of about :attr:`save_part_bytes`,
        streamed from its disk tier under the read lock; a load takes any number of files.
        """
        entry = self.sparse.entry(request)
        table = entry.table
        config = table.config.to_dict()
        meta = {
            "table": request.table,
            "config": config,
            "rank": self.rank,
            "num_servers": self.num_servers,
        }
        placement = self.elastic.placement
        if placement is not None:  # an elastic job: rows are where the placement put them
            meta["placement_version"] = placement.version
        directory = request.args["directory"]
        records = []

        def write(kind: str, columns: dict, part: int = 0) -> None:
            name = shards.file_name(str(request.table), kind, self.rank, self.num_servers)
            if part:
                name = f"{name.removesuffix('.arrow')}.part-{part:05d}.arrow"
            record = shards.write_shard(directory, name, columns, {**meta, "kind": kind})
            records.append({**record, "rank": self.rank})

        part_rows = max(1, self.save_part_bytes // (4 * table.layout.width))
        with entry.lock.read():
            self.elastic.refuse_during_move(request)  # elastic: rows would be saved twice or never
            pending = self.ownership.owned_columns(table.export_pending())
            if table.disk_path is None:
                rows = self.ownership.owned_columns(table.export_rows())
            else:  # streamed: one part in memory at a time, all under the lock
                rows = None
                for part, columns in enumerate(table.export_row_parts(part_rows)):
                    write("rows", self.ownership.owned_columns(columns), part)
        if rows is not None:  # in memory: the files are written outside the lock
            write("rows", rows)
        write("pending", pending)
        return records, []

    def load(self, request: Request) -> Answer:
        """Make this server's shard of the table exactly the checkpoint (restore, not merge).

        Every file (all of them: a save made on another number of servers spreads this
        server's keys over several) is read, verified and imported into a fresh table
        aside; only then does the fresh table replace the live contents, under the write
        lock. Rows and pending keys created after the checkpoint are gone; a file that
        fails (corrupt, wrong table, overlapping keys) leaves the table as it was.
        """
        entry = self.sparse.entry(request)
        self.elastic.refuse_during_move(request)  # early, before reading files (again at the swap)
        loaded = {"rows": 0, "pending": 0, "files": 0}
        specs = [_file_spec(spec) for spec in request.args["files"]]
        fresh = entry.table.empty_like()
        for path, checksums in specs:
            # every file is read and verified, also those holding none of this server's
            # keys: a corrupt file then fails the load on every server alike. The checksum
            # (xxh3_128 when the record has it, else sha256) is computed while the rows are
            # imported, and checked before the next file
            verifier = (shards.pick_checksum(checksums) or ("none",))[0]
            sha256, xxh3 = checksums.get("sha256"), checksums.get("xxh3_128")
            with shards.verified_shard(path, sha256=sha256, xxh3_128=xxh3) as (meta, columns):
                _check_compatible(path, meta, entry.table)
                loaded["files"] += 1
                select = self.ownership.owned_rows(meta, columns["key"])
                if select is not None and select.size == 0:
                    continue
                kind = str(meta["kind"])  # "rows" or "pending": checked above
                try:
                    if kind == "rows":
                        # SHA-256 (a file saved before xxh3_128) keeps a core busy for the
                        # whole import: the import then stays on one thread
                        fresh.import_rows(columns, strict=True, select=select,
                                          parallel=verifier != "sha256")  # fmt: skip
                    else:
                        if select is not None:
                            columns = {name: np.ascontiguousarray(values[select])
                                       for name, values in columns.items()}  # fmt: skip
                        fresh.import_pending(columns, strict=True)
                except InputError as exc:
                    raise CheckpointError(f"shard file {path}: {exc}") from exc
                loaded[kind] += len(columns["key"]) if select is None else select.size
        with entry.lock.write():
            self.elastic.refuse_during_move(request)  # elastic: copied rows would be replaced
            entry.table.adopt(fresh)
        return loaded, []

    def save_dense(self, request: Request) -> Answer:
        """Write the dense table (values + optimizer state) as ``dense.npz`` (checkpoints)."""
        from ..files.dense_file import save_dense_file

        entry = self.dense.entry(request)
        with entry.lock.read():
            arrays = entry.table.export()
        folder = request.args["directory"]
        os.makedirs(folder, exist_ok=True)
        name = save_dense_file(folder, arrays)
        path = os.path.join(folder, name)
        record = {"name": name, "path": path, "bytes": os.path.getsize(path),
                  **shards.checksums_of(path)}  # fmt: skip
        return record, []

    def load_dense(self, request: Request) -> Answer:
        from ..files.dense_file import load_dense_file

        entry = self.dense.entry(request)
        path, checksum = request.args["path"], request.args.get("sha256")
        if not os.path.isfile(path):
            raise CheckpointError(f"load_dense {request.table!r}: {path} does not exist")
        if checksum is not None and shards.sha256_of(path) != checksum:
            raise CheckpointError(f"load_dense {request.table!r}: {path} checksum mismatch")
        arrays = load_dense_file(path)
        if arrays["values"].shape != (entry.spec["size"],):
            raise CheckpointError(
                f"load_dense {request.table!r}: {path} holds {arrays['values'].shape} values, "
                f"the table has {entry.spec['size']}"
            )
        with entry.lock.write():
            entry.table.import_(arrays)
        return None, []

    def save_inference(self, request: Request) -> Answer:
        """Write this shard's embeddings for serving: ``base`` = rows whose score reaches the
        lifecycle's base_score (Paddle's base_threshold), ``delta`` = rows changed since the
        previous inference save by at least the accessor's delta_threshold and seen within
        its delta_keep_days (:func:`~sparseps.table.lifecycle.delta_keep`). The delta scores
        of the saved rows restart from zero only on ``commit_inference``, once the save is
        in place: a save that never lands leaves them to the next delta. A table whose
        pull carries show and click (``accessor.cvm``) saves them in front of the
        embedding, as a pull gives them."""
        from ..table.lifecycle import base_keep, delta_keep

        mode = request.args["mode"]
        if mode not in ("base", "delta"):
            raise InputError(f"save_inference: mode must be 'base' or 'delta', got {mode!r}")
        entry = self.sparse.entry(request)
        table = entry.table
        config = table.config
        kept_keys, kept_embeddings = [], []
        part_rows = max(1, self.save_part_bytes // (4 * table.layout.width))
        with entry.lock.read():  # in parts: a tiered table's rows never all in memory
            self.elastic.refuse_during_move(request)
            for rows in map(self.ownership.owned_columns, table.export_row_parts(part_rows)):
                if mode == "base":
                    keep = base_keep(rows["show"], rows["click"], config.lifecycle)
                else:
                    keep = delta_keep(rows["show"], rows["click"], rows["delta_score"],
                                      rows["unseen_days"], config.lifecycle, config.accessor)  # fmt: skip
                kept_keys.append(rows["key"][keep])
                embedding = rows["embedding"][keep]
                if config.accessor.cvm:
                    counts = np.stack([rows["show"][keep], rows["click"][keep]], axis=1)
                    embedding = np.concatenate([counts, embedding], axis=1)
                kept_embeddings.append(embedding)
        keys = np.concatenate(kept_keys)
        order = np.argsort(keys, kind="stable")
        columns = {
            "key": np.ascontiguousarray(keys[order]),
            "embedding": np.ascontiguousarray(np.concatenate(kept_embeddings)[order]),
        }
        name = f"{request.table}.{mode}-{self.rank:05d}-of-{self.num_servers:05d}.arrow"
        meta = {
            "table": request.table,
            "config": config.to_dict(),
            "rank": self.rank,
            "num_servers": self.num_servers,
            "kind": mode,
        }
        record = shards.write_shard(request.args["directory"], name, columns, meta)
        return {**record, "rank": self.rank}, []

    def commit_inference(self, request: Request) -> Answer:
        """An inference save is in place: restart the changed-rows marker (delta_score)."""
        entry = self.sparse.entry(request)
        with entry.lock.write():
            self.elastic.refuse_during_move(request)
            entry.table.reset_delta_score()
        return None, []


def _file_spec(spec) -> tuple[str, dict[str, str]]:
    """A load entry is a path or a save record ``{"path", "sha256", "xxh3_128", ...}``:
    ``(path, the record's checksums by kind)``.

    Raises:
        InputError: not a path or a record with a path, or a checksum that is not a string.
    """
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, dict) and isinstance(spec.get("path"), str):
        checksums = {}
        for kind in shards.CHECKSUMS:
            digest = spec.get(kind)
            if digest is None:
                continue
            if not isinstance(digest, str):
                raise InputError(
                    f"load: {spec['path']!r:.200}: checksum {kind!r} must be a hex string, "
                    f"got {digest!r:.80}"
                )
            checksums[kind] = digest
        return spec["path"], checksums
    raise InputError(
        f"load: each file must be a path or a save record with 'path', got {spec!r:.80}"
    )


def _check_compatible(path: str, meta: dict, table: SparseTable) -> None:
    """A shard loads into a table with the same row layout: dim, rule kind, state widths.

    Rule hyper-parameters (lr, ...) may differ: resuming with a new learning rate is normal.
    """
    kind = meta.get("kind")
    if kind not in ("rows", "pending"):
        raise CheckpointError(
            f"shard file {path}: is a {kind!r} file; a table loads only 'rows' and 'pending' shards"
        )
    saved = meta.get("config") or {}
    layout = table.layout
    if saved.get("dim") != layout.dim:
        raise CheckpointError(
            f"shard file {path}: saved dim={saved.get('dim')!r} does not match the table's dim={layout.dim}"
        )
    saved_rule = (saved.get("rule") or {}).get("name")
    if saved_rule != table.config.rule.name:
        raise CheckpointError(
            f"shard file {path}: saved with rule {saved_rule!r}, the table uses "
            f"{table.config.rule.name!r} (optimizer state layouts differ)"
        )
    state = (meta.get("columns") or {}).get("state")
    if kind == "rows" and (state is None or state[1] != layout.state_dim):
        raise CheckpointError(
            f"shard file {path}: optimizer state is {None if state is None else state[1]} floats "
            f"wide, the table's rule stores {layout.state_dim}"
        )
