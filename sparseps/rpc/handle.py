"""``Handle``: the pending result of an asynchronous client call (batch-first, like ps-lite).

Every server call of a :class:`~sparseps.rpc.client.PSClient` ends in :meth:`Handle.wait`
(the synchronous ones too: save, load, stats, ...), so a timeout waiting on a server is
diagnosed here, once for every path (training, evaluation, saves and loads, inference,
the online driver): in a launched job the stacks of every role are dumped first and the
:class:`~sparseps.errors.DeadlineError` names the folder
(:func:`sparseps.observe.diagnose.diagnosed`); elsewhere it is raised as it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import DeadlineError
from ..observe.diagnose import diagnosed
from .channel import Call, Channel
from .replicated import ShardRequest

if TYPE_CHECKING:
    from .protocol import Reply

__all__ = ["Handle", "completed"]


class Handle:
    """The pending result of an asynchronous call; ``wait()`` returns it or raises.

    The outcome is kept: every ``wait()`` after the first returns (or raises) the same.
    A subclass changes how the outcome is collected (:meth:`_collect`) and whether
    waiting threads take turns (:meth:`_settle`), e.g.
    :class:`~sparseps.rpc.keyed.KeyedHandle` (a keyed call: a request per owner).
    """

    def __init__(
        self,
        channel: Channel | None,
        calls: Sequence[Call | ShardRequest],
        finish: Callable[[list], object],
    ) -> None:
        self._channel = channel
        self._calls = list(calls)
        self._finish = finish
        self._lock = threading.Lock()
        self._done = False
        self._value: object = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True when every server answered (``wait`` will not block)."""
        if not self._done and self._channel is not None:
            self._channel.collect()  # replies that arrived are delivered by their readers
        return self._done or all(
            call.done() if isinstance(call, ShardRequest) else call.event.is_set()
            for call in list(self._calls)
        )

    def wait(self, timeout: float | None = None) -> Any:
        """The result (rows for a pull, None for a push).

        Args:
            timeout: seconds; default the client's timeout.

        Raises:
            DeadlineError: a server did not answer in time (in a launched job, naming
                the folder of the stack dumps taken before raising).
            RemoteError: a server raised (carries its type, message and traceback).
            ProtocolError: a server rejected the request as malformed.
        """
        if not self._done:
            self._settle(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def _settle(self, timeout: float | None) -> None:
        # Threads wait without holding a lock (each within its own timeout); the first to
        # finish records the outcome, later ones keep it.
        value, error = self._collect(timeout)
        with self._lock:
            self._keep(value, error)

    def _keep(self, value: object, error: BaseException | None) -> None:
        """Record the outcome unless one is recorded (call holding ``_lock``)."""
        if not self._done:
            self._value, self._error, self._done = value, error, True
            self._calls = []

    def _collect(self, timeout: float | None) -> tuple[object, BaseException | None]:
        calls = self._calls
        if not calls:
            return self._finish([]), None
        channel = self._channel
        assert channel is not None, "only a handle without calls has no channel"
        limit = channel.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        try:
            replies = [self._reply(channel, call, deadline, limit) for call in calls]
            return self._finish(replies), None
        except Exception as exc:
            return None, self._failed(channel, calls, exc)

    @staticmethod
    def _reply(channel: Channel, call: Call | ShardRequest, deadline: float, limit: float) -> Reply:
        if isinstance(call, ShardRequest):
            return call.wait(channel, deadline, limit)
        return channel.wait(call, deadline, limit)

    @staticmethod
    def _failed(
        channel: Channel, calls: Sequence[Call | ShardRequest], exc: Exception
    ) -> BaseException:
        """Forget ``calls`` (late replies are dropped); the error a wait raises for ``exc``
        (a DeadlineError diagnosed: in a launched job, after the stacks are dumped)."""
        for call in calls:
            if isinstance(call, ShardRequest):
                call.forget(channel)
            else:
                channel.forget(call)
        if isinstance(exc, DeadlineError):
            found = diagnosed(exc)
            if found is not exc:
                found.__cause__ = exc
            return found
        return exc


def completed(value: object) -> Handle:
    """A handle that is already resolved to ``value``."""
    return Handle(None, [], lambda _: value)
