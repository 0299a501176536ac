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
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..errors import CheckpointError

__all__ = ["Ledger"]

log = logging.getLogger(__name__)

LEDGER = "ledger.jsonl"


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
        """Every complete line, in file order (a torn last line is skipped)."""
        if not self.path.is_file():
            return []
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        torn = b"" if data.endswith(b"\n") else lines.pop()
        out = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise CheckpointError(
                    f"{self.path}:{number}: not a JSON line (the ledger is damaged; only a "
                    "torn last line is tolerated)"
                ) from None
        if torn.strip():
            log.warning("%s: ignoring a torn last line (crash during an append)", self.path)
        return out

    def passes(self) -> list[dict]:
        """The effective pass records, ordered by ``seq`` (see the module's rule)."""
        by_seq: dict[int, dict] = {}
        for record in self.records():
            if record.get("kind") == "resume":
                for seq in [s for s in by_seq if s > record["seq"]]:
                    del by_seq[seq]
            elif record.get("kind") == "pass":
                by_seq[int(record["seq"])] = record
        return [by_seq[s] for s in sorted(by_seq)]

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
        effective = {r["seq"]: r for r in self.passes()}
        if restored is not None and restored["seq"] not in effective:
            self.append(restored)
        self.append({"kind": "resume", "seq": seq, "checkpoint": checkpoint})
