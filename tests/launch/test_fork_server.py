"""The launcher's fork server (sparseps.launch.fork_server): a forked child is what a fresh
``python -u -m sparseps.observe.child SCRIPT ARGS`` would be, and none outlives the
launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparseps.env import ZYGOTE_DIR
from sparseps.launch.fork_server import ForkServer, fork_server_enabled, script_imports_torch
from sparseps.testing.environ import clean_environ
from sparseps.testing.jobs import alive, assert_all_gone

ROOT = Path(__file__).resolve().parents[2]

# prints what a child is, then exits as its first argument says
SCRIPT = """
import gc, json, os, random, sys
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
    "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
    "rank": os.environ.get("PADDLE_TRAINER_ID"), "random": random.random(),
    "torch": "torch" in sys.modules, "stdin": sys.stdin.read(), "frozen": gc.get_freeze_count(),
}), flush=True)
how = sys.argv[1]
if how == "raise":
    raise RuntimeError("the job's own error")
if how == "sleep":
    import time; time.sleep(60)
sys.exit(int(how))
"""


def _env(**extra: str) -> dict[str, str]:
    """A job's environment without zygotes: one fork server, started by this process."""
    env = clean_environ(**extra)
    env.pop(ZYGOTE_DIR, None)
    return env


def _argv(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-u", "-m", "sparseps.observe.child", str(script), *args]


def _report(proc) -> tuple[dict, str]:
    out = proc.stdout.read().decode()
    proc.stdout.close()
    return json.loads(out.splitlines()[0]), out


def test_a_forked_child_is_what_a_fresh_interpreter_would_be(tmp_path, monkeypatch):
    script = tmp_path / "jobs" / "child.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    server = ForkServer(_env())
    try:
        assert server.serves(_argv(script, "0"), _env(PADDLE_TRAINER_ID="1"))
        # what Python or a library reads at import time must be the fork server's
        assert not server.serves(_argv(script, "0"), _env(PYTHONHASHSEED="7"))
        assert not server.serves([sys.executable, "-m", "sparseps.observe.child", "x"], _env())
        first = server.spawn(_argv(script, "3", "--flag"), _env(PADDLE_TRAINER_ID="0"), torch=False)
        second = server.spawn(_argv(script, "0"), _env(PADDLE_TRAINER_ID="1"), torch=False)
        assert first is not None and second is not None
        assert first.wait(timeout=60) == 3
        assert second.wait(timeout=60) == 0
        a, _ = _report(first)
        b, _ = _report(second)
        assert a["argv"] == [str(script), "3", "--flag"] and a["name"] == "__main__"
        assert a["cwd"] == str(tmp_path) and a["path0"] == str(script.parent)
        assert [a["ppid"]] == server.pids and a["sid"] == a["pid"] == first.pid  # own session
        assert (a["rank"], b["rank"]) == ("0", "1") and a["stdin"] == ""
        assert a["random"] != b["random"]  # each child seeds its generators afresh
        assert not a["torch"]  # a server's child: the fork server holds no torch yet
        # what it inherited is frozen: its collections (and its exit's) do not walk it
        assert a["frozen"] > 10_000

        worker = server.spawn(_argv(script, "raise"), _env(), torch=True)
        assert worker is not None and worker.wait(timeout=120) == 1
        report, out = _report(worker)
        assert report["torch"] and "RuntimeError: the job's own error" in out  # traceback
        # torch is loaded now: a server starts as a fresh interpreter (no 130 MB of torch)
        assert server.spawn(_argv(script, "0"), _env(), torch=False) is None

        sleeper = server.spawn(_argv(script, "sleep"), _env(), torch=True)
        assert sleeper is not None and sleeper.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(timeout=0.2)
        os.killpg(sleeper.pid, signal.SIGKILL)
        assert sleeper.wait(timeout=30) == -signal.SIGKILL
        sleeper.stdout.close()
    finally:
        server.close()
    assert not server.serves(_argv(script, "0"), _env())


MODULE = """
import os, sys
print("out", sys.argv[1:], __name__, sys.path[0] == os.getcwd(), flush=True)
print("err", os.path.basename(sys.argv[0]), file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]))
"""


def test_a_module_child_runs_as_python_m_with_its_own_output_files(tmp_path, monkeypatch):
    """spawn_module (local_cluster's servers): ``python -m MODULE ARGS``, stdout and stderr
    into the files given."""
    (tmp_path / "childmod.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    server = ForkServer(_env())
    try:
        assert server.serves_env(_env(SPARSEPS_RANK="3"))
        assert not server.serves_env(_env(PYTHONHASHSEED="7"))
        with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
            child = server.spawn_module(
                "childmod", ["4", "x"], _env(), stdout=out.fileno(), stderr=err.fileno()
            )
        assert child is not None and child.stdout is None
        assert child.wait(timeout=60) == 4
        assert (tmp_path / "out").read_text() == "out ['4', 'x'] __main__ True\n"
        assert (tmp_path / "err").read_text() == "err childmod.py\n"
    finally:
        server.close()


def test_switched_off_by_the_environment():
    assert fork_server_enabled({}) and fork_server_enabled({"SPARSEPS_FORK_SERVER": "1"})
    assert not fork_server_enabled({"SPARSEPS_FORK_SERVER": "0"})


def test_nothing_outlives_a_killed_launcher(tmp_path):
    """SIGKILL to the launcher: the fork server dies with it, the forked workers with the
    fork server (and the servers with the launcher)."""
    script = tmp_path / "job.py"
    script.write_text("import time\ntime.sleep(120)\n")
    log_dir = tmp_path / "log"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1",
         "--worker-num", "2", "--log-dir", str(log_dir), str(script)],
        env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    pids_json, deadline = log_dir / "pids.json", time.monotonic() + 120
    try:
        while True:
            record = json.loads(pids_json.read_text()) if pids_json.exists() else {}
            if len(record.get("children", [])) == 3:
                break
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        workers = [c["pid"] for c in record["children"] if c["role"] == "worker"]
        for pid in workers:  # forked by the fork server, not started by the launcher
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert [ppid] == record["fork_servers"]
        launcher.kill()
        launcher.wait(timeout=30)
        assert_all_gone(log_dir, within=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.stderr.close()


def test_a_dead_fork_server_takes_its_children_and_is_not_used_again(tmp_path, monkeypatch):
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    server = ForkServer(_env())
    try:
        sleeper = server.spawn(_argv(script, "sleep"), _env(), torch=False)
        assert sleeper is not None
        report = json.loads(sleeper.stdout.readline())
        assert [report["ppid"]] == server.pids
        os.kill(report["ppid"], signal.SIGKILL)  # the OOM killer, say
        # its child is stopped by the kernel, and the launcher hears of it
        assert sleeper.wait(timeout=30) == -signal.SIGTERM
        deadline = time.monotonic() + 30
        while alive(sleeper.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(sleeper.pid)
        sleeper.stdout.close()
        assert not server.serves(_argv(script, "0"), _env())  # the launcher starts fresh ones
        assert server.spawn(_argv(script, "0"), _env(), torch=False) is None
    finally:
        server.close()


@pytest.mark.parametrize(
    ("source", "imports"),
    [
        ("import torch\nimport sparseps as sps\nsps.init()\n", True),
        ("import numpy as np\nfrom sparseps.models import WideDeep\n", True),
        ("from sparseps.core import collectives\n", True),
        ("try:\n    import torch.nn as nn\nexcept ImportError:\n    nn = None\n", True),
        ("import sparseps as sps\nimport numpy\n", False),  # sparseps itself is lazy
        ("import torchvision_like\nfrom sparseps.data import CRITEO\n", False),
        ("def main():\n    import torch\n", False),  # a function's imports run later
        # the server leaves before the import: only workers import torch
        (
            "import sparseps as sps\nsps.init()\nif sps.is_server():\n    sps.run_server()\n"
            "    raise SystemExit\nimport torch\n",
            False,
        ),
        ("import fleet\nfleet.init()\nif fleet.is_worker():\n    import torch\n", False),
        ("this is not python(\n", False),
    ],
)
def test_a_script_imports_torch_when_its_top_level_does_before_the_role_check(
    tmp_path, source, imports
):
    script = tmp_path / "job.py"
    script.write_text(source)
    assert script_imports_torch(str(script)) is imports
    assert script_imports_torch(str(tmp_path / "missing.py")) is False


# records whether torch was in the process before the script's own imports ran
ROLE_SCRIPT = """
import json, os, sys
preloaded = "torch" in sys.modules
{imports}
import sparseps as sps
sps.init()
me = "server" if sps.is_server() else "worker"
with open(os.path.join(sys.argv[1], me + ".json"), "w") as f:
    json.dump({{"preloaded": preloaded, "ppid": os.getppid()}}, f)
if me == "server":
    sps.run_server()
else:
    sps.stop()
"""


def test_a_server_of_a_script_that_imports_torch_is_forked_with_torch_loaded(tmp_path):
    """Workers are forked from the fork server that holds torch; servers from the one
    without, unless their script imports torch at its top level anyway: then they are
    forked with it loaded (its import is not paid again by each server)."""
    seen = {}
    for name, imports in (("torch", "import torch"), ("plain", "import numpy")):
        folder = tmp_path / name
        folder.mkdir()
        script = folder / "job.py"
        script.write_text(ROLE_SCRIPT.format(imports=imports))
        done = subprocess.run(
            [sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1",
             "--worker-num", "1", "--no-metrics", "--log-dir", str(folder / "log"),
             str(script), str(folder)],
            env=_env(), cwd=folder, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        forks = json.loads((folder / "log" / "pids.json").read_text())["fork_servers"]
        seen[name] = {
            r: json.loads((folder / f"{r}.json").read_text()) for r in ("server", "worker")
        }
        for role, report in seen[name].items():
            assert report["ppid"] in forks, (name, role, report, forks)  # forked, not fresh
    assert seen["torch"]["server"]["preloaded"] and seen["torch"]["worker"]["preloaded"]
    assert not seen["plain"]["server"]["preloaded"]  # a server's memory never holds torch
    assert seen["plain"]["worker"]["preloaded"]
