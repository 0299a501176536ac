"""Ports picked for servers to bind later stay out of the range outgoing connections use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sparseps.rpc import transport

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class _Draws:
    """A stand-in for the random source: hands out the given ports in order."""

    def __init__(self, ports):
        self._ports = iter(ports)

    def randrange(self, low, high):
        port = next(self._ports)
        assert low <= port < high
        return port


@pytest.mark.skipif(not RANGE.is_file(), reason="the ephemeral range is read from Linux's /proc")
def test_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    first = int(RANGE.read_text().split()[0])
    ports = transport.free_ports("127.0.0.1", 8)
    assert len(set(ports)) == 8
    assert all(transport.LISTEN_PORTS_FROM <= p < first for p in ports)
    for port in ports:  # free now: a listener can take each
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.skipif(not RANGE.is_file(), reason="the ephemeral range is read from Linux's /proc")
def test_a_port_in_use_or_already_picked_is_drawn_again():
    a, b, c = transport.free_ports("127.0.0.1", 3)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", a))
        listener.listen()
        # a is in use, b is drawn twice: the picks are b and c
        assert transport.free_ports("127.0.0.1", 2, draw=_Draws([a, b, b, c])) == [b, c]


def test_without_the_range_the_kernel_chooses(monkeypatch, tmp_path):
    monkeypatch.setattr(transport, "_EPHEMERAL_RANGE", tmp_path / "absent")
    ports = transport.free_ports("127.0.0.1", 3, draw=_Draws([]))  # never asked to draw
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)


def test_a_host_of_another_machine_is_an_error():
    with pytest.raises(OSError):
        transport.free_ports("192.0.2.1", 1)  # TEST-NET-1: never an address of this host
