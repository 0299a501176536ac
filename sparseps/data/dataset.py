"""What both datasets share: validated options, this worker's files, reader threads.

Reading: ``threads`` reader threads take this worker's files one at a time (in order)
and parse them chunk by chunk; parsed chunks go through one bounded queue
(``queue_size`` chunks) to the consumer, which cuts them into batches of
``batch_size`` without copying (slices of the chunk; only a batch that spans two chunks
is copied). With ``threads=1`` the order of samples is the order of the files and
lines; with more threads chunks of different files interleave.

Which files: ``split="static"`` (default) reads ``files[rank::world]``; ``split="steal"``
takes files one at a time from a queue shared by the job (:mod:`sparseps.data.steal`,
which also describes ``journal=``, the record that lets a resumed pass skip finished files);
``split="none"`` reads every file on every worker.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import env
from ..config import check_float
from ..errors import ConfigError
from .formats import Format, parse_format
from .schema import Batch, Schema
from .sources import expand_files, guess_format, read_file, shard
from .stats import MAX_BAD_RATIO, DatasetStats, PassCounter
from .steal import FileShare, Lease, Split, parse_split

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = ["DatasetOptions", "rebatch"]

log = logging.getLogger(__name__)

_POLL_S = 0.2  # how often blocked queue calls look at the stop flag and the readers
_JOIN_S = 60.0  # longest wait for a reader thread to finish its chunk after a stop


@dataclass(frozen=True)
class DatasetOptions:
    """The validated constructor arguments of a dataset (see QueueDataset)."""

    files: tuple[str, ...]
    schema: Schema
    batch_size: int
    threads: int
    pipe_command: str | None
    format: Format
    rank: int
    world: int
    drop_last: bool
    strict: bool
    queue_size: int
    pipe_timeout: float
    max_bad_ratio: float = MAX_BAD_RATIO
    split: Split = Split.STATIC
    journal: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.schema, Schema):
            raise ConfigError(
                f"schema: expected a sparseps.data.Schema, got {type(self.schema).__name__}"
            )
        for name, low in (("batch_size", 1), ("threads", 1), ("queue_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name}: expected an integer >= {low}, got {value!r}")
        check_float("dataset", "pipe_timeout", self.pipe_timeout, gt=0)
        ratio = self.max_bad_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
            raise ConfigError(
                f"max_bad_ratio: expected a number in [0, 1] (the share of bad lines a pass "
                f"may skip), got {ratio!r}"
            )
        if self.pipe_command is not None and not str(self.pipe_command).strip():
            raise ConfigError("pipe_command: empty command (use None for no command)")
        if self.split is Split.NONE and self.journal is not None:
            raise ConfigError(
                "journal: with split='none' every worker reads every file, so a file one "
                "worker finished is not finished for the others; use split='static' or "
                "'steal' with a journal"
            )

    @staticmethod
    def build(
        files: str | os.PathLike | Sequence[str | os.PathLike], schema: Schema,
        batch_size: int, threads: int, pipe_command: str | None, *,
        format: str | Format | None, rank: int | None, world: int | None, drop_last: bool,
        strict: bool, queue_size: int, pipe_timeout: float,
        max_bad_ratio: float = MAX_BAD_RATIO, split: str | Split = Split.STATIC,
        journal: str | os.PathLike | None = None,
    ) -> DatasetOptions:  # fmt: skip
        """Expand the inputs and resolve rank/world (from the environment when None)."""
        if (rank is None) != (world is None):
            raise ConfigError(
                f"give both rank and world or neither (got rank={rank}, world={world})"
            )
        if rank is None or world is None:  # both or neither (checked above)
            role = env.from_environ()
            if role is None:
                rank, world = 0, 1
            elif role.role is env.Role.WORKER:
                rank, world = role.rank, role.worker_num
            else:
                raise ConfigError(
                    f"datasets are read by workers, but this process has SPARSEPS_ROLE="
                    f"{role.role.value}; pass rank= and world= to read anyway"
                    + (
                        " (a heter worker serves from its Trainer's constructor: construct "
                        "the Trainer before reading data)"
                        if role.role is env.Role.HETER_WORKER
                        else ""
                    )
                )
        if not isinstance(files, str | os.PathLike | Sequence) or (
            isinstance(files, Sequence) and not isinstance(files, str) and not files
        ):
            raise ConfigError(f"files: expected a path or a non-empty list of paths, got {files!r}")
        shard([], rank, world)  # validates rank/world
        return DatasetOptions(
            files=tuple(expand_files(files)), schema=schema, batch_size=batch_size,
            threads=threads, pipe_command=pipe_command,
            format=parse_format(format, pipe_command), rank=rank, world=world,
            drop_last=bool(drop_last), strict=bool(strict), queue_size=queue_size,
            pipe_timeout=float(pipe_timeout), max_bad_ratio=max_bad_ratio,
            split=parse_split(split), journal=None if journal is None else os.fspath(journal),
        )  # fmt: skip

    def my_files(self) -> list[tuple[int, str]]:
        """``(file_no, path)`` of this worker's static share (``split="none"``: all)."""
        if self.split is Split.NONE:
            return list(enumerate(self.files))
        return shard(self.files, self.rank, self.world)


