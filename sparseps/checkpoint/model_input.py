"""What an inference model reads: the schema, format and pipe command it was trained on.

Every inference save records, in its manifest's ``input`` section, the input of the data
its trainer trained on, so that ``sparseps predict`` and ``sparseps serve`` read rows for
the model as training did, without being told (docs/model_files.md, "The model's input")::

    "input": {"schema": {"label": "click", "extra_labels": [],
                         "dense": ["dense_feature", ... 13 times], "slots": ["1", ..., "26"],
                         "dense_transform": "raw", "id_column": null,
                         "multislot_order": ["click", "1", ..., "26", "dense_feature"]},
              "format": "multislot",
              "pipe_command": "python reader.py", "pipe_dir": "/home/me/job"}

Where the trainer learns it: from the datasets it trains on. A
:class:`~sparseps.data.QueueDataset` or :class:`~sparseps.data.InMemoryDataset` knows its
schema, format and pipe command (``dataset.options``); each ``train_from_dataset`` over
one records them (:class:`~.inference_needs.InferenceNeeds`), the latest one winning, and a
checkpoint keeps them for a resumed job. A pipe command is recorded with the folder it ran
in (the worker's working directory), because Paddle-style commands name their reader
relative to it (``python reader.py``); a reader of the model runs it there. A model trained
on other iterables of batches records nothing, as do saves made before this record: a
reader then falls back to the Criteo schema and says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..data.schema import AVAZU, CRITEO, CRITEO_SLOT, Schema
from ..errors import ConfigError, InputError

__all__ = [
    "NAMED_SCHEMAS",
    "ModelInput",
    "describe_schema",
    "named_schema",
    "schema_from_dict",
    "schema_mismatch",
    "schema_to_dict",
]

NAMED_SCHEMAS: dict[str, Schema] = {"criteo": CRITEO, "criteo_slot": CRITEO_SLOT, "avazu": AVAZU}
_SCHEMA_KEYS = ("label", "extra_labels", "dense", "slots", "dense_transform", "id_column",
                "multislot_order")  # fmt: skip
_SHOWN = 4  # names listed at each end of a long list in a description


def schema_to_dict(schema: Schema) -> dict:
    """The JSON form of a :class:`~sparseps.data.Schema` (every field, lists for tuples)."""
    return {
        "label": schema.label,
        "extra_labels": list(schema.extra_labels),
        "dense": list(schema.dense),
        "slots": list(schema.slots),
        "dense_transform": schema.dense_transform.value,
        "id_column": schema.id_column,
        "multislot_order": (
            None if schema.multislot_order is None else list(schema.multislot_order)
        ),
    }


def schema_from_dict(value: object) -> Schema:
    """The schema of :func:`schema_to_dict`'s form (absent fields take their defaults).

    Raises:
        ConfigError: not a mapping, an unknown field, or a field the schema refuses.
    """
    if not isinstance(value, dict):
        raise ConfigError(f"schema: expected a mapping of Schema fields, got {value!r}")
    unknown = sorted(str(k) for k in value if k not in _SCHEMA_KEYS)
    if unknown or "label" not in value or "slots" not in value:
        raise ConfigError(
            f"schema: needs 'label' and 'slots', and takes only {', '.join(_SCHEMA_KEYS)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    fields = dict(value)
    for key in ("extra_labels", "dense", "slots", "multislot_order"):
        if fields.get(key) is not None:
            if not isinstance(fields[key], list | tuple):
                raise ConfigError(f"schema.{key}: expected a list of names, got {fields[key]!r}")
            fields[key] = tuple(fields[key])
    fields.setdefault("dense", ())
    return Schema(**fields)


def named_schema(value: str) -> Schema:
    """A schema given on a command line: a name of :data:`NAMED_SCHEMAS`, or the path of a
    JSON file holding the fields (:func:`schema_to_dict`'s form).

    Raises:
        ConfigError: neither a name nor a readable JSON schema file (names both choices).
    """
    if value in NAMED_SCHEMAS:
        return NAMED_SCHEMAS[value]
    path = Path(value)
    if not path.is_file():
        raise ConfigError(
            f"--schema {value!r}: not one of {sorted(NAMED_SCHEMAS)} and not a JSON file of "
            "Schema fields"
        )
    try:
        return schema_from_dict(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--schema {value}: not a JSON file of Schema fields ({exc})") from None


def _names(names: tuple[str, ...]) -> str:
    """``'1', '2', ..., '26'``: a list of names, shortened in the middle when long."""
    shown = [repr(n) for n in names]
    if len(shown) > 2 * _SHOWN + 1:
        shown = [*shown[:_SHOWN], "...", *shown[-_SHOWN:]]
    return ", ".join(shown)


def describe_schema(schema: Schema) -> str:
    """The schema in one line, for messages (``label 'click'; 13 dense values ...``)."""
    labels = f"label {schema.label!r}" + (
        f", extra labels {_names(schema.extra_labels)}" if schema.extra_labels else ""
    )
    widths = {name: schema.dense.count(name) for name in dict.fromkeys(schema.dense)}
    dense = ", ".join(f"{n!r}" + (f" x{k}" if k > 1 else "") for n, k in widths.items())
    parts = [
        labels,
        f"{len(schema.dense)} dense values"
        + (f" ({dense}, {schema.dense_transform.value})" if schema.dense else ""),
        f"{len(schema.slots)} slots ({_names(schema.slots)})",
    ]
    if schema.multislot_order is not None:
        parts.append(f"multislot_order ({_names(schema.multislot_order)})")
    return "; ".join(parts)


def schema_mismatch(schema: Schema, slots: tuple[str, ...], dense_width: int | None) -> str | None:
    """Why ``schema`` cannot feed a model whose embeddings read ``slots`` and whose head
    takes ``dense_width`` dense values (None: unknown), or None when it can."""
    missing = [s for s in slots if s not in schema.slots]
    problems = []
    if missing:
        problems.append(
            f"it has no slot {_names(tuple(missing))} (the model's embeddings read them)"
        )
    if dense_width is not None and dense_width != len(schema.dense):
        problems.append(
            f"it has {len(schema.dense)} dense values, the model's head takes {dense_width}"
        )
    return "; ".join(problems) or None


@dataclass(frozen=True)
class ModelInput:
    """The data an inference model was trained on (see the module docstring).

    Attributes:
        schema: the columns of a sample.
        format: a :class:`~sparseps.data.Format` value (``multislot``, ``criteo_tsv``, ...).
        pipe_command: the shell command each file went through, or None.
        pipe_dir: the folder the command ran in (None: the reader's own).
    """

    schema: Schema
    format: str = "criteo_tsv"
    pipe_command: str | None = None
    pipe_dir: str | None = None

    def __post_init__(self) -> None:
        from ..data.formats import parse_format

        if not isinstance(self.schema, Schema):
            raise ConfigError(f"ModelInput.schema: expected a Schema, got {self.schema!r}")
        object.__setattr__(self, "format", parse_format(self.format, self.pipe_command).value)
        if self.pipe_command is not None and not self.pipe_command.strip():
            raise ConfigError("ModelInput.pipe_command: empty (None for no command)")

    @classmethod
    def of_dataset(cls, dataset: object) -> ModelInput | None:
        """What a sparseps dataset reads (None for another iterable of batches)."""
        options = getattr(dataset, "options", None)
        schema = getattr(options, "schema", None)
        if not isinstance(schema, Schema):
            return None
        pipe = getattr(options, "pipe_command", None)
        fmt = getattr(options, "format", None)
        return cls(schema, str(getattr(fmt, "value", fmt)), pipe, os.getcwd() if pipe else None)

    def to_dict(self) -> dict:
        return {
            "schema": schema_to_dict(self.schema),
            "format": self.format,
            "pipe_command": self.pipe_command,
            "pipe_dir": self.pipe_dir,
        }

    @classmethod
    def from_dict(cls, value: object) -> ModelInput:
        """Raises:
        ConfigError: a malformed record (names the field)."""
        if not isinstance(value, dict) or "schema" not in value:
            raise ConfigError(f"input: expected a mapping with a schema, got {value!r}")
        return cls(
            schema_from_dict(value["schema"]),
            value.get("format", "criteo_tsv"),
            value.get("pipe_command"),
            value.get("pipe_dir"),
        )

    def replace(self, **changes: object) -> ModelInput:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> str:
        """One line for messages: the format, the pipe command, then the schema."""
        how = f"format {self.format!r}"
        if self.pipe_command:
            where = f" in {self.pipe_dir}" if self.pipe_dir else ""
            how += f" through the pipe command {self.pipe_command!r}{where}"
        return f"{how}; {describe_schema(self.schema)}"

    def command(self) -> str | None:
        """The shell command to run per file: the pipe command, in ``pipe_dir``.

        Raises:
            InputError: ``pipe_dir`` does not exist here (the model was trained elsewhere).
        """
        if self.pipe_command is None:
            return None
        if self.pipe_dir is None:
            return self.pipe_command
        if not Path(self.pipe_dir).is_dir():
            raise InputError(
                f"this model's pipe command {self.pipe_command!r} ran in {self.pipe_dir}, "
                "which does not exist here; give --pipe-command (run in the current folder), "
                "or --pipe-command '' to read the files as they are"
            )
        return f"cd {shlex.quote(self.pipe_dir)} && {self.pipe_command}"
