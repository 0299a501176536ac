"""Zygotes (sparseps.launch.zygote): a launcher's fork servers forked, already imported, by
a zygote of its environment; a child is still what a fresh interpreter would be; a killed
launcher still takes its fork servers and children down; a folder others can enter is
not used; removing the folder stops the zygotes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sparseps.env import ZYGOTE_DIR
from sparseps.launch.fork_server import ForkServer
from sparseps.launch.zygote import Zygotes
from sparseps.testing import wait_until
from sparseps.testing.environ import clean_environ
from sparseps.testing.jobs import alive, assert_all_gone

SCRIPT = """
import gc, json, os, random, sys
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "ppid": os.getppid(),
    "sid": os.getsid(0), "rank": os.environ.get("PADDLE_TRAINER_ID"), "random": random.random(),
    "torch": "torch" in sys.modules, "frozen": gc.get_freeze_count(),
    "export_warm": "torch._export.non_strict_utils" in sys.modules,
}), flush=True)
if sys.argv[1] == "sleep":
    import time; time.sleep(120)
"""


@pytest.fixture
def folder():
    # not under tmp_path: a Unix socket's path has at most 107 bytes
    path = Path(tempfile.mkdtemp(prefix="zyg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _zygote_pids(folder: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(folder).encode() in cmdline and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def _argv(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-u", "-m", "sparseps.observe.child", str(script), *args]


def _report(proc) -> dict:
    return json.loads(proc.stdout.readline())


def test_only_a_folder_closed_to_others_is_used(folder):
    env = clean_environ()
    assert Zygotes.at({}, env) is None
    assert Zygotes.at({ZYGOTE_DIR: str(folder)}, env) is not None
    folder.chmod(0o755)
    assert Zygotes.at({ZYGOTE_DIR: str(folder)}, env) is None
    assert Zygotes.at({ZYGOTE_DIR: str(folder / "missing")}, env) is None
    # another environment is another zygote: its socket has another name
    other = Zygotes(folder, {**env, "PYTHONHASHSEED": "7"})
    assert Zygotes(folder, env)._key(False) != other._key(False)
    assert Zygotes(folder, env)._key(False) != Zygotes(folder, env)._key(True)


def test_fork_servers_come_from_the_zygotes_of_their_environment(folder, tmp_path, monkeypatch):
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    env = clean_environ(**{ZYGOTE_DIR: str(folder)})
    # the first launch in an environment uses a fork server of its own; the second starts
    # the zygotes (a one-off environment costs none)
    for _ in range(2):
        server = ForkServer(env)
        worker = server.spawn(_argv(script, "0"), env, torch=True)
        assert worker is not None and worker.wait(timeout=120) == 0
        assert _report(worker)["ppid"] in server.pids
        assert all(_parent(pid) == os.getpid() for pid in server.pids)  # ours, fresh
        worker.stdout.close()
        server.close()
    wait_until(lambda: len(list(folder.glob("*.sock"))) == 2, 120, "the two zygotes")
    zygotes = _zygote_pids(folder)
    assert len(zygotes) == 2

    server = ForkServer(env)
    try:
        first = server.spawn(_argv(script, "0"), {**env, "PADDLE_TRAINER_ID": "0"}, torch=False)
        second = server.spawn(_argv(script, "0"), {**env, "PADDLE_TRAINER_ID": "1"}, torch=True)
        assert first is not None and second is not None
        assert first.wait(timeout=60) == 0 and second.wait(timeout=60) == 0
        a, b = _report(first), _report(second)
        # two fork servers, forked by the zygotes, not by this process
        assert len(server.pids) == 2 and {a["ppid"], b["ppid"]} == set(server.pids)
        assert {_parent(pid) for pid in server.pids} == set(zygotes)
        # a child is what a fresh interpreter would be
        assert a["argv"] == [str(script), "0"] and a["cwd"] == str(tmp_path)
        assert a["path0"] == str(script.parent) and a["sid"] == first.pid
        assert (a["rank"], b["rank"]) == ("0", "1") and a["random"] != b["random"]
        assert not a["torch"] and b["torch"]  # a server never carries torch
        # the torch zygote ran torch.export once: a worker's first inference save is cheap
        assert b["export_warm"] and not a["export_warm"]
        assert a["frozen"] > 10_000  # what it inherited is frozen
        first.stdout.close()
        second.stdout.close()
        # what the interpreter reads at start differs: no zygote of that environment
        assert not server.serves_env({**env, "PYTHONHASHSEED": "7"})
        other = ForkServer({**env, "PYTHONHASHSEED": "7"})
        assert [_parent(pid) for pid in other.pids] == [os.getpid()]
        other.close()
    finally:
        server.close()
    forked = server.pids
    wait_until(lambda: not any(map(alive, forked)), 10, "the fork servers to exit")
    assert sorted(_zygote_pids(folder)) == sorted(zygotes)  # they stay for the next launch
    shutil.rmtree(folder)  # and go with their folder
    wait_until(lambda: not _zygote_pids(folder), 15, "the zygotes to exit")


def test_a_killed_launcher_takes_its_zygote_forked_fork_servers_down(folder, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, time\nimport sparseps as sps\nsps.init()\n"
        "if sps.is_server():\n    sps.run_server()\n"
        "else:\n    time.sleep(120 if sys.argv[1:] else 0)\n    sps.stop()\n"
    )
    env = clean_environ(**{ZYGOTE_DIR: str(folder)})

    def launch(*args: str, log: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1",
             "--worker-num", "1", "--log-dir", str(tmp_path / log), str(script), *args],
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    for attempt in range(3):  # the zygotes start at the second launch
        wait_until(lambda: not list(folder.glob("*.starting")), 120, "the zygotes' imports")
        if len(list(folder.glob("*.sock"))) == 2:
            break
        assert launch(log=f"warm{attempt}").wait(timeout=120) == 0
    wait_until(lambda: len(list(folder.glob("*.sock"))) == 2, 120, "the two zygotes")
    zygotes = _zygote_pids(folder)

    launcher = launch("sleep", log="log")
    pids_json = tmp_path / "log" / "pids.json"
    try:

        def started() -> bool:
            record = json.loads(pids_json.read_text()) if pids_json.exists() else {}
            assert launcher.poll() is None
            return len(record.get("children", [])) == 2 and len(record["fork_servers"]) == 2

        wait_until(started, 120, "the job's server and worker")
        record = json.loads(pids_json.read_text())
        assert {_parent(pid) for pid in record["fork_servers"]} == set(zygotes)
        for child in record["children"]:
            assert _parent(child["pid"]) in record["fork_servers"]
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        assert_all_gone(tmp_path / "log", within=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert sorted(_zygote_pids(folder)) == sorted(zygotes)


ALONE = """
import sys
import numpy as np
import sparseps as sps
sps.init()
with sps.PSClient(sps.server_endpoints(), timeout=60) as client:
    client.create_table(sps.TableConfig(name="e", dim=4, rule=sps.optim.SGD(lr=1.0)))
    print("rows", client.pull("e", np.arange(3, dtype=np.uint64)).wait().shape, flush=True)