class _Done:
    pass


class _Last:
    """A file's last chunk (split="steal": taking it frees a claim permit)."""

    def __init__(self, batch: Batch, file_no: int) -> None:
        self.batch, self.file_no = batch, file_no


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class DatasetBase:
    """Options, stats and the reader threads (the public classes add iteration; their
    constructor is this one, documented on :class:`~sparseps.data.QueueDataset`)."""

    _journals = True  # whether journal= is accepted (a file read is a file trained)

    def __init__(self, files: str | os.PathLike | Sequence[str | os.PathLike], schema: Schema,
                 batch_size: int, threads: int = 1, pipe_command: str | None = None, *,
                 format: str | Format | None = None, rank: int | None = None,
                 world: int | None = None, drop_last: bool = False, strict: bool = False,
                 queue_size: int = 16, pipe_timeout: float = 300.0,
                 max_bad_ratio: float = MAX_BAD_RATIO, split: str = "static",
                 journal: str | os.PathLike | None = None, store: Store | None = None,
                 steal_key: str | None = None, lease_s: float | None = None) -> None:  # fmt: skip
        self.options = DatasetOptions.build(
            files, schema, batch_size, threads, pipe_command, format=format, rank=rank,
            world=world, drop_last=drop_last, strict=strict, queue_size=queue_size,
            pipe_timeout=pipe_timeout, max_bad_ratio=max_bad_ratio, split=split,
            journal=journal,
        )  # fmt: skip
        self._passes: list[PassCounter] = []
        opts = self.options
        if opts.journal is not None and not self._journals:
            raise ConfigError(
                f"journal: {type(self).__name__} trains from memory after loading, so a file "
                f"read is not a file trained; use QueueDataset(..., journal=...)"
            )
        stealing = opts.split is Split.STEAL
        self._share = FileShare(opts.files, opts.rank, opts.world, stealing=stealing,
                                journal=opts.journal, store=store, name=type(self).__name__,
                                key=steal_key,
                                lease=None if lease_s is None else Lease(lease_s))  # fmt: skip
        if not stealing and not self.options.my_files():
            log.warning(
                "%s: worker %d of %d has no file to read (%d files in all)",
                type(self).__name__, self.options.rank, self.options.world, len(self.options.files),
            )  # fmt: skip

    @property
    def schema(self) -> Schema:
        return self.options.schema

    @property
    def batch_size(self) -> int:
        return self.options.batch_size

    @property
    def files(self) -> list[str]:
        """The files this worker reads (its share of the job's sorted file list); with
        ``split="steal"``, the files it took in its latest pass (so far)."""
        if self.options.split is Split.STEAL:
            return [self.options.files[no] for no in sorted(self._share.read_files)]
        return [path for _, path in self.options.my_files()]

    def stats(self) -> DatasetStats:
        passes = tuple(p.snapshot() for p in self._passes)
        return DatasetStats(
            rows=sum(p.rows for p in passes),
            bad_lines=sum(p.bad_lines for p in passes),
            files=len(self.files),
            passes=passes,
        )

    def trained_callback(self) -> Callable[[Batch], None]:
        """For a trainer: the next pass's files count as finished (``journal=``) only
        once it reports their rows trained, by calling the returned function with each
        trained batch (instead of when the consumer asks for the following batch)."""
        return self._share.trained_callback()

    def _tracked(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        return self._share.tracked(batches)

    def _read_chunks(self) -> Iterator[Batch]:
        """One pass over this worker's files: parsed chunks from the reader threads."""
        opts = self.options
        text = opts.format is not Format.PARQUET
        counter = PassCounter(
            strict=opts.strict, name=type(self).__name__, max_bad_ratio=opts.max_bad_ratio,
            format=opts.format.value,
            guess=(lambda data: guess_format(data, opts.schema, opts.format)) if text else None,
        )  # fmt: skip
        self._passes.append(counter)
        claim, tracker = self._share.begin_pass(opts.my_files)
        read_files = self._share.read_files
        out: queue.Queue = queue.Queue(maxsize=opts.queue_size)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=_POLL_S)
                    return True
                except queue.Full:
                    continue
            return False

        # split="steal": a reader claims a file only when a permit is free; the consumer
        # hands one back when it comes back for rows after a file's last chunk (every
        # batch of the file but a short tail handed out), so a worker holds at most
        # `threads` files not yet handed out, and a slow consumer claims less. With
        # threads=1 the parse of a file's first chunk is then not overlapped with training
        # (a prefetching trainer still overlaps it); threads=2 overlaps it and claims one
        # file ahead.
        ahead = threading.Semaphore(opts.threads) if opts.split is Split.STEAL else None

        def permit() -> bool:
            while not stop.is_set():
                if ahead is None or ahead.acquire(timeout=_POLL_S):
                    return True
            return False

        def reader() -> None:
            try:
                while permit():
                    claimed = claim()
                    if claimed is None:
                        break
                    file_no, path = claimed
                    read_files.append(file_no)
                    rows, held = 0, None  # held: the latest chunk, put once the next exists
                    for parsed in read_file(path, file_no, opts.schema, opts.format,
                                            pipe_command=opts.pipe_command,
                                            pipe_timeout=opts.pipe_timeout):  # fmt: skip
                        counter.add(path, parsed)
                        rows += len(parsed.batch)
                        if not len(parsed.batch):
                            continue
                        if ahead is None:
                            if not put(parsed.batch):
                                return
                        else:
                            if held is not None and not put(held):
                                return
                            held = parsed.batch
                    counter.file_done()
                    if tracker is not None:
                        tracker.read_done(file_no, rows)
                    if ahead is not None:
                        if held is None:
                            self._share.handed_out(file_no)
                            ahead.release()
                        elif not put(_Last(held, file_no)):
                            return
            except BaseException as exc:  # handed to the consumer, which re-raises it
                put(_Failed(exc))
            finally:
                put(_Done())

        threads = [
            threading.Thread(target=reader, name=f"sparseps-reader-{i}", daemon=True)
            for i in range(
                opts.threads
                if opts.split is Split.STEAL
                else min(opts.threads, max(len(opts.my_files()), 1))
            )
        ]
        for t in threads:
            t.start()
        try:
            done = 0
            while done < len(threads):
                try:
                    item = out.get(timeout=_POLL_S)
                except queue.Empty:
                    if not any(t.is_alive() for t in threads) and out.empty():
                        break  # pragma: no cover - every reader puts _Done before exiting
                    continue
                if isinstance(item, _Done):
                    done += 1
                elif isinstance(item, _Failed):
                    raise item.exc
                elif isinstance(item, _Last):
                    yield item.batch
                    self._share.handed_out(item.file_no)
                    ahead.release()  # type: ignore[union-attr]  # only with split="steal"
                else:
                    yield item
            counter.finish()
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=_JOIN_S)
                if t.is_alive():  # pragma: no cover
                    log.warning("reader thread %s did not stop within %.0f s", t.name, _JOIN_S)


def rebatch(chunks: Iterator[Batch], batch_size: int, *, drop_last: bool) -> Iterator[Batch]:
    """Cut a stream of chunks into batches of ``batch_size`` (the last may be short)."""
    head: Batch | None = None  # leftover samples of the previous chunk, fewer than a batch
    for chunk in chunks:
        start = 0
        if head is not None:
            start = min(batch_size - len(head), len(chunk))
            head = Batch.concat([head, chunk.slice(0, start)])
            if len(head) < batch_size:
                continue
            yield head
            head = None
        n = len(chunk)
        while n - start >= batch_size:
            yield chunk.slice(start, start + batch_size)
            start += batch_size
        if start < n:
            head = chunk.slice(start, n)
    if head is not None and len(head) and not drop_last:
        yield head
