"""The server's side of reply slots (:mod:`sparseps.rpc.reply_slots`): the segments it
created for same-host clients, the slot a request names, and their cleanup.

Bounds: each segment is at most ``MAX_SLOTS x MAX_SLOT_BYTES``; all of a server's
together at most :data:`MAX_TOTAL_BYTES` (an attach past it is refused, and that client's
replies use the socket). A segment no request named for :data:`IDLE_S` is dropped (its
client is gone or idle; a request naming it later is answered over the socket with
``"detached"``, and the client attaches again). A segment's name is unlinked by the
client once it has mapped it, or by the server :data:`UNLINK_AFTER_S` after creating it,
whichever comes first; names left behind by a server killed in between are removed by
the next server started on the host (:func:`remove_orphans`).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.closing import Closing
from ..errors import InputError, ProtocolError, ResourceError
from ..rpc.reply_slots import (
    HEADER_BYTES,
    MAX_SLOT_BYTES,
    MAX_SLOTS,
    MIN_SLOT_BYTES,
    SEGMENT_DIR,
    SEGMENT_PREFIX,
    TOKEN_BYTES,
    slot_layout,
)

__all__ = ["IDLE_S", "MAX_TOTAL_BYTES", "ReplySegments", "ServerSlot", "remove_orphans"]

log = logging.getLogger(__name__)

MAX_TOTAL_BYTES = 1 << 30
MAX_SEGMENTS = 256
IDLE_S = 600.0
UNLINK_AFTER_S = 30.0
_SWEEP_EVERY_S = 1.0


class ServerSlot:
    """One slot a request named: where its reply's buffers go.

    A handler may take its output arrays from it (:meth:`array`: rows gathered straight
    into the client's memory); :meth:`place` puts a reply's buffers there, copying the
    ones made elsewhere.
    """

    def __init__(self, memory: np.ndarray) -> None:
        self._memory = memory  # uint8 view of the slot (an export: the map stays open)
        self._taken: list[tuple[np.dtype, tuple[int, ...]]] = []  # what array() gave out

    def array(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray | None:
        """A writable array for the reply's next buffer, in the slot; None if it does not fit."""
        dtype = np.dtype(dtype)
        offsets, end = slot_layout([*self._taken, (dtype, shape)])
        if end > self._memory.nbytes:
            return None
        self._taken.append((dtype, shape))
        return self._memory[offsets[-1] : end].view(dtype).reshape(shape)

    def place(self, bufs: Sequence[np.ndarray]) -> bool:
        """Put ``bufs`` in the slot in order (no copy for those already there); False when
        they do not fit (nothing is copied then: the reply goes over the socket)."""
        described = [(b.dtype, b.shape) for b in bufs]
        offsets, end = slot_layout(described)
        if end > self._memory.nbytes:
            return False
        base = self._memory.ctypes.data
        for offset, buf in zip(offsets, bufs, strict=True):
            if buf.ctypes.data == base + offset:  # made in place by array()
                continue
            target = self._memory[offset : offset + buf.nbytes].view(buf.dtype).reshape(buf.shape)
            np.copyto(target, buf)
        return True


@dataclass(eq=False)
class _Segment:
    id: int
    path: str
    map: mmap.mmap
    slots: int
    slot_bytes: int
    unlink_at: float
    used_at: float = field(default_factory=time.monotonic)
    linked: bool = True

    @property
    def nbytes(self) -> int:
        return HEADER_BYTES + self.slots * self.slot_bytes


class ReplySegments(Closing):
    """The reply segments of one server process (module docstring).

    Args:
        rank: the server's rank (for errors and logs).
        directory: where segment files are created (default ``/dev/shm``; the client
            accepts no other).
    """

    def __init__(self, rank: int, directory: str = SEGMENT_DIR) -> None:
        self.rank = rank
        self.directory = directory
        self._segments: dict[int, _Segment] = {}
        self._closing: list[_Segment] = []  # dropped, but a handler still writes into one
        self._lock = threading.Lock()
        self._next_sweep = 0.0

    def attach(self, slots: int, slot_bytes: int) -> dict:
        """Create a segment of ``slots`` slots of ``slot_bytes``; the attach answer.

        Raises:
            InputError: sizes out of range.
            ResourceError: the server's budget is spent, or the file cannot be made
                (no ``/dev/shm``, or too little room in it).
        """
        if not (1 <= slots <= MAX_SLOTS and MIN_SLOT_BYTES <= slot_bytes <= MAX_SLOT_BYTES):
            raise InputError(
                f"server {self.rank}: attach_replies asks {slots} slots of {slot_bytes} bytes; "
                f"allowed 1..{MAX_SLOTS} slots of {MIN_SLOT_BYTES}..{MAX_SLOT_BYTES} bytes"
            )
        nbytes = HEADER_BYTES + slots * slot_bytes
        with self._lock:
            held = sum(s.nbytes for s in self._segments.values())
            if held + nbytes > MAX_TOTAL_BYTES or len(self._segments) >= MAX_SEGMENTS:
                raise ResourceError(
                    f"server {self.rank}: reply segments hold {held} bytes in {len(self._segments)} "
                    f"segments; one more of {nbytes} would pass the budget of {MAX_TOTAL_BYTES} "
                    "(this client's replies use the socket)"
                )
            segment = self._create(slots, slot_bytes, nbytes)
            self._segments[segment.id] = segment
        token = segment.map[:TOKEN_BYTES]
        return {
            "segment": segment.id,
            "path": segment.path,
            "token": token,
            "slots": slots,
            "slot_bytes": slot_bytes,
        }

    def _create(self, slots: int, slot_bytes: int, nbytes: int) -> _Segment:
        path = os.path.join(self.directory, f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ResourceError(
                f"server {self.rank}: cannot create a reply segment {path}: {exc}"
            ) from exc
        try:
            # reserve the pages now: a write into a sparse file on a full tmpfs is SIGBUS
            os.posix_fallocate(fd, 0, nbytes)
            mapped = mmap.mmap(fd, nbytes)
        except OSError as exc:
            os.unlink(path)
            raise ResourceError(
                f"server {self.rank}: no room for a reply segment of {nbytes} bytes in "
                f"{self.directory}: {exc}"
            ) from exc
        finally:
            os.close(fd)
        mapped[:TOKEN_BYTES] = secrets.token_bytes(TOKEN_BYTES)
        return _Segment(
            id=secrets.randbits(63), path=path, map=mapped, slots=slots, slot_bytes=slot_bytes,
            unlink_at=time.monotonic() + UNLINK_AFTER_S,
        )  # fmt: skip

    def slot(self, segment_id: int, index: int) -> ServerSlot | None:
        """Slot ``index`` of segment ``segment_id``; None when the segment is unknown (this
        server never made it, or dropped it).

        Raises:
            ProtocolError: ``index`` is not one of the segment's slots.
        """
        segment = self._segments.get(segment_id)
        if segment is None:
            return None
        if not 0 <= index < segment.slots:
            raise ProtocolError(f"slot {index} of a reply segment of {segment.slots} slots")
        segment.used_at = time.monotonic()
        start = HEADER_BYTES + index * segment.slot_bytes
        try:
            memory = np.frombuffer(segment.map, np.uint8, segment.slot_bytes, start)
        except ValueError:  # closed by a sweep between the lookup and here
            return None
        return ServerSlot(memory)

    def sweep(self) -> None:
        """Unlink names past their grace, drop idle segments (the server's loop, often)."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_EVERY_S
        with self._lock:
            for segment in list(self._segments.values()):
                idle = now - segment.used_at >= IDLE_S
                if segment.linked and (idle or now >= segment.unlink_at):
                    _unlink(segment)
                if idle:
                    del self._segments[segment.id]
                    self._closing.append(segment)
            self._closing = [s for s in self._closing if not _closed(s)]

    def close(self) -> None:
        """Unlink and unmap every segment (at the server's stop)."""
        with self._lock:
            dropped = [*self._segments.values(), *self._closing]
            self._segments.clear()
            self._closing = []
        for segment in dropped:
            _unlink(segment)
            _closed(segment)

    @property
    def count(self) -> int:
        """Segments held now."""
        return len(self._segments)


def _unlink(segment: _Segment) -> None:
    segment.linked = False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(segment.path)


def _closed(segment: _Segment) -> bool:
    """Unmap ``segment``; False while a handler still holds an array in it."""
    try:
        segment.map.close()
    except BufferError:
        return False
    return True


def remove_orphans(directory: str = SEGMENT_DIR) -> int:
    """Unlink segment names whose server process is gone (killed between creating one
    and its client mapping it); returns how many."""
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not name.startswith(SEGMENT_PREFIX):
                continue
            pid = name[len(SEGMENT_PREFIX) :].split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to clean
        return True
    return True
