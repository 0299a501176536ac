"""Where log lines go: sps.init()'s default console when the script configured no
logging (local and launched), no duplicates when it did, and LOG_DIR/launcher.log.

Log text is asserted here because the log line *is* the feature under test.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from sparseps.testing.jobs import assert_all_gone, clean_env, run_launch

pytestmark = pytest.mark.timeout(120)

# No logging set-up at all: what a user writes first.
BARE = """
import sys
import sparseps as sps
sps.init()
if sps.is_server():
    sps.run_server()
    sys.exit(0)
sps.barrier_worker(timeout=30)
sps.stop()
"""

# The application configures logging before or after init (argv[1]).
CONFIGURED = """
import logging, sys
import sparseps as sps
if sys.argv[1] == "before":
    logging.basicConfig(level=logging.INFO, format="APP %(name)s: %(message)s")
sps.init()
if sys.argv[1] == "after":
    logging.basicConfig(level=logging.INFO, format="APP %(name)s: %(message)s")
logging.getLogger("sparseps.test").info("after init")
sps.stop()
"""


def _run(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=tmp_path, env=clean_env(),
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def test_a_bare_script_run_directly_shows_the_local_mode_line(tmp_path):
    r = _run(tmp_path, BARE)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "local mode: no SPARSEPS_*" in line]
    assert len(lines) == 1, r.stderr
    assert re.match(r"\S+ \S+ INFO sparseps\.runtime\.local: local mode", lines[0])
    assert len(re.findall(r"INFO sparseps\.role: sparseps worker 0 of 1", r.stderr)) == 1


@pytest.mark.parametrize("when", ["before", "after"])
def test_configured_logging_gets_each_line_once(tmp_path, when):
    r = _run(tmp_path, CONFIGURED, when)
    assert r.returncode == 0, r.stderr
    # with logging configured, sparseps's lines go through the application's handler only
    assert r.stderr.count("after init") == 1, r.stderr
    assert "APP sparseps.test: after init" in r.stderr
    if when == "before":
        local = [line for line in r.stderr.splitlines() if "local mode" in line]
        assert len(local) == 1 and local[0].startswith("APP sparseps.runtime.local"), r.stderr


def test_launched_bare_script_logs_sparseps_info_lines(tmp_path):
    (tmp_path / "script.py").write_text(BARE)
    log = tmp_path / "log"
    r = run_launch(
        "--server-num", "1", "--worker-num", "2", "--log-dir", str(log), "script.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert_all_gone(log)
    for rank in (0, 1):
        worker = (log / f"worker.{rank}.log").read_text()
        assert len(re.findall(rf"INFO sparseps\.role: sparseps worker {rank} of 2", worker)) == 1
    server = (log / "server.0.log").read_text()
    assert len(re.findall(r"INFO sparseps\.role: sparseps server 0 of 1", server)) == 1
    # the server sets up logging itself once it runs: the default console stepped aside
    assert server.count("running server with rank id: 0") == 1, server


def test_launcher_log_has_the_banner_warnings_and_summary(tmp_path):
    (tmp_path / "script.py").write_text(
        BARE.replace("sps.barrier_worker(timeout=30)", "import time; time.sleep(1.5)")
    )
    log = tmp_path / "log"
    r = run_launch(
        "--server-num", "1", "--worker-num", "1", "--quiet-warn-s", "0.5", "--log-dir", str(log),
        "script.py", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    launcher = (log / "launcher.log").read_text()
    job_id = assert_all_gone(log)["job_id"]
    assert f"job id      : {job_id}" in launcher  # the banner
    assert re.search(r"WARNING sparseps\.launch\.supervisor: worker 0 \(pid \d+\) has produced "
                     r"no output for", launcher)  # fmt: skip
    assert launcher.rstrip().endswith(f"sparseps launch: job {job_id} completed")
    # the same lines reached the console
    assert "has produced no output for" in r.stderr
