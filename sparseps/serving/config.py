"""``ServeConfig``: the settings of one prediction service, validated at construction."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint.model_input import NAMED_SCHEMAS, named_schema
from ..data.schema import Schema
from ..errors import ConfigError

__all__ = ["SCHEMAS", "ServeConfig"]

# request schemas by name (a dense name repeated k times, as CRITEO_SLOT's, is one request
# column of k numbers: sparseps.serving.request_columns)
SCHEMAS: dict[str, Schema] = NAMED_SCHEMAS


@dataclass(frozen=True)
class ServeConfig:
    """How ``sparseps serve`` runs.

    Attributes:
        model_dir: the inference model folder (a chain ``base-NNNNN``, ``delta-NNNNN``).
        host, port: where to listen; port 0 picks a free port (see ``ready_file``).
        schema: the request columns: None (default) for the schema the model records
            (:mod:`sparseps.checkpoint.model_input`; Criteo for a save that records
            none), else a name of :data:`SCHEMAS` or a JSON file of Schema fields.
        poll_s: how often the chain is checked for new saves.
        max_body_bytes: larger request bodies are refused (413); so are Arrow bodies
            that decode (decompress) to more, refused from their batch headers before
            they are decoded.
        max_rows: requests with more rows are refused (413).
        max_ids: requests with more feature ids (over every slot column: one per string
            or integer value, each id of a list) are refused (413), before any is hashed
            or looked up.
        torch_threads: torch's intra-op threads (``torch.set_num_threads``). 1 by default:
            concurrent requests already run on several threads, and on a busy machine
            more OpenMP threads per call made a 1-row request 15x slower (27 ms against
            1.7 ms measured on the shared 2-core box, bench/RESULTS.md "serve").
        ready_file: once listening, the service writes ``{"url", "host", "port", "pid"}``
            here (atomically) and removes it when it stops.
        batch_max_rows: rows one model call gathers from concurrent requests at most
            (:mod:`.batcher`); 0 turns batching off (each request its own call, on the
            thread that parsed it: the service before issue 60).
        batch_max_wait_ms: the longest a request waits for others to join its call
            (from its arrival; no wait when no other request is on its way).
        workers: service processes on the one port (:mod:`.workers`); 0: one per core.
        index_dir: where the bases' sorted-key row indexes are kept and shared by the
            processes (:mod:`sparseps.checkpoint.mapped_table`); None (default):
            ``model_dir/.serving-index`` (the chain ignores hidden folders).
    """

    model_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    schema: str | None = None
    poll_s: float = 1.0
    max_body_bytes: int = 64 << 20
    max_rows: int = 65536
    max_ids: int = 1 << 21
    torch_threads: int = 1
    ready_file: Path | None = None
    batch_max_rows: int = 1024
    batch_max_wait_ms: float = 2.0
    workers: int = 0
    index_dir: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        index = self.model_dir / ".serving-index" if self.index_dir is None else self.index_dir
        object.__setattr__(self, "index_dir", Path(index))
        if self.ready_file is not None:
            object.__setattr__(self, "ready_file", Path(self.ready_file))
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"ServeConfig.port: {self.port} is not in 0..65535")
        if self.schema is not None:
            try:
                named_schema(self.schema)
            except ConfigError as exc:
                raise ConfigError(f"ServeConfig.schema: {exc}") from None
        if not 0.01 <= self.poll_s <= 3600:
            raise ConfigError(f"ServeConfig.poll_s: {self.poll_s} is not in 0.01..3600 seconds")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"ServeConfig.max_body_bytes: {self.max_body_bytes} is below 1024")
        if not 1 <= self.torch_threads <= 256:
            raise ConfigError(f"ServeConfig.torch_threads: {self.torch_threads} is not in 1..256")
        if self.max_rows < 1:
            raise ConfigError(f"ServeConfig.max_rows: {self.max_rows} is below 1")
        if self.max_ids < 1:
            raise ConfigError(f"ServeConfig.max_ids: {self.max_ids} is below 1")
        if self.batch_max_rows < 0:
            raise ConfigError(
                f"ServeConfig.batch_max_rows: {self.batch_max_rows} is below 0 (0: no batching)"
            )
        if not 0 <= self.batch_max_wait_ms <= 1000:
            raise ConfigError(
                f"ServeConfig.batch_max_wait_ms: {self.batch_max_wait_ms} is not in 0..1000 ms"
            )
        if not 0 <= self.workers <= 256:
            raise ConfigError(
                f"ServeConfig.workers: {self.workers} is not in 0..256 (0: one per core)"
            )

    @property
    def request_schema(self) -> Schema | None:
        """The schema given (None: the model's, found once it is loaded)."""
        return None if self.schema is None else named_schema(self.schema)

    @property
    def processes(self) -> int:
        """Service processes to run: ``workers``, or the usable cores for 0."""
        return self.workers or len(os.sched_getaffinity(0))
