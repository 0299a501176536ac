"""A 2-"host" ``--secure`` job on this machine (two launchers, 127.0.0.1 and 127.0.0.2).

It trains to the same test AUC as the same job without ``--secure``, and a third process
holding another job's key gets the clear "authentication failed" error from a server of
the running job within seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sparseps.rpc.security import write_job_keys  # noqa: E402
from sparseps.testing import wait_until
from sparseps.testing.jobs import clean_env, finish, start_two_launchers

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "wide_deep" / "train.py"
DEADLINE_S = 10.0  # the refusal must arrive well before the probe's 60 s RPC timeout


def _train_args(data: Path) -> list[str]:
    return [
        "--train", str(data / "train"), "--test", str(data / "test"), "--passes", "2",
        "--hidden", "32", "--batch-size", "128", "--print-period", "0",
    ]  # fmt: skip


def _server_endpoint(log_dir: Path) -> str:
    banner = (log_dir / "launcher.log").read_text()
    return re.search(r"server 0: (\S+)", banner).group(1)


def _auc(output: str) -> float:
    summary = [line for line in output.splitlines() if line.startswith('{"test_auc"')]
    assert summary, output[-3000:]
    return json.loads(summary[-1])["test_auc"]


def _run_job(tmp_path: Path, data: Path, options: tuple, probe=None) -> tuple[float, object]:
    nodes = start_two_launchers(tmp_path, SCRIPT, *_train_args(data), options=options)
    probed = None
    if probe is not None:
        first_log = nodes[0][1]
        wait_until(lambda: "running server" in _text(first_log / "server.0.log"), 120, "server 0")
        with _workers_paused([log_dir for _, log_dir, _ in nodes]):
            probed = probe(_server_endpoint(first_log))
    outputs = finish([proc for _, _, proc in nodes], timeout=400)
    codes = [proc.returncode for _, _, proc in nodes]
    assert codes == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    return _auc(outputs[0]), probed


@contextlib.contextmanager
def _workers_paused(log_dirs: list[Path]):
    """SIGSTOP every worker of the job while the probes run: the job cannot finish (and its
    servers stop) before the last probe has its answer, however fast the job is."""

    def workers() -> list[int]:
        pids = []
        for log_dir in log_dirs:
            text = _text(log_dir / "pids.json")
            children = json.loads(text)["children"] if text else []
            pids += [c["pid"] for c in children if c["role"] == "worker"]
        return pids

    wait_until(lambda: len(workers()) == len(log_dirs), 120, "a worker on every node")
    pids = workers()
    for pid in pids:  # each worker leads its own process group
        os.killpg(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.killpg(pid, signal.SIGCONT)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _wrong_key_client(key_dir: Path):
    """Probes of a running job's server 0: one with ``key_dir``'s keys, one with none."""

    def probe(endpoint: str) -> tuple[subprocess.CompletedProcess, float, str]:
        # the refusal's own time, measured in the probe around its call: the probe's
        # start (an interpreter and sparseps' imports, beside the running job) is not it
        code = (
            "import sys, time; from sparseps.rpc.client import PSClient\n"
            f"c = PSClient([{endpoint!r}], timeout=60)\n"
            "start = time.monotonic()\n"
            "try:\n    c.ping()\nexcept Exception as e:\n"
            "    print(type(e).__name__, e, file=sys.stderr)\n"
            "    print('refused after', time.monotonic() - start, file=sys.stderr); sys.exit(1)\n"
        )
        environ = clean_env(SPARSEPS_SECURE="1", SPARSEPS_KEY_DIR=str(key_dir))
        done = subprocess.run(
            [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=90
        )
        refused = re.search(r"refused after (\S+)", done.stderr)
        elapsed = float(refused.group(1)) if refused else math.inf
        keyless = subprocess.run(
            [sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True,
            timeout=90,
        )  # fmt: skip
        return done, elapsed, keyless.stderr

    return probe


def test_secure_two_host_job_matches_plain_and_refuses_a_wrong_key(tmp_path):
    from sparseps.data.synthetic import write_dataset

    data = tmp_path / "data"
    write_dataset(data, rows=20_000, seed=7, files=4)
    keys, other = tmp_path / "keys", tmp_path / "other-keys"
    write_job_keys(keys)
    write_job_keys(other)

    (tmp_path / "plain").mkdir()
    plain_auc, _ = _run_job(tmp_path / "plain", data, ())
    (tmp_path / "secure").mkdir()
    secure_auc, (probe, elapsed, keyless) = _run_job(
        tmp_path / "secure", data, ("--secure", "--key-dir", str(keys)), _wrong_key_client(other)
    )

    print(f"\ntest AUC: plain {plain_auc:.4f}, secure {secure_auc:.4f}")
    assert plain_auc > 0.7 and secure_auc > 0.7
    # Async training with two workers is not bit-reproducible (nor is sync mode across two
    # launchers: two sync runs gave 0.7740/0.7727 and 0.7782/0.7775); the transport must
    # not change what is learnt beyond that noise. Measured over 8 runs of this test on the
    # 2-core machine: AUC 0.7634 .. 0.7810 (sd 0.0044 over all 16 jobs), secure - plain
    # -0.0063 .. +0.0067 (sd 0.0042). The bound is 4 sd of the difference of two
    # independent jobs (sqrt(2) x 0.0044 = 0.0062 -> 0.025), 6 sd of the measured
    # differences; the 0.02 before was under 3.5 sd of that. The 0.7 floor is 14 sd under
    # the lowest run.
    assert abs(secure_auc - plain_auc) < 0.025, (plain_auc, secure_auc)
    assert probe.returncode == 1, probe.stderr
    assert "UnavailableError" in probe.stderr and "authentication failed" in probe.stderr
    assert "this client's key is not the job's key" in probe.stderr
    assert str(other) in probe.stderr
    assert elapsed < DEADLINE_S, elapsed
    # Only a CURVE server refuses a key-less client: the job's servers really are secure.
    assert "requires the job's key" in keyless, keyless
    for log_dir in (tmp_path / "secure").glob("log-*"):
        assert "transport   : CURVE" in (log_dir / "launcher.log").read_text()
    assert os.stat(keys).st_mode & 0o777 == 0o700
