"""The supervision loop with plain Python children (no servers, fast): fail fast, process
groups, restarts, the server stop request and its SIGTERM fallback, quiet warnings."""

from __future__ import annotations

import logging
import sys
import textwrap
import time
from dataclasses import replace

import pytest

from sparseps.env import Role
from sparseps.errors import ConfigError
from sparseps.launch import ChildSpec, Supervisor, SupervisorConfig
from sparseps.testing import wait_until
from sparseps.testing.jobs import alive, clean_env, read_pids

pytestmark = pytest.mark.timeout(60)


def child(tmp_path, role, rank, code, *, echo=False):
    return ChildSpec(
        role=role,
        rank=rank,
        argv=(sys.executable, "-c", textwrap.dedent(code)),
        env=clean_env(),
        log_path=tmp_path / "log" / f"{role.value}.{rank}.log",
        echo=echo,
    )


SLEEPER = "import time; print('up', flush=True); time.sleep(60)"
# A job that ended by a failure or a stop, not by waiting out SLEEPER's 60 s: its bound,
# with room for the children's start on a loaded box.
ENDED_S = 25


def test_failure_stops_everyone_and_names_the_child(tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    spawner = f"""
        import subprocess, time
        p = subprocess.Popen(["sleep", "60"])
        open({str(grandchild)!r}, "w").write(str(p.pid))
        time.sleep(60)
    """
    failing = "import sys, time; time.sleep(0.5); print('about to fail', flush=True); sys.exit(3)"
    sup = Supervisor(
        [child(tmp_path, Role.SERVER, 0, SLEEPER), child(tmp_path, Role.WORKER, 0, spawner),
         child(tmp_path, Role.WORKER, 1, failing)],
        SupervisorConfig(grace_s=2.0),
    )  # fmt: skip
    start = time.monotonic()
    outcome = sup.run()
    assert time.monotonic() - start < ENDED_S
    assert outcome.reason == "failed" and outcome.exit_code == 3
    f = outcome.failure
    assert (f.role, f.rank, f.exit_code) == ("worker", 1, 3)
    assert f.tail[-1] == "about to fail" and "worker 1" in f.describe() and "code 3" in f.describe()
    pids = [c["pid"] for c in read_pids(tmp_path / "log")["children"]]
    assert len(pids) == 3 and not any(alive(p) for p in pids)
    # the sleeping grandchild was in worker 0's process group: gone too
    wait_until(lambda: not alive(int(grandchild.read_text())), 2.0, "the grandchild to exit")


def test_killed_child_reports_the_signal(tmp_path):
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    outcome = Supervisor([child(tmp_path, Role.WORKER, 0, code)]).run()
    assert outcome.exit_code == 128 + 9 and outcome.failure.exit_code == -9
    assert "killed by signal 9" in outcome.failure.describe()


def test_worker_is_restarted_then_succeeds(tmp_path, caplog):
    marker = tmp_path / "marker"
    flaky = f"""
        import os, sys
        if not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            sys.exit(5)
        print("second attempt ok")
    """
    with caplog.at_level(logging.WARNING):
        outcome = Supervisor(
            [child(tmp_path, Role.WORKER, 0, flaky)], SupervisorConfig(max_restarts=2)
        ).run()
    assert outcome.exit_code == 0 and outcome.reason == "completed"
    assert "exited with code 5: restarting all workers (restart 1 of 2" in caplog.text
    attempts = [c["attempt"] for c in read_pids(tmp_path / "log")["children"]]
    assert attempts == [0, 1]
    log_text = (tmp_path / "log" / "worker.0.log").read_text()
    assert "restart attempt 1" in log_text and log_text.rstrip().endswith("second attempt ok")


def test_a_restart_stops_the_surviving_workers_and_starts_the_next_generation(tmp_path):
    record = tmp_path / "record"
    # worker 0 waits forever in generation 0 (like a peer stuck in a collective); in
    # generation 1 it records what the launcher gave it
    survivor = f"""
        import os, time
        if os.environ["SPARSEPS_RESTART_COUNT"] == "0":
            time.sleep(60)
        open({str(record)!r}, "w").write(os.environ["SPARSEPS_RESTART_COUNT"] + " "
                                          + os.environ["SPARSEPS_MASTER"])
    """
    flaky = """
        import os, sys, time
        if os.environ["SPARSEPS_RESTART_COUNT"] == "0":
            time.sleep(0.3)
            sys.exit(5)
    """
    workers = [child(tmp_path, Role.WORKER, 0, survivor), child(tmp_path, Role.WORKER, 1, flaky)]
    workers = [replace(w, env={**w.env, "SPARSEPS_MASTER": "127.0.0.1:1"}) for w in workers]
    start = time.monotonic()
    outcome = Supervisor(
        [child(tmp_path, Role.SERVER, 0, SLEEPER), *workers],
        SupervisorConfig(max_restarts=1, grace_s=1.0, server_stop_s=0.5),
        restart_env=lambda k: {"SPARSEPS_MASTER": f"127.0.0.1:{1000 + k}"},
    ).run()
    assert outcome.exit_code == 0 and time.monotonic() - start < ENDED_S
    assert record.read_text() == "1 127.0.0.1:1001"  # generation 1, a fresh rendezvous
    children = read_pids(tmp_path / "log")["children"]
    assert sorted((c["role"], c["rank"], c["attempt"]) for c in children) == [
        ("server", 0, 0), ("worker", 0, 0), ("worker", 0, 1), ("worker", 1, 0), ("worker", 1, 1),
    ]  # fmt: skip
    assert not any(alive(c["pid"]) for c in children)
    # generation 0 of worker 0 did not fail by itself: the launcher stopped it
    assert "Traceback" not in (tmp_path / "log" / "worker.0.log").read_text()


def test_restarts_are_bounded(tmp_path):
    outcome = Supervisor(
        [child(tmp_path, Role.WORKER, 0, "import sys; sys.exit(4)")],
        SupervisorConfig(max_restarts=1),
    ).run()
    assert outcome.exit_code == 4 and outcome.failure.rank == 0
    assert [c["attempt"] for c in read_pids(tmp_path / "log")["children"]] == [0, 1]


def test_servers_get_the_stop_request_when_workers_finish(tmp_path):
    stop_file = tmp_path / "stop"
    server = f"""
        import os, time
        while not os.path.exists({str(stop_file)!r}):
            time.sleep(0.02)
        print("server stopped cleanly")
    """
    calls = []

    def stop_servers():
        calls.append(time.monotonic())
        stop_file.write_text("1")

    outcome = Supervisor(
        [
            child(tmp_path, Role.SERVER, 0, server),
            child(tmp_path, Role.WORKER, 0, "print('work done')"),
        ],
        stop_servers=stop_servers,
    ).run()
    assert outcome.exit_code == 0 and len(calls) == 1
    assert "server stopped cleanly" in (tmp_path / "log" / "server.0.log").read_text()


def test_servers_that_ignore_the_stop_request_get_sigterm(tmp_path):
    def broken_stop():
        raise OSError("no route")

    start = time.monotonic()
    outcome = Supervisor(
        [child(tmp_path, Role.SERVER, 0, SLEEPER), child(tmp_path, Role.WORKER, 0, "pass")],
        SupervisorConfig(server_stop_s=0.5, grace_s=1.0),
        stop_servers=broken_stop,
    ).run()
    assert outcome.exit_code == 0 and time.monotonic() - start < ENDED_S
    assert not any(alive(c["pid"]) for c in read_pids(tmp_path / "log")["children"])


def test_quiet_child_is_named_in_a_warning(tmp_path, caplog):
    code = "import time; print('hello', flush=True); time.sleep(1.5)"
    with caplog.at_level(logging.WARNING):
        outcome = Supervisor(
            [child(tmp_path, Role.WORKER, 0, code)], SupervisorConfig(quiet_warn_s=0.5)
        ).run()
    assert outcome.exit_code == 0
    assert "worker 0 (pid" in caplog.text and "no output for" in caplog.text


def test_worker_zero_output_is_echoed(tmp_path, capfd):
    Supervisor([child(tmp_path, Role.WORKER, 0, "print('to the console')", echo=True)]).run()
    assert "to the console" in capfd.readouterr().out


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_restarts", -1), ("grace_s", 0), ("quiet_warn_s", -1), ("grace_s", float("inf")),
     ("server_stop_s", float("nan")), ("poll_s", float("-inf")), ("quiet_warn_s", "5")],
)  # fmt: skip
def test_config_is_validated(field, value):
    with pytest.raises(ConfigError, match=field.replace("_", "[-_]")):
        SupervisorConfig(**{field: value})


