"""What a sample holds (:class:`Schema`) and a columnar batch of samples (:class:`Batch`).

A batch is a handful of numpy arrays, never one Python object per sample, laid out so
that ``torch.from_numpy`` takes each without a copy::

    batch.label            float32 [B]
    batch.dense            float32 [B, D]   C-contiguous
    batch.slots[name]      Slot(values uint64 [nnz], offsets int64 [B + 1])
    batch.ids              int64 [B]        where each sample came from (see below)
    batch.extra_labels     float32 [B, K]   the schema's extra_labels, or None (K == 0)

Sample ``i`` has the ids ``values[offsets[i]:offsets[i + 1]]`` in a slot; ``offsets[0]``
is 0 and ``offsets[-1]`` is ``nnz``. A sample with no value in a slot has an empty range.
``ids[i]`` is ``file_no << 40 | record_no``: ``file_no`` is the position of the source
file in the sorted list of *all* input files (the same on every worker) and
``record_no`` the sample's 0-based index among the samples read from that file, so an
id names one sample across a whole job (shuffle tests and prediction dumps use it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from ..errors import ConfigError, InputError

__all__ = [
    "AVAZU",
    "CRITEO",
    "CRITEO_SLOT",
    "Batch",
    "DenseTransform",
    "Schema",
    "Slot",
    "sample_id",
]

ID_FILE_SHIFT = 40  # record numbers up to 2**40 per file, file numbers up to 2**23


def extra_label_array(schema: Schema, values: np.ndarray) -> np.ndarray | None:
    """``Batch.extra_labels`` from parsed values ``[B, K]``: float32 C-contiguous, or None
    when the schema has no extra labels (the parsers' one rule for the field)."""
    if not schema.extra_labels:
        return None
    return np.ascontiguousarray(values, dtype=np.float32)


def sample_id(file_no: int, record_no: np.ndarray) -> np.ndarray:
    """The int64 sample ids of records of one file (see the module docstring)."""
    return (np.int64(file_no) << np.int64(ID_FILE_SHIFT)) | np.asarray(record_no, np.int64)


class DenseTransform(StrEnum):
    """How raw dense values become features.

    ``log1p``: ``log(1 + max(x, 0))`` (the usual transform of Criteo's integer counts,
    which are heavy-tailed and may be -1 or -2); ``raw``: the value as written. A missing
    dense value is 0 with either transform.
    """

    LOG1P = "log1p"
    RAW = "raw"


@dataclass(frozen=True)
class Schema:
    """The columns of a sample.

    Attributes:
        label: name of the label column (or key in the slot text format).
        dense: names of the dense columns, in feature order (``D = len(dense)``). In the
            slot text format a name may repeat: the k-th occurrence of a key on a line
            fills the k-th column of that name (PaddleRec writes ``dense_feature`` 13 times).
        slots: names of the sparse slots (categorical columns), in order.
        dense_transform: see :class:`DenseTransform`.
        id_column: a column that names the sample (e.g. Avazu's ``id``); read and ignored
            by the parsers (ids are positional, see :mod:`sparseps.data.schema`).
        multislot_order: the order of the slots on a line of Paddle's multislot format
            (the order of the generator's ``(name, values)`` pairs, i.e. of Paddle's
            ``dataset.set_use_var``): the label name, each *distinct* dense name (one
            multislot slot holding as many values as the name has columns) and each
            sparse slot and each extra label, every one exactly once; other names are
            slots to skip. None: label, extra labels, dense names, slots (see
            :mod:`sparseps.data.multislot`).
        extra_labels: more label columns of a multi-task model (e.g. ``("conversion",)``
            beside ``label="click"``), found in ``Batch.extra_labels`` in this order. Every
            format reads them with the label's rules (required, a finite number): headerless
            TSV right after the label (see :meth:`columns`), CSV and Parquet by name, slot
            text as ``name:value`` keys, multislot as slots of one value (in
            ``multislot_order``, by default right after the label).
    """

    label: str
    dense: tuple[str, ...]
    slots: tuple[str, ...]
    dense_transform: DenseTransform = DenseTransform.LOG1P
    id_column: str | None = None
    multislot_order: tuple[str, ...] | None = None
    extra_labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_labels", tuple(self.extra_labels))
        object.__setattr__(self, "dense", tuple(self.dense))
        object.__setattr__(self, "slots", tuple(self.slots))
        try:
            object.__setattr__(self, "dense_transform", DenseTransform(self.dense_transform))
        except ValueError:
            raise ConfigError(
                f"Schema.dense_transform: {self.dense_transform!r} is not one of "
                f"{[t.value for t in DenseTransform]}"
            ) from None
        names = [self.label, *self.extra_labels, *self.slots, *dict.fromkeys(self.dense)]
        if self.id_column:
            names.append(self.id_column)
        for name in names:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"Schema: column names must be non-empty strings, got {name!r}")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"Schema: column names must be unique across label, dense, slots and id "
                f"(repeated: {', '.join(duplicates)}); only a dense name may repeat, "
                "for the slot text format"
            )
        if self.multislot_order is not None:
            self._check_multislot_order(self.multislot_order)

    def _check_multislot_order(self, requested: Sequence[str]) -> None:
        order = tuple(requested)
        object.__setattr__(self, "multislot_order", order)
        wanted = [*self.labels, *dict.fromkeys(self.dense), *self.slots]
        bad = [n for n in order if not isinstance(n, str) or not n]
        twice = sorted({n for n in order if order.count(n) > 1})
        missing = [n for n in wanted if n not in order]
        if bad or twice or missing:
            raise ConfigError(
                "Schema.multislot_order: must name the label, each extra label, each dense "
                "name and each slot exactly once (other names are skipped slots)"
                + (f"; not names: {bad}" if bad else "")
                + (f"; repeated: {', '.join(twice)}" if twice else "")
                + (f"; missing: {', '.join(missing)}" if missing else "")
            )

    def multislot_slots(self) -> tuple[str, ...]:
        """The slot names of a multislot line, in order (see ``multislot_order``)."""
        if self.multislot_order is not None:
            return self.multislot_order
        return (*self.labels, *dict.fromkeys(self.dense), *self.slots)

    @property
    def num_dense(self) -> int:
        return len(self.dense)

    @property
    def labels(self) -> tuple[str, ...]:
        """Every label column: ``label`` then ``extra_labels``."""
        return (self.label, *self.extra_labels)

    def columns(self) -> tuple[str, ...]:
        """Label, extra labels, dense and slot names in file order (the headerless TSV
        layout: Criteo's, with any extra label columns right after the label)."""
        return (*self.labels, *self.dense, *self.slots)


