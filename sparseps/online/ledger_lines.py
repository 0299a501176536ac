"""What a line of ``ledger.jsonl`` must hold, and the order its records must come in.

:func:`parse_line` reads one line into a record or raises :class:`BadLine` saying what is
wrong with it; :class:`SeqOrder` checks each record's ``seq`` against the lines before it.
:class:`~sparseps.online.ledger.Ledger` adds the file and line number to the message.

A line is one JSON object (UTF-8, each key once) of one of two kinds:

- ``{"kind": "pass", "seq": 3, "day": "20240101", "pass": 3, "splits": [...], "eval":
  {...}, ...}``: ``seq`` and ``pass`` integers >= 0, ``day`` ``YYYYMMDD``, ``splits`` a
  list of folders, ``eval`` an object; when present, ``train`` and ``saved`` are objects,
  ``checkpoint`` a path or null, ``trained`` a boolean, ``samples`` and ``passes``
  integers >= 0 (every version of the driver wrote the required ones);
- ``{"kind": "resume", "seq": S, "checkpoint": PATH or null}``, ``S >= -1``.

Order: a pass record's ``seq`` is one more than the record before it (the pass after
the previous pass, or after the checkpoint a resume record went back to); a resume
record goes back to a pass the lines before it recorded (``S`` at most the previous
record's ``seq``). The first record may have any ``seq`` (a ledger deleted by hand starts
again with the next pass).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BadLine", "SeqOrder", "parse_line"]


class BadLine(ValueError):
    """One line of the ledger is not a record, or not in order (the message says why)."""


def _count(least: int) -> Callable[[object], bool]:
    def accepts(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= least

    return accepts


def _day(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9]{8}", value) is not None


def _folders(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _object(value: object) -> bool:
    return isinstance(value, dict)


def _path_or_null(value: object) -> bool:
    return value is None or isinstance(value, str)


def _boolean(value: object) -> bool:
    return isinstance(value, bool)


@dataclass(frozen=True)
class _Field:
    name: str
    required: bool
    accepts: Callable[[object], bool]
    expected: str


_FIELDS: dict[str, tuple[_Field, ...]] = {
    "pass": (
        _Field("seq", True, _count(0), "an integer >= 0"),
        _Field("day", True, _day, 'a day "YYYYMMDD"'),
        _Field("pass", True, _count(0), "an integer >= 0"),
        _Field("splits", True, _folders, "a list of folders"),
        _Field("eval", True, _object, "an object of metrics"),
        _Field("train", False, _object, "an object of metrics"),
        _Field("saved", False, _object, "an object"),
        _Field("checkpoint", False, _path_or_null, "a path or null"),
        _Field("trained", False, _boolean, "true or false"),
        _Field("samples", False, _count(0), "an integer >= 0"),
        _Field("passes", False, _count(0), "an integer >= 0"),
    ),
    "resume": (
        _Field("seq", True, _count(-1), "an integer >= -1"),
        _Field("checkpoint", True, _path_or_null, "a path or null"),
    ),
}


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}  # fmt: skip


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    record: dict = {}
    for key, value in pairs:
        if key in record:
            raise BadLine(f"the key {key!r} appears twice")
        record[key] = value
    return record


def _shown(value: object, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_line(raw: bytes) -> dict:
    """The record of one ledger line (without its newline).

    Raises:
        BadLine: not UTF-8, not JSON, not an object, an unknown ``kind``, a field missing
            or of the wrong type (the message names it and what it must be).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadLine(f"not UTF-8 text (byte {exc.start})") from None
    try:
        record = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not a JSON line ({exc.msg} at column {exc.colno}; a cut or "
                      "overwritten line?)") from None  # fmt: skip
    except RecursionError:
        raise BadLine("not a record: JSON nested too deeply") from None
    if not isinstance(record, dict):
        raise BadLine(f"not a record: a JSON {_JSON_TYPES[type(record)]}, not an object")
    kind = record.get("kind")
    fields = _FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise BadLine(f'not a record: "kind" must be "pass" or "resume", got {_shown(kind)}'
                      if "kind" in record else 'not a record: it has no "kind"')  # fmt: skip
    for field in fields:
        if field.name not in record:
            if field.required:
                raise BadLine(f'a {kind} record needs "{field.name}" ({field.expected})')
        elif not field.accepts(record[field.name]):
            raise BadLine(f'"{field.name}" of a {kind} record must be {field.expected}, '
                          f"got {_shown(record[field.name])}")  # fmt: skip
    return record


class SeqOrder:
    """Checks that records come in the ledger's order (module docstring), line by line."""

    def __init__(self) -> None:
        self.next: int | None = None  # the seq the next pass record must have
        self.line = 0  # the line of the previous record

    def check(self, record: dict, line: int) -> None:
        """Take the record of ``line``.

        Raises:
            BadLine: its ``seq`` does not follow the records before it.
        """
        seq = int(record["seq"])
        if self.next is not None:
            if record["kind"] == "pass" and seq != self.next:
                raise BadLine(f"pass record seq {seq} out of order: the record of line "
                              f"{self.line} is followed by seq {self.next}")  # fmt: skip
            if record["kind"] == "resume" and seq >= self.next:
                raise BadLine(f"resume record seq {seq} out of order: it goes back to a "
                              f"pass the lines before it do not record (line {self.line} "
                              f"ends at seq {self.next - 1})")  # fmt: skip
        self.next, self.line = seq + 1, line
