"""``sparseps launch --file-root DIR``: the job's servers save and load only under DIR;
the launcher refuses non-finite durations, naming the flag."""

from __future__ import annotations

import json
import textwrap

import pytest

from sparseps.testing.jobs import run_launch

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import sparseps as sps
    from sparseps.errors import RemoteError

    sps.init()
    if sps.is_server():
        sps.run_server()
        sys.exit(0)
    inside, outside, out = sys.argv[1:4]
    with sps.PSClient(sps.server_endpoints(), timeout=60) as client:
        client.create_table(sps.TableConfig(name="emb", dim=4))
        client.push("emb", np.arange(1, 9, dtype=np.uint64), np.ones((8, 4), np.float32)).wait()
        result = {"inside": len(client.save("emb", inside))}
        try:
            client.save("emb", outside)
            result["outside"] = "written"
        except RemoteError as exc:
            result["outside"] = str(exc)
    with open(out, "w") as f:
        json.dump(result, f)
    """
)


def test_servers_of_a_launched_job_keep_to_the_file_roots(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    root, outside = tmp_path / "models", tmp_path / "elsewhere"
    root.mkdir()
    done = run_launch(
        "--server-num", "1", "--worker-num", "1", "--file-root", str(root), str(script),
        str(root / "ck"), str(outside / "ck"), str(tmp_path / "out.json"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["inside"] == 2  # rows + pending files
    assert "outside this server's file roots" in result["outside"]
    assert not outside.exists()


@pytest.mark.parametrize("flag", ["--rendezvous-timeout-s", "--grace-s", "--quiet-warn-s"])
def test_the_launcher_refuses_non_finite_durations(tmp_path, flag):
    script = tmp_path / "job.py"
    script.write_text("raise SystemExit('must not run')\n")
    done = run_launch(flag, "inf", str(script), cwd=tmp_path, timeout=60)
    assert done.returncode != 0
    assert flag in done.stderr and "inf" in done.stderr
    assert not (tmp_path / "log" / "worker.0.log").exists()
