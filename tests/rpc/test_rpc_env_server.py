"""A server started from the launcher's environment (DESIGN §2.2), without the launcher.

Issue 3, must-show 6: with the SPARSEPS_* variables set, the user-facing
``sps.init(); sps.run_server()`` serves, and a PSClient reaches it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.env import Role, RoleEnv
from sparseps.errors import ConfigError
from sparseps.rpc.client import PSClient
from sparseps.rpc.transport import free_port
from sparseps.server import run_from_env
from sparseps.table import SparseTable

pytestmark = pytest.mark.timeout(60)


def test_server_from_environment_variables(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")},
        "SPARSEPS_ROLE": "server",
        "SPARSEPS_RANK": "0",
        "SPARSEPS_SERVERS": endpoint,
        "SPARSEPS_WORKER_NUM": "1",
        "SPARSEPS_MASTER": f"127.0.0.1:{free_port()}",
        "SPARSEPS_LOG_DIR": str(tmp_path),
        "SPARSEPS_JOB_ID": "test-job",
    }
    code = "import sparseps as sps; sps.init(); sps.run_server()"
    process = subprocess.Popen(
        [sys.executable, "-c", code], env=environ, stderr=subprocess.PIPE, text=True
    )
    try:
        # the server belongs to job "test-job": clients of that job only
        with PSClient([endpoint], timeout=20, job_id="test-job") as client:
            assert client.ping()[0]["pid"] == process.pid
            config = TableConfig(name="emb", dim=4, rule=optim.SGD(lr=1.0), seed=5)
            reference = SparseTable(config)
            client.create_table(config)
            keys = np.array([3, 1, 3], dtype=np.uint64)
            grads = np.ones((3, 4), np.float32)
            before = client.pull("emb", keys).wait()
            np.testing.assert_array_equal(before, reference.pull(keys))
            assert before.any()  # the initial rows are not all zeros, so a no-op would show
            client.push("emb", keys, grads).wait()
            reference.push(keys, grads)
            after = client.pull("emb", keys).wait()
            np.testing.assert_array_equal(after, reference.pull(keys))
            # key 3 appears twice: its two gradients are summed before the SGD step.
            np.testing.assert_allclose(before - after, [[2] * 4, [1] * 4, [2] * 4])
            assert client.stats()["servers"][0]["tables"]["emb"]["rows"] == 2
            client.stop_servers()
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 0, stderr
    assert f"running server with rank id: 0, endpoint: {endpoint}" in stderr


def test_run_from_env_refuses_a_worker_role():
    worker = RoleEnv(Role.WORKER, 0, ("127.0.0.1:1",), 1, "127.0.0.1:2", "log", "job")
    with pytest.raises(ConfigError, match="SPARSEPS_ROLE must be 'server'"):
        run_from_env(worker)
    with pytest.raises(ConfigError, match="local mode"):
        run_from_env(None)
