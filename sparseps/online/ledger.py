"""``ledger.jsonl``: the record of completed passes, in the model directory.

One JSON object per line, appended and fsynced by worker 0. Two kinds of line:

- a pass record ``{"kind": "pass", "seq", "day", "pass", "splits", "eval", "train",
  "saved": {...}, ...}`` once the pass is trained and its saves are done;
- a resume record ``{"kind": "resume", "seq": S, "checkpoint": PATH}`` when a job
  restarts from the checkpoint that holds every pass up to ``seq == S`` (``-1``: none).

**Rule.** The model a restart continues from is the newest complete checkpoint, so a pass
is *completed* only if a checkpoint holds it. Pass records written after that checkpoint
(the job crashed before the next one) are superseded by the resume record and the passes
are trained again; :meth:`Ledger.passes` returns the effective history (for each ``seq``
the latest record not superseded). The checkpoint's manifest state carries the record of
its own pass, so a crash between the checkpoint and the ledger append loses nothing: the
resume restores the record. Hence the effective ledger of a job that crashed and resumed
equals that of an uninterrupted run: every pass appears once, in order, none skipped.
A torn last line (a crash mid-append) is ignored on read and cut off on the next append.

Any other damage stops the job before it trains: every line must be a record of one of
the two kinds, with its fields and their types, in order (:mod:`.ledger_lines`); a line
that is not, or a file that cannot be read, raises :class:`LedgerError` naming the file,
the line and what is wrong (``sparseps online`` prints it as its one error line and
records it in ``status.json``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..errors import CheckpointError
from .ledger_lines import BadLine, SeqOrder, parse_line

__all__ = ["Ledger", "LedgerError"]

log = logging.getLogger(__name__)

LEDGER = "ledger.jsonl"
# what a message about a damaged line tells the user to do
_REPAIR = (
    "the ledger is damaged: repair or delete that line (one JSON record per line, "
    'docs/online.md "Model directory"; the model is in the checkpoints, the ledger is its '
    "history), then run the job again"
)


class LedgerError(CheckpointError):
    """``ledger.jsonl`` cannot be read: the message names the file, the line and why."""


class Ledger:
    """Append-only pass records of a model directory.

    Args:
        path: the ``ledger.jsonl`` file (created on first append).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, model_dir: str | os.PathLike) -> Ledger:
        return cls(Path(model_dir) / LEDGER)

    def records(self) -> list[dict]:
        """Every complete line's record, in file order (a torn last line is skipped).

        Raises:
            LedgerError: the file cannot be read, or a line is not a record or not in
                order (:mod:`sparseps.online.ledger_lines`); the message names the line.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise LedgerError(
                f"{self.path}: cannot read the ledger ({exc.strerror or exc}); it must be a "
                "readable file of pass records (or absent, for a new model directory)"
            ) from None
        lines = data.split(b"\n")
        torn = b"" if data.endswith(b"\n") else lines.pop()
        out = []
        order = SeqOrder()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = parse_line(line)
                order.check(record, number)
            except BadLine as exc:
                raise LedgerError(f"{self.path}:{number}: {exc}; {_REPAIR}") from None
            out.append(record)
        if torn.strip():
            log.warning("%s: ignoring a torn last line (crash during an append)", self.path)
        return out

    def passes(self) -> list[dict]:
        """The effective pass records, ordered by ``seq`` (see the module's rule).

        Raises:
            LedgerError: the ledger cannot be read (:meth:`records`).
        """
        return _effective(self.records())

    def append(self, record: dict) -> None:
        """Append one record and fsync it (worker 0 only)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with open(self.path, "ab+") as f:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":  # a torn line from a crash: cut it off
                    f.seek(0)
                    keep = f.read().rsplit(b"\n", 1)[0]
                    f.truncate(len(keep) + 1 if keep else 0)
                    f.seek(0, os.SEEK_END)
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def resume(self, seq: int, checkpoint: str | None, restored: dict | None) -> None:
        """Record a restart from the checkpoint holding passes ``<= seq``.

        ``restored``: the pass record stored in that checkpoint; appended first if the
        ledger lacks it (crash between the checkpoint and the ledger append).
        """
        records = self.records()
        effective = {r["seq"] for r in _effective(records)}
        if restored is not None and restored["seq"] not in effective:
            held = restored["seq"]
            following = records[-1]["seq"] + 1 if records else held
            if held > following:  # appended after them, the record would be out of order
                raise LedgerError(
                    f"{self.path}: the newest checkpoint {checkpoint} holds pass seq {held}, "
                    f"but the ledger's records end before seq {following}: the records of "
                    f"passes {following}..{held - 1} are missing (lines deleted, or an older "
                    "copy of the file?); put them back, or move the file away to start the "
                    "history again with the next pass"
                )
            if held == following:
                self.append(restored)
            else:  # the ledger starts after it (its first lines were deleted): history lost
                log.warning("%s: starts after pass seq %d of checkpoint %s; not recorded",
                            self.path, held, checkpoint)  # fmt: skip
        self.append({"kind": "resume", "seq": seq, "checkpoint": checkpoint})


def _effective(records: list[dict]) -> list[dict]:
    """Per ``seq`` the latest pass record no resume record superseded, by ``seq``."""
    by_seq: dict[int, dict] = {}
    for record in records:
        if record["kind"] == "resume":
            for seq in [s for s in by_seq if s > record["seq"]]:
                del by_seq[seq]
        else:
            by_seq[record["seq"]] = record
    return [by_seq[s] for s in sorted(by_seq)]
