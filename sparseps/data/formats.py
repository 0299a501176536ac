"""The input layouts a data file can have (:class:`Format`), and which one a dataset parses.

Apart from the readers (:mod:`.sources`) so that a config naming a format is checked
without loading them (pyarrow, the parsers' kernels).
"""

from __future__ import annotations

from enum import StrEnum

from ..errors import ConfigError

__all__ = ["Format", "parse_format"]


class Format(StrEnum):
    """Input layouts (see docs/data.md for one worked example each)."""

    CRITEO_TSV = "criteo_tsv"  # tab-separated, no header, columns in schema order
    CSV = "csv"  # comma-separated with a header, columns by name
    SLOT_TEXT = "slot_text"  # PaddleRec ``key:value`` tokens
    PARQUET = "parquet"
    MULTISLOT = "multislot"  # Paddle's MultiSlotDataGenerator output: count, then values
    MULTISLOT_STRING = "multislot_string"  # MultiSlotStringDataGenerator: ids hashed


def parse_format(value: str | Format | None, pipe_command: str | None) -> Format:
    """The format to parse (the command's stdout when ``pipe_command`` is set)."""
    if value is None:
        return Format.SLOT_TEXT if pipe_command else Format.CRITEO_TSV
    try:
        fmt = Format(value)
    except ValueError:
        raise ConfigError(
            f"format={value!r} is not one of {', '.join(f.value for f in Format)}"
        ) from None
    if pipe_command and fmt is Format.PARQUET:
        raise ConfigError(
            "format='parquet' cannot read a pipe_command's output (text formats only)"
        )
    return fmt
