"""The servers' table lock: readers share it, a writer has it alone, a waiting writer
holds back new readers, and an exception inside either releases it."""

from __future__ import annotations

import threading

import pytest

from sparseps.server.entries import RWLock

_WAIT_S = 5.0


def _start(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_two_readers_hold_it_at_once():
    lock = RWLock()
    inside = threading.Barrier(2, timeout=_WAIT_S)

    def reader():
        with lock.read():
            inside.wait()  # both inside together, or the barrier times out

    threads = [_start(reader) for _ in range(2)]
    for thread in threads:
        thread.join(_WAIT_S)
        assert not thread.is_alive()


def test_a_writer_waits_for_the_reader_and_new_readers_wait_for_the_writer():
    lock = RWLock()
    order: list[str] = []
    reading, release = threading.Event(), threading.Event()

    def first_reader():
        with lock.read():
            reading.set()
            release.wait(_WAIT_S)
            order.append("reader 1 out")

    def writer():
        with lock.write():
            order.append("writer in")

    def late_reader():
        with lock.read():
            order.append("reader 2 in")

    threads = [_start(first_reader)]
    assert reading.wait(_WAIT_S)
    threads.append(_start(writer))
    _until(lambda: lock._waiting_writers == 1)
    threads.append(_start(late_reader))  # must queue behind the waiting writer
    release.set()
    for thread in threads:
        thread.join(_WAIT_S)
        assert not thread.is_alive()
    assert order == ["reader 1 out", "writer in", "reader 2 in"]


@pytest.mark.parametrize("side", ["read", "write"])
def test_an_exception_inside_releases_it(side):
    lock = RWLock()
    with pytest.raises(RuntimeError), getattr(lock, side)():
        raise RuntimeError("inside")
    done = threading.Event()

    def writer():
        with lock.write():
            done.set()

    _start(writer)
    assert done.wait(_WAIT_S), f"a {side} held across an exception blocks the next writer"


def _until(condition) -> None:
    deadline = threading.Event()
    for _ in range(500):
        if condition():
            return
        deadline.wait(0.01)
    raise AssertionError("condition not reached in 5 s")
