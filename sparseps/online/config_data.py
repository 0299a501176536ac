"""The ``data`` section of an online config: where the stream lies, how it is cut into
splits and passes, and how its files are read (format, schema, share among workers).

The largest section, and the only one with a nested value of its own (``data.schema``, a
built-in name or the fields of a :class:`sparseps.data.Schema`), so it has its module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.stats import MAX_BAD_RATIO
from ..errors import ConfigError
from .config_values import check_bool, check_choice, check_float, check_int, check_str

if TYPE_CHECKING:
    from ..data.schema import Schema

__all__ = [
    "BUILTIN_SCHEMAS",
    "MINUTES_PER_DAY",
    "PATTERN_FIELDS",
    "SCHEMA_KEYS",
    "SPLITS",
    "DataConfig",
]

MINUTES_PER_DAY = 24 * 60
PATTERN_FIELDS = ("day", "hhmm", "year", "month", "dd", "hour", "minute")
BUILTIN_SCHEMAS = ("criteo", "criteo_slot", "avazu")
SPLITS = ("static", "steal", "none")  # the datasets' split= (sparseps.data.steal.Split)
SCHEMA_KEYS = ("label", "dense", "slots", "dense_transform", "id_column", "extra_labels",
               "multislot_order")  # fmt: skip


def _formats() -> tuple[str, ...]:
    from ..data.formats import Format

    return tuple(f.value for f in Format)


@dataclass(frozen=True)
class DataConfig:
    """Where the stream lies and how it is cut into passes.

    Split ``i`` of a day starts at minute ``i * split_minutes`` and lives in
    ``root / pattern.format(day="YYYYMMDD", hhmm="HHMM", ...)``; it is ready once its
    ``done_marker`` file exists. A pass is ``splits_per_pass`` consecutive splits.

    Args:
        root: the stream's root folder.
        pattern: a ``str.format`` pattern with fields day, hhmm, year, month, dd, hour, minute.
        split_minutes: minutes per split (divides a day).
        splits_per_pass: splits per pass.
        done_marker: file name that says a split is complete.
        wait_timeout_s: how long to wait for a split's marker before stopping the job.
        poll_s: how often to look for a marker.
        format: file format, any of :class:`sparseps.data.Format`: ``criteo_tsv``,
            ``csv``, ``slot_text``, ``parquet``, ``multislot``, ``multislot_string``.
        pipe_command: a shell command each file is piped through (its stdout is read in
            ``format``), as for :class:`sparseps.data.InMemoryDataset`.
        schema: ``criteo``, ``criteo_slot``, ``avazu``, or a mapping of
            :class:`sparseps.data.Schema` fields (label, dense, slots, dense_transform,
            id_column, extra_labels, multislot_order). Default: ``criteo_slot`` for
            ``slot_text``, else ``criteo``.
        batch_size, threads: see :class:`sparseps.data.InMemoryDataset`.
        max_bad_ratio: the share of a pass's lines that may be bad (skipped) before the
            pass fails with ``InputError`` (default :data:`sparseps.data.MAX_BAD_RATIO`,
            1 in 100; 0: any bad line fails it). The job stops; the pass is not in the
            ledger and the model files are as the previous pass left them.
        shuffle_seed: base seed of the per-pass global shuffle (``None``: no shuffle).
        preload: load the next pass in the background while the current one trains
            (``false``: load each pass when its turn comes, holding one pass in memory).
        split: how a pass's files are shared among the workers: ``static`` (worker ``r``
            of ``w`` reads ``files[r::w]``), ``steal`` (each worker takes the next file
            from a queue shared by the pass's workers, docs/data.md §6.1) or ``none``
            (every worker reads every file, as Paddle does when the file list is not
            split; docs/data.md §6).
        lease_s: with ``split: steal``, a worker silent this long loses its claimed file
            to the others (docs/data.md §6.1); in an async job a worker that dies while it
            trains then *leaves*: the others re-read its files and finish the pass
            (docs/online.md, "Workers joining and leaving"). Each worker then shuffles its
            own files' rows (no global shuffle), so a dead worker's rows are its files'.
            ``null`` (default): no lease, a worker's death fails the pass.
    """

    root: str = ""
    pattern: str = "{day}/{hhmm}"
    split_minutes: int = 5
    splits_per_pass: int = 12
    done_marker: str = "_SUCCESS"
    wait_timeout_s: float = 3600.0
    poll_s: float = 5.0
    format: str = "criteo_tsv"
    batch_size: int = 512
    threads: int = 1
    max_bad_ratio: float = MAX_BAD_RATIO
    shuffle_seed: int | None = 0
    preload: bool = True
    split: str = "static"
    lease_s: float | None = None
    pipe_command: str | None = None
    schema: str | dict | None = None

    def __post_init__(self) -> None:
        check_str("data.root", self.root)
        check_str("data.pattern", self.pattern)
        try:
            self.pattern.format(**dict.fromkeys(PATTERN_FIELDS, "x"))
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"data.pattern: {self.pattern!r} is not a format string over the fields "
                f"{', '.join(PATTERN_FIELDS)} ({type(exc).__name__}: {exc})"
            ) from None
        if os.path.isabs(self.pattern) or ".." in Path(self.pattern).parts:
            raise ConfigError(f"data.pattern: must be relative to data.root, got {self.pattern!r}")
        check_int("data.split_minutes", self.split_minutes, 1, MINUTES_PER_DAY)
        if MINUTES_PER_DAY % self.split_minutes:
            raise ConfigError(
                f"data.split_minutes: must divide a day (1440 minutes), got {self.split_minutes}"
            )
        check_int(
            "data.splits_per_pass", self.splits_per_pass, 1, MINUTES_PER_DAY // self.split_minutes
        )
        check_str("data.done_marker", self.done_marker)
        if "/" in self.done_marker:
            raise ConfigError(
                f"data.done_marker: a file name, not a path; got {self.done_marker!r}"
            )
        check_float("data.wait_timeout_s", self.wait_timeout_s, 0.0)
        check_float("data.poll_s", self.poll_s, 0.0, open_lo=True)
        check_choice("data.format", self.format, _formats())
        if self.pipe_command is not None:
            check_str("data.pipe_command", self.pipe_command)
        object.__setattr__(self, "schema", self._check_schema())
        check_int("data.batch_size", self.batch_size, 1, 1 << 20)
        check_int("data.threads", self.threads, 1, 64)
        check_float("data.max_bad_ratio", self.max_bad_ratio, 0.0, 1.0)
        if self.shuffle_seed is not None:
            check_int("data.shuffle_seed", self.shuffle_seed, 0)
        check_bool("data.preload", self.preload)
        check_choice("data.split", self.split, SPLITS)
        if self.lease_s is not None:
            check_float("data.lease_s", self.lease_s, 0.0, open_lo=True)
            if self.split != "steal":
                raise ConfigError("data.lease_s: needs data.split: steal (a lease hands a "
                                  "claimed file to the others)")  # fmt: skip

    def _check_schema(self):
        value = self.schema
        if value is None or isinstance(value, str):
            if value is not None:
                check_choice("data.schema", value, BUILTIN_SCHEMAS)
            return value
        if not isinstance(value, dict):
            raise ConfigError(
                f"data.schema: expected one of {BUILTIN_SCHEMAS} or a mapping of Schema "
                f"fields, got {value!r}"
            )
        unknown = sorted(str(k) for k in value if k not in SCHEMA_KEYS)
        if unknown:
            raise ConfigError(
                f"data.schema: unknown keys {', '.join(unknown)} (accepted: "
                f"{', '.join(SCHEMA_KEYS)})"
            )
        if "label" not in value or "slots" not in value:
            raise ConfigError("data.schema: a mapping needs at least 'label' and 'slots'")
        self.build_schema(dict(value))  # validates (ConfigError names the field)
        return dict(value)

    @staticmethod
    def build_schema(value: str | Mapping[str, Any] | None) -> Schema | None:
        from ..data import schema as schemas

        if value is None or isinstance(value, str):
            return None if value is None else getattr(schemas, value.upper())
        fields_ = dict(value)
        for key in ("dense", "slots", "extra_labels", "multislot_order"):
            if fields_.get(key) is not None:
                fields_[key] = tuple(fields_[key])
        try:
            return schemas.Schema(**fields_)
        except TypeError as exc:  # a field this version's Schema does not have
            raise ConfigError(f"data.schema: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"data.schema: {exc}") from None

    def dataset_options(self) -> dict:
        """The keyword arguments every dataset of the job is built with (besides files,
        schema, batch size and threads): format, pipe_command, max_bad_ratio, split."""
        return {
            "pipe_command": self.pipe_command,
            "format": self.format,
            "max_bad_ratio": self.max_bad_ratio,
            "split": self.split,
            **({"lease_s": self.lease_s} if self.lease_s is not None else {}),
        }

    def dataset_schema(self) -> Schema:
        """The :class:`sparseps.data.Schema` of the stream."""
        built = self.build_schema(self.schema)
        if built is not None:
            return built
        from ..data import CRITEO, CRITEO_SLOT

        return CRITEO_SLOT if self.format == "slot_text" else CRITEO
