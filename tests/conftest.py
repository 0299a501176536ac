"""How the suite shares the machine's two cores under ``pytest -n 2`` (pytest-xdist).

The README's test command runs two xdist workers with the scheduler below: every test
file is one unit of work (its module fixtures set up once), handed out in collection
order. The files in HEAVY_FILES (whole launched jobs, time bounds) are collected first,
longest first (their seconds in one run, below), and the short files after them, those
with the most tests first: a worker that finishes a unit takes the longest one left, so
the run does not end with one worker alone on a long file while the other has nothing
(xdist hands a worker its next unit when two tests of its current one are left: a long
last unit would run after them). Without ``-n`` (a developer running one file) nothing
changes.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from sparseps.env import ZYGOTE_DIR

# files whose tests launch jobs or measure time (and any file of 15 s or more), with their
# seconds in one `-n 2` run of the whole suite (2026-12-07 19:42, this box, load 4: only
# their order counts); the rest are short and share the cores
HEAVY_FILES: dict[str, int] = {
    "checkpoint/test_esmm_inference.py": 8,
    "checkpoint/test_load_restores.py": 1,
    "checkpoint/test_model_files.py": 25,
    "checkpoint/test_model_input.py": 17,
    "checkpoint/test_resume_equals_fresh_load.py": 10,
    "checkpoint/test_trainer_model_files.py": 25,
    "data/test_data_paddle_port.py": 7,
    "data/test_data_synthetic.py": 19,
    "data/test_paddle_generator_parity.py": 16,
    "data/test_paddlerec_readers.py": 17,
    "data/test_steal_lease.py": 6,
    "data/test_work_stealing.py": 13,
    "elastic/test_client_routing.py": 2,
    "elastic/test_elastic_migration.py": 9,
    "elastic/test_scale_launched.py": 15,
    "examples/test_fleetx_port.py": 21,
    "examples/test_paddlerec_port.py": 16,
    "examples/test_slot_dnn_port.py": 20,
    "heter/test_heter_launch.py": 6,
    "heter/test_heter_restart.py": 11,
    "heter/test_heter_sync.py": 11,
    "launch/test_fork_server.py": 18,
    "launch/test_launch_jobs.py": 38,
    "launch/test_launch_paddle_env.py": 13,
    "launch/test_launch_restart.py": 11,
    "launch/test_launch_server_exit.py": 3,
    "launch/test_ray_backend.py": 174,
    "launch/test_ray_heter.py": 68,
    "launch/test_zygote.py": 34,
    "metrics/test_metrics_distributed.py": 10,
    "metrics/test_metrics_fleet.py": 5,
    "observe/test_hang_diagnosis.py": 15,
    "observe/test_job_observability.py": 6,
    "online/test_online_drift.py": 11,
    "online/test_online_extra_labels.py": 4,
    "online/test_online_gpups.py": 21,
    "online/test_online_missing.py": 10,
    "online/test_online_modes.py": 77,
    "online/test_online_predict.py": 9,
    "online/test_online_relaunch_workers.py": 7,
    "online/test_online_resume.py": 23,
    "online/test_online_scale_workers.py": 8,
    "online/test_online_worker_dies.py": 6,
    "online/test_online_workers_steal.py": 12,
    "recall/test_recall.py": 9,
    "replication/test_replica_drill.py": 26,
    "replication/test_replica_failover.py": 2,
    "replication/test_replica_launch.py": 8,
    "replication/test_replica_recovery.py": 1,
    "rpc/test_rpc_cluster.py": 9,
    "rpc/test_rpc_hardening.py": 14,
    "security/test_secure_group.py": 14,
    "security/test_secure_job.py": 16,
    "security/test_secure_sync_training.py": 10,
    "security/test_socket_census.py": 18,
    "security/test_unauthenticated_peer.py": 6,
    "server/test_server_disk_tier.py": 2,
    "serving/test_batching.py": 7,
    "serving/test_hot_reload.py": 26,
    "serving/test_larger_than_memory.py": 45,
    "serving/test_serve_model_schema.py": 11,
    "serving/test_workers.py": 31,
    "table/test_table_rules_total.py": 20,
    "test_bench_quality.py": 45,
    "test_bench_scaling.py": 41,
    "test_clone.py": 26,
    "test_demo.py": 44,
    "test_docs.py": 16,
    "worker/test_esmm_example.py": 6,
    "worker/test_example.py": 5,
    "worker/test_gpups_cluster.py": 4,
    "worker/test_hybrid_steps.py": 7,
    "worker/test_stragglers.py": 14,
    "worker/test_sync_collectives.py": 4,
    "worker/test_training_modes.py": 51,
    "worker/test_wide_deep_lr.py": 10,
}
_RAY_CLUSTER_FILES = frozenset(
    {"tests/launch/test_ray_backend.py", "tests/launch/test_ray_heter.py"}
)
_zygote_folder: str | None = None  # the zygotes' folder this process made


def _unit_of(nodeid: str) -> str:
    """The xdist unit of a test: its file, but one unit for the Ray cluster files."""
    path = nodeid.split("::", 1)[0]
    return "ray clusters" if path in _RAY_CLUSTER_FILES else path


def _unit(item: pytest.Item) -> str:
    return _unit_of(item.nodeid)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; optional: -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    # xdist's --dist loadgroup marks do not reach pytest 9's node ids, and loadfile
    # reorders the units by their number of tests: ours keeps the collection order
    from xdist.scheduler import LoadScopeScheduling

    class FilesInOrder(LoadScopeScheduling):
        """Work units: each test file, in collection order; the files that start Ray
        clusters and count the machine's Ray processes are one unit (run one after the
        other: side by side, each counted the other's actors)."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

    config.option.loadscopereorder = False
    return FilesInOrder(config, log)


