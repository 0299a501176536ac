"""The pieces of sparseps.observe that need no launched job: the status page's sampler
on this process's metrics, the gen-data progress bar, the online command's
--status-port, and diagnose on a folder that is not a job's."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from sparseps.cli import main as sparseps_main
from sparseps.observe.registry import online_pass, worker_metrics
from sparseps.observe.status import StatusServer, last_line
from sparseps.online.online_cli import launch_argv


def test_the_sampler_turns_counters_into_plots_and_the_online_pass(tmp_path, monkeypatch):
    """The page samples this process's worker metrics twice and plots the difference.

    The page's scrape reads this process's registry in its exposition format, not over
    HTTP: real /metrics endpoints of launched roles are scraped by
    tests/observe/test_job_observability.py.
    """
    from prometheus_client import generate_latest

    from sparseps.observe import status as status_module
    from sparseps.observe.registry import registry

    port = 9  # the role's metrics port: only passed to the scrape below
    exposition = status_module.parse_exposition

    def scrape_this_process(host: str, at: int) -> dict:
        assert (host, at) == ("127.0.0.1", port)
        return exposition(generate_latest(registry()).decode())

    monkeypatch.setattr(status_module, "scrape", scrape_this_process)
    metrics = worker_metrics()
    log = tmp_path / "worker.0.log"
    log.write_text("first\nthe last line\n\n")
    roles = [{"role": "worker", "rank": 0, "pid": 1, "attempt": 0, "alive": True,
              "exit_code": None, "log_path": str(log), "metrics_port": port}]  # fmt: skip
    with StatusServer(lambda: roles, job_id="j", interval_s=3600) as page:
        page.sample()
        metrics.samples.inc(5000)
        metrics.pass_done(0, "train", 0.75, 0.4)
        online_pass().set(7)
        page.sample()
        status = httpx.get(f"http://127.0.0.1:{page.port}/api/status", timeout=5).json()
        html = httpx.get(f"http://127.0.0.1:{page.port}/", timeout=5).text
        script = httpx.get(f"http://127.0.0.1:{page.port}/static/status.js", timeout=5)
    assert status["roles"][0]["last_line"] == "the last line" == last_line(log)
    # the page's own sampler also samples once as it starts: it can land between the
    # increment and the second sample, leaving the last point at 0 samples/s
    assert max(point["samples_per_s"] for point in status["series"]) > 0
    assert status["series"][-1]["train"] == 0.75
    assert status["online"] == {"pass_seq": 7}
    assert 'src="/static/status.js"' in html and "http" not in html.split("<body>")[1]  # no CDN
    assert script.status_code == 200 and 'fetch("/api/status"' in script.text


def test_a_sample_racing_the_sampler_thread_keeps_its_time_and_counters_together(monkeypatch):
    """The sampler thread's sample takes its time, then scrapes; a caller's sample and an
    increment land in between. Unserialised, the thread's early time with the later count
    became the baseline and the rate was lost (0 samples/s in three clean-clone CI runs)."""
    import threading

    from prometheus_client import generate_latest

    from sparseps.observe import status as status_module
    from sparseps.observe.registry import registry

    thread_scraping, incremented, thread_read = (threading.Event() for _ in range(3))

    def scrape(host: str, port: int) -> dict:
        if threading.current_thread().name == "sparseps-status-sampler":
            thread_scraping.set()
            incremented.wait(1.0)  # serialised samples: times out, the caller waits on it
            text = generate_latest(registry()).decode()
            thread_read.set()
            return status_module.parse_exposition(text)
        return status_module.parse_exposition(generate_latest(registry()).decode())

    monkeypatch.setattr(status_module, "scrape", scrape)
    metrics = worker_metrics()
    roles = [{"role": "worker", "rank": 0, "pid": 1, "alive": True, "metrics_port": 9}]
    with StatusServer(lambda: roles, job_id="j", interval_s=3600) as page:
        assert thread_scraping.wait(10.0)
        page.sample()
        metrics.samples.inc(3000)
        incremented.set()
        assert thread_read.wait(10.0)
        page.sample()
        series = page.status()["series"]
    assert series and series[-1]["samples_per_s"] > 0, series


def test_gen_data_progress_bar_only_on_a_terminal_or_when_asked(tmp_path, capsys):
    args = ["gen-data", "--rows", "2000", "--files", "2", "--test-rows", "10"]
    assert sparseps_main([*args, "--out", str(tmp_path / "a")]) == 0
    quiet = capsys.readouterr().err  # captured: not a terminal, so no bar
    assert "file/s" not in quiet and "gen-data:" not in quiet
    assert sparseps_main([*args, "--out", str(tmp_path / "b"), "--progress"]) == 0
    shown = capsys.readouterr().err
    assert "gen-data: 100%" in shown and "3/3" in shown, shown


def test_online_passes_the_status_port_to_the_launcher(tmp_path):
    from types import SimpleNamespace

    from sparseps.online.config import JobConfig

    config = SimpleNamespace(job=JobConfig(worker_num=2), log_dir=tmp_path / "log")
    argv = launch_argv(config, tmp_path / "job.yaml", status_port=0)
    assert argv[argv.index("--status-port") + 1] == "0"
    assert "--status-port" not in launch_argv(config, tmp_path / "job.yaml")


def test_diagnose_names_a_folder_that_is_no_job(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "diagnose", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"{tmp_path / 'pids.json'} not found" in done.stderr
    assert not any(tmp_path.iterdir())


def test_a_pids_file_of_exited_processes_gets_an_empty_summary(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    record = {
        "job_id": "j",
        "children": [{"role": "worker", "rank": 0, "pid": child.pid, "attempt": 0}],
    }
    (tmp_path / "pids.json").write_text(json.dumps(record))
    from sparseps.observe.diagnose import diagnose

    result = diagnose(tmp_path, timeout_s=1)
    assert result.lines == ("no live process of the job (every role has exited)",)
    assert (result.folder / "summary.txt").is_file()


def test_the_launcher_counts_restarts_and_marks_exited_roles(tmp_path):
    """Supervisor with a plain Python worker that fails once (restarted, then exits 0)."""
    import textwrap

    from sparseps.env import Role
    from sparseps.launch import ChildSpec, Supervisor, SupervisorConfig
    from sparseps.observe.registry import registry

    marker = tmp_path / "marker"
    flaky = f"""
        import os, sys
        if not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            sys.exit(5)
    """
    spec = ChildSpec(
        role=Role.WORKER, rank=0, argv=(sys.executable, "-c", textwrap.dedent(flaky)),
        env={}, log_path=tmp_path / "log" / "worker.0.log",
    )  # fmt: skip
    reg = registry()
    before = reg.get_sample_value("sparseps_launcher_restarts_total") or 0.0
    supervisor = Supervisor([spec], SupervisorConfig(max_restarts=1, grace_s=1.0))
    assert supervisor.run().exit_code == 0
    assert reg.get_sample_value("sparseps_launcher_restarts_total") == before + 1
    roles = supervisor.roles()
    assert [(r["attempt"], r["alive"], r["exit_code"]) for r in roles] == [(1, False, 0)]
    assert reg.get_sample_value("sparseps_launcher_role_up", {"role": "worker", "rank": "0"}) == 0


def _launched_worker(monkeypatch, log_dir) -> None:
    """This process's environment as a launched worker's (the env tells diagnosis)."""
    from sparseps import env

    role = {
        env.ROLE: "worker", env.RANK: "0", env.SERVERS: "127.0.0.1:1", env.WORKER_NUM: "1",
        env.MASTER: "127.0.0.1:2", env.LOG_DIR: str(log_dir), env.JOB_ID: "j",
    }  # fmt: skip
    for name, value in role.items():
        monkeypatch.setenv(name, value)


def test_a_timeout_is_diagnosed_once_and_a_replacing_error_keeps_the_folder(tmp_path, monkeypatch):
    from sparseps.errors import DeadlineError
    from sparseps.observe.diagnose import DUMP_NOTE, diagnosed, dump_note

    timeout = DeadlineError("pull 't': server 0 did not answer", op="pull", rank=0, seconds=2.0)
    assert diagnosed(timeout) is timeout  # not in a launched job: nothing happens
    (tmp_path / "pids.json").write_text(json.dumps({"job_id": "j", "children": []}))
    _launched_worker(monkeypatch, tmp_path)
    found = diagnosed(timeout)
    assert found.message.startswith(timeout.message + f"; {DUMP_NOTE} {tmp_path}/diagnose-")
    assert (found.op, found.rank, found.seconds) == ("pull", 0, 2.0)
    assert diagnosed(found) is found  # a caller up the stack adds nothing
    note = dump_note(found.message)
    assert note and found.message == timeout.message + note and dump_note("plain") == ""
    folder = note.split(f"{DUMP_NOTE} ")[1].split(" ")[0]
    assert (
        (tmp_path / folder.rsplit("/", 1)[1] / "summary.txt")
        .read_text()
        .startswith(f"# {timeout.message}")
    )
    again = dump_note(diagnosed(timeout).message)  # the same second: a folder of its own
    assert again and again != note
