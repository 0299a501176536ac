"""sparseps.core.jit: processes that start together with a cold kernel cache compile each
cached kernel once between them; the others load it from the cache. load_cached_kernels
loads what the cache holds before the first call (what the fork server does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparseps.testing import wait_until

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]

KERNELS = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    import numpy as np

    from sparseps.core.jit import njit

    @njit(cache=True)
    def inner(x, i):
        return x[i] * 0.5

    @njit(cache=True)
    def outer(x):  # compiling it types inner: a nested compile under the locks
        total = 0.0
        for i in range(x.shape[0]):
            total += inner(x, i)
        return total

    go = Path(sys.argv[1])
    Path(sys.argv[2]).touch()  # imported: ready
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:  # the go signal between processes
        time.sleep(0.005)
    value = outer(np.arange(4, dtype=np.float64))
    stats = [kernel.stats for kernel in (outer, inner)]
    print(json.dumps({
        "value": value,
        "misses": sum(sum(s.cache_misses.values()) for s in stats),
        "hits": sum(sum(s.cache_hits.values()) for s in stats),
    }))
    """
)


def test_processes_starting_together_compile_a_kernel_once(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    go = tmp_path / "go"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "kernels.py", str(go), f"ready.{i}"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(3)
    ]

    def ready() -> bool:
        assert all(p.poll() is None for p in procs), "a process died before it was ready"
        return all((tmp_path / f"ready.{i}").exists() for i in range(3))

    wait_until(ready, 60, "the three processes to import the kernels", interval=0.01)
    go.touch()  # all three call the kernels now
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["value"] for r in results] == [3.0] * 3
    # one process compiles both kernels; the two others load outer from the cache (inner's
    # code is linked into it). Without the locks all three miss the cold cache: 6 misses.
    assert sorted((r["misses"], r["hits"]) for r in results) == [(0, 1), (0, 1), (2, 0)], results


PRELOAD = textwrap.dedent(
    """
    import json

    import numpy as np

    from kernels_only import inner, outer
    from sparseps.core.jit import load_cached_kernels

    before = [len(k.overloads) for k in (outer, inner)]
    loaded = load_cached_kernels()
    after = [len(k.overloads) for k in (outer, inner)]
    again = load_cached_kernels()
    value = outer(np.arange(4, dtype=np.float64))
    misses = sum(sum(k.stats.cache_misses.values()) for k in (outer, inner))
    print(json.dumps({"before": before, "loaded": loaded, "after": after, "again": again,
                      "value": value, "misses": misses}))
    """
)


def test_cached_kernels_load_before_their_first_call(tmp_path):
    # the kernels alone (no waiting), as a module the preload script imports
    (tmp_path / "kernels_only.py").write_text(KERNELS.split("go = Path")[0])
    (tmp_path / "preload.py").write_text(PRELOAD)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))

    def run() -> dict:
        done = subprocess.run(
            [sys.executable, "preload.py"], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=90,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold = run()  # an empty cache: nothing to load; the call compiles (and saves) both
    assert (cold["loaded"], cold["after"], cold["value"], cold["misses"]) == (0, [0, 0], 3.0, 2)
    warm = run()  # outer's overload is in the cache now: loaded before any call
    assert warm["before"] == [0, 0] and warm["loaded"] >= 1 and warm["after"][0] == 1, warm
    assert (warm["again"], warm["value"], warm["misses"]) == (0, 3.0, 0), warm
