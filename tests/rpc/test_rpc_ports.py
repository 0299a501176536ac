"""Ports picked for servers to bind later stay out of the range outgoing connections use,
and no two processes hand out the same one while its server is starting."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparseps.rpc import port_claims, transport
from sparseps.rpc.port_claims import PortClaims

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class _Draws:
    """A stand-in for the random source: hands out the given ports in order."""

    def __init__(self, ports):
        self._ports = iter(ports)

    def randrange(self, low, high):
        port = next(self._ports)
        assert low <= port < high
        return port


@pytest.fixture(autouse=True)
def own_claims(monkeypatch, tmp_path):
    """This test's claims, on a file of its own (not the machine's, which others use)."""
    claims = PortClaims(tmp_path / "ports.lock")
    monkeypatch.setattr(port_claims, "claims", claims)
    return claims


def _two_ports(monkeypatch, tmp_path) -> list[int]:
    """Two ports free now, drawn under claims that the test then leaves behind."""
    ports = transport.free_ports("127.0.0.1", 2)
    monkeypatch.setattr(port_claims, "claims", PortClaims(tmp_path / "fresh.lock"))
    return ports


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
def test_a_port_in_use_or_already_picked_is_drawn_again(monkeypatch, tmp_path):
    a, b, c = transport.free_ports("127.0.0.1", 3)
    monkeypatch.setattr(port_claims, "claims", PortClaims(tmp_path / "fresh.lock"))
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


_HOLDER = """
import sys
from pathlib import Path
from sparseps.rpc.port_claims import PortClaims
claims = PortClaims(Path(sys.argv[1]))
print(claims.claim(int(sys.argv[2])), flush=True)
sys.stdin.read()  # held until the test closes stdin
"""


@pytest.mark.skipif(not RANGE.is_file(), reason="the ephemeral range is read from Linux's /proc")
def test_a_port_another_process_claimed_is_drawn_again_until_it_exits(monkeypatch, tmp_path):
    p, q = _two_ports(monkeypatch, tmp_path)
    lock = port_claims.claims.path
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock), str(p)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "True"  # the other process holds p
        # p is free to bind, but another process is about to: q is handed out instead
        assert transport.free_ports("127.0.0.1", 1, draw=_Draws([p, q])) == [q]
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert transport.free_ports("127.0.0.1", 1, draw=_Draws([p])) == [p]  # released at exit


@pytest.mark.skipif(not RANGE.is_file(), reason="the ephemeral range is read from Linux's /proc")
def test_a_drawn_port_is_held_for_a_while_then_released(monkeypatch, tmp_path):
    p, q = _two_ports(monkeypatch, tmp_path)
    now = [0.0]
    claims = PortClaims(tmp_path / "clock.lock", hold_s=60.0, clock=lambda: now[0])
    monkeypatch.setattr(port_claims, "claims", claims)
    assert transport.free_ports("127.0.0.1", 1, draw=_Draws([p])) == [p]
    now[0] = 59.0  # this process drew p a minute ago: not handed out again yet
    assert transport.free_ports("127.0.0.1", 1, draw=_Draws([p, q])) == [q]
    assert claims.held() == sorted([p, q])
    now[0] = 60.0  # p's claim lapsed (its server has bound it by now, or never will)
    assert claims.held() == [q]
    assert transport.free_ports("127.0.0.1", 1, draw=_Draws([p])) == [p]


def test_without_a_lock_file_claims_are_off(tmp_path):
    claims = PortClaims(tmp_path / "absent" / "ports.lock")  # its folder does not exist
    assert claims.claim(20001) and claims.claim(20001)  # drawing works as before
    assert claims.held() == []
