"""How the suite shares the machine's two cores under ``pytest -n 2`` (pytest-xdist).

The README's test command runs two xdist workers with the scheduler below: every test
file is one unit of work (its module fixtures set up once), handed out in collection
order, and the files in HEAVY_FILES (whole launched jobs, time bounds) are collected
first, so the long units start at once and the short files fill both workers at the end.
Measured in clean-clone CI runs of the same commit on this 2-core box: 888 s, against
1045 s with the heavy files as one unit run in order beside the short ones, and 913 s for
the 932 tests of the previous commit on one worker. Without ``-n`` (a developer running one
file) nothing changes.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from sparseps.env import ZYGOTE_DIR

# files whose tests launch jobs or measure time; the rest are short and share the cores
HEAVY_FILES = frozenset(
    {
        "checkpoint/test_esmm_inference.py",
        "checkpoint/test_load_restores.py",
        "checkpoint/test_model_input.py",
        "checkpoint/test_model_files.py",
        "checkpoint/test_resume_equals_fresh_load.py",
        "checkpoint/test_trainer_model_files.py",
        "data/test_data_paddle_port.py",
        "data/test_steal_lease.py",
        "data/test_work_stealing.py",
        "elastic/test_client_routing.py",
        "elastic/test_elastic_migration.py",
        "elastic/test_scale_launched.py",
        "examples/test_fleetx_port.py",
        "examples/test_paddlerec_port.py",
        "examples/test_slot_dnn_port.py",
        "heter/test_heter_launch.py",
        "heter/test_heter_restart.py",
        "heter/test_heter_sync.py",
        "launch/test_launch_jobs.py",
        "launch/test_launch_paddle_env.py",
        "launch/test_launch_restart.py",
        "launch/test_launch_server_exit.py",
        "launch/test_ray_backend.py",
        "launch/test_ray_heter.py",
        "metrics/test_metrics_distributed.py",
        "metrics/test_metrics_fleet.py",
        "observe/test_hang_diagnosis.py",
        "observe/test_job_observability.py",
        "online/test_online_drift.py",
        "online/test_online_extra_labels.py",
        "online/test_online_gpups.py",
        "online/test_online_missing.py",
        "online/test_online_modes.py",
        "online/test_online_predict.py",
        "online/test_online_relaunch_workers.py",
        "online/test_online_resume.py",
        "online/test_online_scale_workers.py",
        "online/test_online_workers_steal.py",
        "online/test_online_worker_dies.py",
        "recall/test_recall.py",
        "replication/test_replica_failover.py",
        "replication/test_replica_launch.py",
        "replication/test_replica_recovery.py",
        "rpc/test_rpc_cluster.py",
        "rpc/test_rpc_hardening.py",
        "security/test_secure_group.py",
        "security/test_secure_job.py",
        "security/test_secure_sync_training.py",
        "security/test_socket_census.py",
        "security/test_unauthenticated_peer.py",
        "server/test_server_disk_tier.py",
        "serving/test_batching.py",
        "serving/test_hot_reload.py",
        "serving/test_larger_than_memory.py",
        "serving/test_serve_model_schema.py",
        "serving/test_workers.py",
        "test_bench_quality.py",
        "test_clone.py",
        "test_demo.py",
        "worker/test_esmm_example.py",
        "worker/test_example.py",
        "worker/test_gpups_cluster.py",
        "worker/test_hybrid_steps.py",
        "worker/test_stragglers.py",
        "worker/test_sync_collectives.py",
        "worker/test_training_modes.py",
        "worker/test_wide_deep_lr.py",
    }
)
_TESTS = Path(__file__).parent
_RAY_CLUSTER_FILES = frozenset(
    {"tests/launch/test_ray_backend.py", "tests/launch/test_ray_heter.py"}
)
_zygote_folder: str | None = None  # the zygotes' folder this process made


def _relative(item: pytest.Item) -> str:
    return Path(item.path).relative_to(_TESTS).as_posix()


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
            path = nodeid.split("::", 1)[0]
            return "ray clusters" if path in _RAY_CLUSTER_FILES else path

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


def pytest_unconfigure(config: pytest.Config) -> None:
    if _zygote_folder is not None and os.environ.get(ZYGOTE_DIR) == _zygote_folder:
        shutil.rmtree(_zygote_folder, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the heavy files first: both workers start on the long units
    heavy = [item for item in items if _relative(item) in HEAVY_FILES]
    items[:] = heavy + [item for item in items if _relative(item) not in HEAVY_FILES]
