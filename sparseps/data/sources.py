"""Which files a worker reads, and reading one file in a given format.

File split rule: the inputs (files, and folders = their files) are expanded, sorted by
path and deduplicated into the job's file list; worker ``rank`` of ``world`` reads
``files[rank::world]``. Every worker computes the same list, so every file is read by
exactly one worker; with more workers than files some read nothing. A file's position in
the full list is its ``file_no`` (used in sample ids).

Compressed text files (gzip, zstd, bzip2, LZ4 frames; Criteo's own logs ship as ``.gz``)
are read as they are, recognised by their first bytes rather than their names, and
decompressed as they stream (pyarrow's codecs). A ``pipe_command`` gets the file's bytes
unchanged (``zcat`` in it keeps working).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from ..errors import ConfigError, InputError
from .columns import Parsed
from .delimited import header_names, parse_delimited
from .formats import Format
from .multislot import parse_multislot
from .parquet import read_parquet
from .pipe import pipe_chunks
from .schema import Schema
from .slot_text import parse_slot_text

__all__ = ["Format", "expand_files", "guess_format", "read_file", "shard"]

CHUNK_BYTES = 8 << 20  # text is parsed in pieces of about this size (whole lines)


def _is_data_file(path: Path) -> bool:
    # skip hidden files and markers such as _SUCCESS, like Hadoop-style writers do
    return path.is_file() and not path.name.startswith((".", "_"))


def expand_files(inputs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The sorted, deduplicated list of files named by ``inputs`` (files or folders).

    A folder stands for the files directly inside it (not sub-folders), without names
    starting with ``.`` or ``_``.

    Raises:
        InputError: an input does not exist (names it).
    """
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    found: set[str] = set()
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found.update(str(p) for p in path.iterdir() if _is_data_file(p))
        elif path.is_file():
            found.add(str(path))
        else:
            raise InputError(f"data file or folder {str(item)!r} does not exist")
    return sorted(found)


def shard(files: Sequence[str], rank: int, world: int) -> list[tuple[int, str]]:
    """``(file_no, path)`` of the files worker ``rank`` of ``world`` reads."""
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"rank={rank}, world={world}: need world >= 1 and 0 <= rank < world")
    return [(no, files[no]) for no in range(rank, len(files), world)]


def _line_chunks(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """Re-cut byte pieces into chunks of whole lines of about CHUNK_BYTES."""
    rest = b""
    pending: list[bytes] = []
    size = 0
    for piece in pieces:
        pending.append(piece)
        size += len(piece)
        if size < CHUNK_BYTES:
            continue
        data = rest + b"".join(pending)
        pending, size = [], 0
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            rest = data
            continue
        chunk, rest = data[:cut], data[cut:]
        yield chunk
    data = rest + b"".join(pending)
    if data:
        yield data


# (first bytes, pyarrow codec) of the compressed files a text reader takes as they are
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x04\x22\x4d\x18", "lz4"),  # the LZ4 frame format
    *((b"BZh" + bytes([d]), "bz2") for d in b"123456789"),  # "BZh" + block size
)


