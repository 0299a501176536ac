"""A census of a running job's listening sockets, and the probe an outsider would try.

- :func:`job_processes`: every process of a job: its launchers, what their ``pids.json``
  lists (roles, fork servers) and every descendant of those, read from ``/proc``.
- :func:`listening`: the TCP sockets (IPv4 and IPv6) a process listens on, from its
  file descriptors' socket inodes and ``/proc/PID/net/tcp*``.
- :func:`probe`: a peer without the job's secret key, as CURVE clients of two socket types
  (a DEALER, as the stores' and servers' ROUTERs take; a PUSH, as the worker group's PULL
  takes) that know the job's *public* key. Only a CURVE server that proves it holds the
  job's secret and whose ZAP handler refuses this key answers ``refused``
  (``EVENT_HANDSHAKE_FAILED_AUTH``); plain TCP (gloo), HTTP, a plain zmq socket or a
  socket with other keys answer something else. :func:`probe_all` probes many listeners,
  every probe at once: the type a listener does not take never answers (a ROUTER fails a
  PUSH's handshake with no detail and the PUSH retries), so each listener costs one
  probe's whole ``PROBE_S``, and one after another a job's six cost 30 s of waiting.
- :func:`flood`: raw bytes into a port (they must change nothing).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

PROBE_S = 5.0


def _children_of() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def job_processes(launchers: list[int], log_dirs: list[Path]) -> dict[int, str]:
    """``{pid: what it is}`` for every live process of the job."""
    named = {pid: "launcher" for pid in launchers}
    for log_dir in log_dirs:
        record = json.loads((log_dir / "pids.json").read_text())
        for child in record["children"]:
            named[child["pid"]] = f"{child['role']} {child['rank']}"
        for pid in record.get("fork_servers", []):
            named[pid] = "fork server"
    children = _children_of()
    todo = list(named)
    while todo:
        parent = todo.pop()
        for pid in children.get(parent, []):
            if pid not in named:
                named[pid] = f"child of {named[parent]} ({parent})"
                todo.append(pid)
    return {pid: what for pid, what in named.items() if Path(f"/proc/{pid}").exists()}


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def _address(hex_address: str, ipv6: bool) -> tuple[str, int]:
    ip, port = hex_address.split(":")
    raw = bytes.fromhex(ip)
    if ipv6:  # four little-endian 32-bit words
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw), int(port, 16)
    return socket.inet_ntoa(raw[::-1]), int(port, 16)


def listening(pid: int) -> list[tuple[str, int]]:
    """``(ip, port)`` of every TCP socket ``pid`` listens on."""
    inodes = _socket_inodes(pid)
    found = []
    for table, ipv6 in (("tcp", False), ("tcp6", True)):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in inodes:  # 0A: LISTEN
                found.append(_address(fields[1], ipv6))
    return found


def _endpoint(ip: str, port: int) -> str:
    if ip in ("0.0.0.0", "::"):
        ip = "127.0.0.1" if ip == "0.0.0.0" else "::1"
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def _one_probe(context: zmq.Context, kind: int, ip: str, port: int, server_key: bytes) -> str:
    public, secret = zmq.curve_keypair()  # not the job's pair
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IPV6, int(":" in ip))
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_key, public, secret
    monitor = sock.get_monitor_socket()
    sock.connect(_endpoint(ip, port))
    seen = []
    deadline = time.monotonic() + PROBE_S
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not monitor.poll(int(left * 1000) + 1):
                break
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                return "refused"
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return "ACCEPTED"
            seen.append(zmq.Event(event).name)
        return f"no CURVE refusal ({', '.join(dict.fromkeys(seen)) or 'no answer'})"
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


KINDS = (zmq.DEALER, zmq.PUSH)


def _verdict(answers: list[str]) -> str:
    if "ACCEPTED" in answers or "refused" not in answers:
        return "; ".join(answers)
    return "refused"


def probe(ip: str, port: int, job_public: bytes) -> str:
    """``"refused"`` when the listener is a CURVE server of the job that refuses a key
    other than the job's; else what the probes saw."""
    return probe_all([(ip, port)], job_public)[0]


def probe_all(addresses: list[tuple[str, int]], job_public: bytes) -> list[str]:
    """:func:`probe` of each ``(ip, port)``, in order, every probe in a thread of its own
    (each with its own socket and its whole ``PROBE_S``: what each sees is what it saw
    one after another)."""
    context = zmq.Context()
    try:
        with ThreadPoolExecutor(max(1, len(addresses) * len(KINDS))) as pool:
            futures = [
                [pool.submit(_one_probe, context, kind, ip, port, job_public) for kind in KINDS]
                for ip, port in addresses
            ]
            return [_verdict([f.result() for f in answers]) for answers in futures]
    finally:
        context.term()


def flood(ip: str, port: int, nbytes: int = 1 << 20) -> None:
    """Connect and send ``nbytes`` of junk, as a raw TCP peer."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(PROBE_S)
        try:
            sock.connect((ip, port))
            sock.sendall(os.urandom(1024) * (nbytes // 1024))
        except OSError:  # refused or reset mid-way: nothing more to send
            pass