sys.stdin.readline()
sps.stop()
"""


def test_local_mode_forks_its_server_from_a_zygote(folder, tmp_path):
    """``python script.py`` (local mode): with a zygote of its environment up, the
    background server is forked by a fork server that zygote forked; it serves, and it
    is gone with the script."""
    script = tmp_path / "alone.py"
    script.write_text(ALONE)
    env = clean_environ(**{ZYGOTE_DIR: str(folder)})

    def alone(watch=lambda server: None) -> int:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            server = None
            for line in proc.stderr:  # the script's log: its server's pid
                found = re.search(r"background server \(pid (\d+)", line)
                if found:
                    server = int(found.group(1))
                    break
            assert server is not None and proc.stdout.readline() == "rows (3, 4)\n"
            watch(server)
            out, err = proc.communicate("\n", timeout=60)
            assert proc.returncode == 0, out + err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wait_until(lambda: not alive(server), 10, "the server to exit with the script")
        return server

    alone()  # the first run marks the environment; the second starts the server zygote
    alone()
    wait_until(lambda: len(list(folder.glob("*-server.sock"))) == 1, 120, "the server zygote")
    (zygote,) = _zygote_pids(folder)
    forkers = []

    def forked_by_the_zygote(server: int) -> None:
        forkers.append(_parent(server))
        assert _parent(forkers[0]) == zygote

    alone(forked_by_the_zygote)
    wait_until(lambda: not alive(forkers[0]), 10, "its fork server to exit with the script")