@pytest.mark.parametrize("code", [0, 3])
def test_a_server_exit_with_any_code_fails_the_job_and_never_restarts_workers(tmp_path, code):
    server = (
        f"import sys, time; time.sleep(0.5); print('server leaving', flush=True); sys.exit({code})"
    )
    start = time.monotonic()
    outcome = Supervisor(
        [child(tmp_path, Role.SERVER, 0, server), child(tmp_path, Role.WORKER, 0, SLEEPER)],
        SupervisorConfig(max_restarts=2, grace_s=1.0),
    ).run()
    assert time.monotonic() - start < ENDED_S
    assert outcome.reason == "failed" and outcome.exit_code == (code or 1)
    f = outcome.failure
    assert (f.role, f.rank, f.exit_code, f.tail[-1]) == ("server", 0, code, "server leaving")
    assert f"server 0 (pid {f.pid}) exited with code {code} before every worker finished" in (
        f.describe()
    )
    children = read_pids(tmp_path / "log")["children"]
    assert [(c["role"], c["attempt"]) for c in children] == [("server", 0), ("worker", 0)]
    assert not any(alive(c["pid"]) for c in children)


def test_a_worker_failing_because_a_server_died_names_the_server(tmp_path):
    gone = tmp_path / "gone"
    server = f"""
        import os, signal
        open({str(gone)!r}, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    """
    worker = f"""
        import os, sys, time
        while not os.path.exists({str(gone)!r}):
            time.sleep(0.005)
        sys.exit(3)  # as a worker whose server connection broke
    """
    outcome = Supervisor(
        [child(tmp_path, Role.SERVER, 0, server), child(tmp_path, Role.WORKER, 0, worker)],
        SupervisorConfig(max_restarts=2, grace_s=1.0),
    ).run()
    assert outcome.exit_code == 128 + 9
    assert (outcome.failure.role, outcome.failure.exit_code) == ("server", -9)
    assert "killed by signal 9 (SIGKILL) before every worker finished" in outcome.failure.describe()
    attempts = [(c["role"], c["attempt"]) for c in read_pids(tmp_path / "log")["children"]]
    assert attempts == [("server", 0), ("worker", 0)]  # no restart generation


def test_servers_stopped_after_the_workers_finished_complete_the_job(tmp_path):
    # the launcher's own stop step: a server exiting then is the expected end
    outcome = Supervisor(
        [child(tmp_path, Role.SERVER, 0, SLEEPER), child(tmp_path, Role.WORKER, 0, "pass")],
        SupervisorConfig(server_stop_s=0.5, grace_s=1.0),
        stop_servers=lambda: None,
    ).run()
    assert (outcome.exit_code, outcome.reason, outcome.failure) == (0, "completed", None)
