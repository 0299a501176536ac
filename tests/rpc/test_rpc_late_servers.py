"""A job's workers start with its servers, not after them: a client's first table-wide op
waits for a server that is still starting (up to the client's timeout), instead of
failing after the 5 s in which a later probe skips a silent server."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np

import sparseps as sps
from sparseps.launch.spec import free_ports
from sparseps.testing.environ import clean_environ

LATE_S = 6.0  # past the later probes' 5 s


def test_the_first_op_waits_for_a_server_still_starting(tmp_path):
    endpoint = f"127.0.0.1:{free_ports('127.0.0.1', 1)[0]}"
    servers: list[subprocess.Popen] = []

    def start_late() -> None:
        time.sleep(LATE_S)
        with open(tmp_path / "server.log", "wb") as log:
            servers.append(subprocess.Popen(
                [sys.executable, "-m", "sparseps.server", "--rank", "0", "--endpoints", endpoint],
                env=clean_environ(), stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip

    starter = threading.Thread(target=start_late)
    began = time.monotonic()
    starter.start()
    try:
        with sps.PSClient([endpoint], timeout=60) as client:
            client.create_table(sps.TableConfig(name="emb", dim=4, rule=sps.optim.SGD(lr=0.5)))
            waited = time.monotonic() - began
            assert client.pull("emb", np.array([1, 2], np.uint64)).wait().shape == (2, 4)
            client.stop_servers()
        assert waited >= LATE_S
    finally:
        starter.join()
        for server in servers:
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    assert servers and servers[0].returncode == 0