def pytest_configure(config: pytest.Config) -> None:
    # The suite starts hundreds of Python processes (servers, workers, launchers). Where
    # bytecode writing is off (PYTHONDONTWRITEBYTECODE, as on the machines we run CI on),
    # each of them compiled every sparseps module it imports again: ~0.5 s of CPU per
    # process. The suite writes the checkout's bytecode (ignored by git, beside the
    # kernels' numba caches); set here, before xdist starts its workers, every child
    # inherits it.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    # The suite launches ~100 jobs per xdist worker from a few environments: their fork
    # servers come from zygotes (sparseps.launch.zygote) in a folder of the session's,
    # removed at its end (which stops them). Set before xdist starts its workers, so that
    # they share it; a folder the developer set is kept.
    global _zygote_folder
    if not os.environ.get(ZYGOTE_DIR):
        _zygote_folder = tempfile.mkdtemp(prefix="sparseps-zygotes-")  # mode 700
        os.environ[ZYGOTE_DIR] = _zygote_folder
    # An xdist worker shares the cores with the other one and with the jobs its tests
    # launch: torch's default (a thread per core) had two threads spin-wait on each other
    # (the learnable-limit training of tests/test_bench_quality.py: 207 s against 21 s with
    # one thread at load 11). The launched jobs' processes set their own.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _zygote_folder is not None and os.environ.get(ZYGOTE_DIR) == _zygote_folder:
        shutil.rmtree(_zygote_folder, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the heavy files first, longest first: both workers start on the longest units; then
    # the short files, the largest first, so that the last units handed out are the least
    weight: dict[str, int] = {}
    for name, took in HEAVY_FILES.items():
        unit = _unit_of(f"tests/{name}")
        weight[unit] = weight.get(unit, 0) + took
    tests_in: dict[str, int] = {}
    for item in items:
        tests_in[_unit(item)] = tests_in.get(_unit(item), 0) + 1

    def order(item: pytest.Item) -> tuple[bool, int, str]:
        unit = _unit(item)
        return unit not in weight, -weight.get(unit, tests_in[unit]), unit

    items.sort(key=order)  # stable: each unit's tests together, in their order
