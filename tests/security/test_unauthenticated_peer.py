"""A secure server buffers nothing from a peer without the job's key (issue 13, items 8, 9).

The server runs as its own process, started from the launcher's environment
(``SPARSEPS_SECURE``/``SPARSEPS_KEY_DIR``), so this also covers the plumbing from the
environment to the server's socket. Peers with a wrong key, with no key, and a raw TCP
socket each send large messages and a well-formed ``stop``; afterwards the server's
request counters have not moved, its memory has not grown by the bytes sent, and it
still serves the job's own client.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from _securetools import job_security

from sparseps.rpc.client import PSClient
from sparseps.rpc.protocol import encode_request
from sparseps.rpc.security import JobKeys, Security
from sparseps.rpc.transport import free_port, send_frames

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
JOB = "secure-test-job"
MESSAGE_BYTES = 64 << 20
MESSAGES = 4  # per peer: 256 MiB each, far above the allowed growth


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _server_process(endpoint: str, key_dir: Path, log_dir: Path) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    environ.update(
        PYTHONPATH=str(ROOT), SPARSEPS_ROLE="server", SPARSEPS_RANK="0",
        SPARSEPS_SERVERS=endpoint, SPARSEPS_WORKER_NUM="1",
        SPARSEPS_MASTER=f"127.0.0.1:{free_port()}", SPARSEPS_LOG_DIR=str(log_dir),
        SPARSEPS_JOB_ID=JOB, SPARSEPS_SECURE="1", SPARSEPS_KEY_DIR=str(key_dir),
    )  # fmt: skip
    code = "import sparseps as sps; sps.init(); sps.run_server()"
    return subprocess.Popen(
        [sys.executable, "-c", code], env=environ, stderr=subprocess.PIPE, text=True
    )


def _attack_with_zmq(endpoint: str, security: Security | None) -> None:
    """A zmq peer (wrong key or none) that queues big messages and a valid stop."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, MESSAGES + 2)
    if security is not None:
        security.client_socket(sock)
    sock.connect(f"tcp://{endpoint}")
    big = np.ones(MESSAGE_BYTES // 8, dtype=np.uint64)
    for i in range(MESSAGES):
        try:
            send_frames(
                sock, encode_request("pull", i + 1, "emb", [big], job=JOB), flags=zmq.NOBLOCK
            )
        except zmq.Again:  # the peer's own queue is full: nothing got through
            break
    with contextlib.suppress(zmq.Again):
        send_frames(sock, encode_request("stop", 99, job=JOB), flags=zmq.NOBLOCK)
    time.sleep(1.5)  # the attack: its socket stays open through several reconnect attempts
    sock.close()
    context.term()


def _attack_with_raw_tcp(endpoint: str) -> int:
    """A ZMTP 3.0 greeting that claims the NULL mechanism, then a flood of frame bytes."""
    host, port = endpoint.rsplit(":", 1)
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
    greeting += b"\x00" + b"\x00" * 31
    frame_header = b"\x02" + (MESSAGE_BYTES).to_bytes(8, "big")  # a long frame
    chunk = b"\xab" * (1 << 20)
    sent = 0
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        try:
            raw.sendall(greeting + frame_header)
            while sent < MESSAGES * MESSAGE_BYTES:
                raw.sendall(chunk)
                sent += len(chunk)
        except OSError:  # the server closed the connection: the point of the test
            pass
    return sent


def test_unauthenticated_peers_are_never_buffered_nor_served(tmp_path):
    security = job_security(tmp_path / "job")
    intruder = job_security(tmp_path / "intruder")
    endpoint = f"127.0.0.1:{free_port()}"
    process = _server_process(endpoint, tmp_path / "job", tmp_path)
    try:
        with PSClient([endpoint], timeout=30, security=security, job_id=JOB) as client:
            assert client.ping()[0]["pid"] == process.pid
            before = client.stats()["servers"][0]
            rss_before = _rss_bytes(process.pid)

            _attack_with_zmq(endpoint, intruder)  # another job's key pair
            # Knows the job's public key, not its secret: reaches ZAP, which refuses it.
            public, secret = zmq.curve_keypair()
            _attack_with_zmq(endpoint, _KnowsPublic(security.keys.public, public, secret))
            _attack_with_zmq(endpoint, None)  # no key at all
            raw_sent = _attack_with_raw_tcp(endpoint)

            time.sleep(0.5)  # nothing must happen: give a stop that got through time to act
            assert process.poll() is None, "an unauthenticated peer stopped the server"
            after = client.stats()["servers"][0]
            rss_after = _rss_bytes(process.pid)
            # Only our own stats call reached the handlers; nothing was rejected as bad
            # either: the messages never got past the transport.
            assert after["requests"] == before["requests"] + 1
            assert after["bad_messages"] == before["bad_messages"]
            # 3 x 256 MiB were queued at the server by zmq peers, and the raw socket wrote
            # what the kernel would take before the server hung up.
            assert rss_after - rss_before < 32 << 20, (rss_before, rss_after, raw_sent)
            assert raw_sent < MESSAGES * MESSAGE_BYTES  # the server hung up on the flood
            client.stop_servers()
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 0, stderr
    assert "not the job's key" in stderr  # the ZAP handler logged the impostor


class _KnowsPublic(Security):
    def __init__(self, server_key: bytes, public: bytes, secret: bytes) -> None:
        super().__init__(JobKeys(public, secret))
        self._server_key = server_key

    def client_socket(self, sock) -> None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, self._server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)