CRITEO = Schema(
    label="label",
    dense=tuple(f"I{i}" for i in range(1, 14)),
    slots=tuple(f"C{i}" for i in range(1, 27)),
)
"""Criteo display ads: label, 13 integer counts I1..I13 (log1p), 26 hashed categoricals."""

CRITEO_SLOT = Schema(
    label="click",
    dense=("dense_feature",) * 13,
    slots=tuple(str(i) for i in range(1, 27)),
    dense_transform=DenseTransform.RAW,
)
"""Criteo as PaddleRec's slot text format writes it: dense already scaled, ids integers."""

AVAZU = Schema(
    label="click",
    dense=(),
    slots=(
        "hour",
        "C1",
        "banner_pos",
        "site_id",
        "site_domain",
        "site_category",
        "app_id",
        "app_domain",
        "app_category",
        "device_id",
        "device_ip",
        "device_model",
        "device_type",
        "device_conn_type",
        "C14",
        "C15",
        "C16",
        "C17",
        "C18",
        "C19",
        "C20",
        "C21",
    ),  # fmt: skip
    id_column="id",
)
"""Avazu mobile ads (CSV with a header): every column but ``id`` and ``click`` hashed."""


@dataclass(frozen=True)
class Slot:
    """The ids of one slot for a batch: ``values[offsets[i]:offsets[i+1]]`` for sample i."""

    values: np.ndarray  # uint64 [nnz]
    offsets: np.ndarray  # int64 [B + 1]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def slice(self, start: int, stop: int) -> Slot:
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return Slot(self.values[lo:hi], self.offsets[start : stop + 1] - lo)

    def take(self, order: np.ndarray) -> Slot:
        """The samples ``order`` (int64 indices), in that order, vectorized."""
        lengths = np.diff(self.offsets)[order]
        offsets = np.zeros(order.size + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # position j of the output reads input position starts[sample(j)] + (j - out start)
        shift = np.repeat(self.offsets[:-1][order] - offsets[:-1], lengths)
        return Slot(self.values[np.arange(offsets[-1], dtype=np.int64) + shift], offsets)

    @staticmethod
    def concat(parts: Sequence[Slot]) -> Slot:
        if len(parts) == 1:
            return parts[0]
        values = np.concatenate([p.values for p in parts])
        bases = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = [np.zeros(1, np.int64)]
        offsets += [p.offsets[1:] + b for p, b in zip(parts, bases, strict=True)]
        return Slot(values, np.concatenate(offsets))


@dataclass(frozen=True)
class Batch:
    """A columnar batch of samples (see the module docstring for the layout)."""

    label: np.ndarray
    dense: np.ndarray
    slots: Mapping[str, Slot]
    # None (the default) means 0..B-1, filled in by __post_init__: readers always see an array
    ids: np.ndarray = field(default=None)  # type: ignore[arg-type]
    extra_labels: np.ndarray | None = None  # float32 [B, K]: Schema.extra_labels

    def __post_init__(self) -> None:
        if self.ids is None:
            object.__setattr__(self, "ids", np.arange(self.label.shape[0], dtype=np.int64))

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def slice(self, start: int, stop: int) -> Batch:
        """Samples ``start..stop-1``; label, dense and ids are views (no copy)."""
        return Batch(
            self.label[start:stop],
            self.dense[start:stop],
            {name: s.slice(start, stop) for name, s in self.slots.items()},
            self.ids[start:stop],
            None if self.extra_labels is None else self.extra_labels[start:stop],
        )

    def take(self, order: np.ndarray) -> Batch:
        """The samples at ``order`` (int64 indices), in that order."""
        order = np.asarray(order, dtype=np.int64)
        return Batch(
            self.label[order],
            np.ascontiguousarray(self.dense[order]),
            {name: s.take(order) for name, s in self.slots.items()},
            self.ids[order],
            None if self.extra_labels is None else self.extra_labels[order],
        )

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """One batch of all samples of ``parts`` (same schema), in order."""
        if not parts:
            raise InputError("Batch.concat needs at least one batch")
        if len(parts) == 1:
            return parts[0]
        names = list(parts[0].slots)
        return Batch(
            np.concatenate([p.label for p in parts]),
            np.concatenate([p.dense for p in parts]),
            {n: Slot.concat([p.slots[n] for p in parts]) for n in names},
            np.concatenate([p.ids for p in parts]),
            None
            if parts[0].extra_labels is None
            else np.concatenate([p.extra_labels for p in parts]),
        )

    @staticmethod
    def empty(schema: Schema) -> Batch:
        return Batch(
            np.empty(0, np.float32),
            np.empty((0, schema.num_dense), np.float32),
            {n: Slot(np.empty(0, np.uint64), np.zeros(1, np.int64)) for n in schema.slots},
            np.empty(0, np.int64),
            extra_label_array(schema, np.empty((0, len(schema.extra_labels)))),
        )

    def validate(self, schema: Schema | None = None) -> None:
        """Check the layout invariants (for batches built outside the parsers).

        Raises:
            InputError: naming the field and what is wrong.
        """
        n = len(self)
        if self.label.dtype != np.float32 or self.label.ndim != 1:
            raise InputError(
                f"Batch.label: expected float32 [B], got {self.label.dtype} {self.label.shape}"
            )
        if self.dense.dtype != np.float32 or self.dense.ndim != 2 or self.dense.shape[0] != n:
            raise InputError(
                f"Batch.dense: expected float32 [{n}, D], got {self.dense.dtype} {self.dense.shape}"
            )
        if not self.dense.flags.c_contiguous:
            raise InputError("Batch.dense: must be C-contiguous (torch.from_numpy without a copy)")
        if self.ids.shape != (n,):
            raise InputError(f"Batch.ids: expected [{n}], got {self.ids.shape}")
        if schema is not None:
            if self.dense.shape[1] != schema.num_dense:
                raise InputError(
                    f"Batch.dense: {self.dense.shape[1]} columns, schema has {schema.num_dense}"
                )
            if tuple(self.slots) != schema.slots:
                raise InputError(f"Batch.slots: {tuple(self.slots)} != schema slots {schema.slots}")
            k = len(schema.extra_labels)
            if (self.extra_labels is None) != (k == 0):
                raise InputError(
                    f"Batch.extra_labels: the schema has {k} extra labels "
                    f"{schema.extra_labels}, the batch "
                    + ("none" if self.extra_labels is None else "has them")
                )
        extra = self.extra_labels
        if extra is not None and (extra.dtype != np.float32 or extra.ndim != 2 or len(extra) != n):
            raise InputError(
                f"Batch.extra_labels: expected float32 [{n}, K], got {extra.dtype} {extra.shape}"
            )
        for name, slot in self.slots.items():
            off = slot.offsets
            if slot.values.dtype != np.uint64 or off.dtype != np.int64 or off.shape != (n + 1,):
                raise InputError(
                    f"slot {name!r}: expected values uint64 and offsets int64 [{n + 1}], got "
                    f"{slot.values.dtype} and {off.dtype} {off.shape}"
                )
            if off[0] != 0 or off[-1] != slot.values.size or np.any(np.diff(off) < 0):
                raise InputError(
                    f"slot {name!r}: offsets must start at 0, not decrease, end at nnz"
                )