def compression_of(path: str) -> str | None:
    """The codec ``path`` is compressed with, from its first bytes (None: not compressed)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return next((codec for magic, codec in _COMPRESSED if head.startswith(magic)), None)


def _file_pieces(path: str) -> Generator[bytes, None, None]:
    codec = compression_of(path)
    try:
        with pa.input_stream(path, compression=codec) as f:
            while piece := f.read(CHUNK_BYTES):
                yield piece
    except (OSError, pa.ArrowInvalid) as exc:
        why = f"its {codec} stream is truncated or corrupt" if codec else "a read failed"
        raise InputError(
            f"data file {path!r} cannot be read ({why}: {exc}); copy it again, or leave it out"
        ) from exc


def read_file(path: str, file_no: int, schema: Schema, fmt: Format, *,
              pipe_command: str | None = None, pipe_timeout: float = 300.0) -> Iterator[Parsed]:  # fmt: skip
    """Parse one file (or a command's output for it) chunk by chunk.

    A 0-byte file gives no rows in every format (without a ``pipe_command``, whose
    output is what counts).

    Raises:
        InputError: the file is missing or unreadable, a header lacks schema columns, or
            the pipe command failed.
    """
    if not os.path.isfile(path):
        raise InputError(
            f"data file {path!r} does not exist (was it moved after the dataset was made?)"
        )
    if not pipe_command and os.path.getsize(path) == 0:
        # An empty file is an empty part of the data (a writer that had no rows for it),
        # in every format: Parquet would otherwise reject it for lacking a footer.
        return
    if fmt is Format.PARQUET:
        yield from read_parquet(path, schema, file_no=file_no)
        return
    pieces = (
        pipe_chunks(pipe_command, path, timeout=pipe_timeout)
        if pipe_command
        else _file_pieces(path)
    )
    # closed on every way out (a parse error, a reader that stops early): a pipe_command's
    # whole process group is stopped then, not when the garbage collector gets to it
    with contextlib.closing(pieces):
        yield from _parse_pieces(pieces, path, file_no, schema, fmt)


def _parse_pieces(pieces: Iterator[bytes], path: str, file_no: int, schema: Schema,
                  fmt: Format) -> Iterator[Parsed]:  # fmt: skip
    names, delimiter = schema.columns(), "\t"
    record, line = 0, 1
    want_text = True  # keep the text of a file's first bad lines (for the format hint)
    for index, chunk in enumerate(_line_chunks(pieces)):
        if fmt is Format.CSV:
            delimiter = ","
            if index == 0:  # the header: first line of the first chunk
                cut = chunk.find(b"\n") + 1 or len(chunk)
                names = header_names(chunk[:cut], delimiter, schema, path)
                chunk, line = chunk[cut:], line + 1
                if not chunk:
                    continue
        try:
            parsed = parse_text(chunk, schema, fmt, names=names, delimiter=delimiter,
                                first_line=line, file_no=file_no, first_record=record)  # fmt: skip
        except pa.ArrowInvalid as exc:  # not text at all (pyarrow's reader gave up)
            raise InputError(
                f"data file {path!r}, lines from {line}: cannot be read as {fmt} text "
                f"({str(exc)[:70]!r}...); "
                "is it a binary file, or compressed in a format other than gzip, zstd, bzip2 "
                "or LZ4?"
            ) from exc
        if parsed.bad and parsed.examples and want_text:
            want_text = False  # error path only: split this one chunk into lines
            text = chunk.split(b"\n")
            parsed.bad_text = [text[n - line] for n, _ in parsed.examples if n - line < len(text)]
        record += len(parsed.batch)
        line += parsed.lines
        yield parsed


def parse_text(chunk: bytes, schema: Schema, fmt: Format, *, names: tuple[str, ...] | None = None,
               delimiter: str = "\t", first_line: int = 1, file_no: int = 0,
               first_record: int = 0) -> Parsed:  # fmt: skip
    """Parse a chunk of whole lines of a text format (CSV: without its header)."""
    where = {"first_line": first_line, "file_no": file_no, "first_record": first_record}
    if fmt is Format.SLOT_TEXT:
        return parse_slot_text(chunk, schema, **where)
    if fmt in (Format.MULTISLOT, Format.MULTISLOT_STRING):
        return parse_multislot(chunk, schema, hash_ids=fmt is Format.MULTISLOT_STRING, **where)
    return parse_delimited(chunk, schema, names or schema.columns(), delimiter, **where)


# the formats a bad pass's lines are tried in, in this order (CSV needs its header)
_GUESSES = (Format.CRITEO_TSV, Format.SLOT_TEXT, Format.MULTISLOT, Format.MULTISLOT_STRING)


def guess_format(text: bytes, schema: Schema, current: Format) -> str | None:
    """Another text format in which every line of ``text`` parses cleanly, or None."""
    for fmt in _GUESSES:
        if fmt is current or (current is Format.CSV and fmt is Format.CRITEO_TSV):
            continue
        parsed = parse_text(text, schema, fmt)
        if parsed.bad == 0 and len(parsed.batch) > 0:
            return fmt.value
    return None
