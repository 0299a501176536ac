"""A two-node Ray cluster on this machine, for the Ray backend's tests
(tests/launch/test_ray_backend.py, tests/launch/test_ray_heter.py; the fixture is in
tests/launch/conftest.py).

``ray start --head`` and a second node with a custom resource ``node_b`` (``ray start
--address ...``), both on this machine and sharing one short temp dir; stopped by pid.
Jobs are placed across the two nodes by giving roles ``node_b`` resources. The two nodes
use the loopback addresses 127.0.0.2 and 127.0.0.3: Ray replaces 127.0.0.1 (and only it)
by the machine's network address, and Linux routes all of 127/8 to lo, so every socket of
a job stays on loopback.

One cluster serves every Ray test of a run: it starts for the first test that asks and
stops once the next test does not need it (its start is ~20 s of a loaded 2-core box).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from .jobs import alive, clean_env, finish, free_port, launch_argv, processes_with
from .wait import wait_until

__all__ = [
    "ANYWHERE",
    "HEAD",
    "NODE_B",
    "ON_B",
    "LocalRayCluster",
    "actor_pids",
    "ray_env",
    "ray_launch",
]

RAY = Path(sys.executable).with_name("ray")
HEAD, NODE_B = "127.0.0.2", "127.0.0.3"
ON_B = '{"CPU": 0.5, "node_b": 0.1}'  # a worker or server with this lands on node_b
ANYWHERE = '{"CPU": 0.5}'


def _descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (from /proc's parent links)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                continue
    found, grew = set(roots), True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def _cluster_pids(temp_dir: str, address: str) -> set[int]:
    """Every process of the Ray cluster whose session lives in ``temp_dir``, and the head's
    Ray client server (named by the GCS ``address`` only; re-parented to init)."""
    roots = {*processes_with(temp_dir.encode()), *processes_with(f"--address={address}".encode())}
    return {pid for pid in _descendants(roots) if alive(pid)}


def actor_pids() -> list[int]:
    """Live Ray worker processes that host a sparseps role actor."""
    return processes_with(b"RoleActor")


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def ray_launch(address: str, log: Path, *args: str) -> list[str]:
    """``sparseps launch --backend ray`` on the cluster at ``address``."""
    return launch_argv("--backend", "ray", "--address", address, "--log-dir", str(log), *args)


def ray_env(address: str) -> dict[str, str]:
    """A driver's environment for the cluster at ``address``."""
    return clean_env(RAY_ADDRESS=address, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")


class LocalRayCluster:
    """The head and ``node_b`` (module docstring); :meth:`start` once, :meth:`stop` by pid.

    ``RAY_AUTH_MODE=disabled`` (cluster and drivers): a loopback-only test cluster, and the
    same whether or not an earlier local Ray left a token in ``~/.ray/auth_token`` (which
    turns token authentication on for new clusters, and the second node then failed to
    join).
    """

    def __init__(self) -> None:
        self.address: str | None = None
        self._temp_dir: str | None = None

    def start(self) -> str:
        """Start both nodes (if not running); returns the head's GCS address."""
        if self.address is not None:
            return self.address
        temp_dir = tempfile.mkdtemp(prefix="spsray-", dir="/tmp")  # Unix sockets: keep it short
        port = free_port(HEAD)
        env = clean_env(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
        common = ["--num-cpus", "2", "--disable-usage-stats", "--temp-dir", temp_dir]
        address = f"{HEAD}:{port}"
        self._temp_dir, self.address = temp_dir, address
        starts: list[subprocess.Popen] = []
        try:
            starts.append(subprocess.Popen(
                [str(RAY), "start", "--head", "--node-ip-address", HEAD, "--port", str(port),
                 "--include-dashboard=false", "--ray-client-server-port", str(free_port()),
                 *common],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            ))  # fmt: skip
            # node_b starts as soon as the head's GCS listens, while the head finishes
            wait_until(lambda: _listening(HEAD, port), 60, "the Ray head's GCS port")
            starts.append(subprocess.Popen(
                [str(RAY), "start", "--address", address, "--node-ip-address", NODE_B,
                 "--resources", '{"node_b": 1}', *common],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            ))  # fmt: skip
            outputs = finish(starts, 120)
            assert [p.returncode for p in starts] == [0, 0], outputs
        except BaseException:
            self.stop()
            raise
        return address

    def stop(self) -> None:
        """Kill every process of the cluster and remove its temp dir (no-op when stopped)."""
        temp_dir, address = self._temp_dir, self.address
        if temp_dir is None or address is None:
            return
        self._temp_dir = self.address = None
        pids = _cluster_pids(temp_dir, address)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in pids), 20, "the Ray cluster to stop")
        shutil.rmtree(temp_dir, ignore_errors=True)
