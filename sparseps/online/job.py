"""The script ``sparseps online`` hands to the launcher; it runs on every role.

``python -m sparseps.cli launch ... sparseps/online/job.py CONFIG.yaml``: servers serve;
workers build the model from the config and run :class:`~sparseps.online.driver.OnlineDriver`.
Worker 0 writes ``MODEL_DIR/status.json`` (``failed`` with the error when the job stops
on an error, e.g. a split whose done-marker never appeared or a damaged ledger, and on an
internal error, whose traceback then goes to its log).

A script of its own can run the same job with a phase hook and save hooks (the driver's
``on_phase`` and ``save_hooks``, e.g. a :class:`sparseps.testing.crash.CrashPoint`, which
is both): ``job.main([config], on_phase=hook, save_hooks=hook)``,
launched with :func:`sparseps.online.online_cli.launch_argv` ``(..., script=that_script)``.
"""

from __future__ import annotations

import logging
import sys

from sparseps.errors import SparsePSError

log = logging.getLogger("sparseps.online.job")


def build_model(config):
    """The model the config describes: ``model.builder(schema, **model.params)``, or the
    built-in wide&deep over the stream's schema."""
    import torch

    import sparseps as sps
    from sparseps.errors import ConfigError
    from sparseps.models import WideDeep
    from sparseps.online.config_values import resolve_ref

    m = config.model
    schema = config.data.dataset_schema()
    torch.manual_seed(m.seed)
    if m.builder is not None:
        builder = resolve_ref("model.builder", m.builder)
        try:
            model = builder(schema, **(m.params or {}))
        except TypeError as exc:
            raise ConfigError(f"model.builder {m.builder}: {exc} (check model.params)") from None
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(
                f"model.builder {m.builder}: returned {type(model).__name__}, not a torch.nn.Module"
            )
        return model
    rules = {"adam": sps.optim.Adam, "adagrad": sps.optim.Adagrad, "sgd": sps.optim.SGD}
    return WideDeep(
        schema.slots,
        len(schema.dense),
        emb_dim=m.emb_dim,
        hidden=m.hidden,
        deep_rule=rules[m.deep_rule](lr=m.deep_lr),
        wide_rule=sps.optim.FTRL(alpha=m.wide_lr, beta=0.0, l1=0.0, l2=0.0),
        lifecycle=m.build_lifecycle(),
    )


def build_loss(config):
    """The loss ``model.loss`` names (None: binary cross-entropy)."""
    from sparseps.online.config_values import resolve_ref
    from sparseps.worker.losses import Loss

    if config.model.loss is None:
        return None
    loss = resolve_ref("model.loss", config.model.loss)
    return loss() if isinstance(loss, type) and issubclass(loss, Loss) else loss


def build_trainer(config):
    """The model, loss and trainer the config describes."""
    import sparseps as sps

    m = config.model
    model = build_model(config)
    strategy = config.job.strategy  # Strategy.from_dict of the job section
    return sps.Trainer(
        model, dense_optimizer=sps.optim.Adam(lr=m.dense_lr), strategy=strategy,
        loss=build_loss(config),
    )  # fmt: skip


def follows_workers(config) -> bool:
    """Whether the job can follow workers joining and leaving between passes: plain async
    mode. Sync keeps its dense parameters on the workers, geo averages dense deltas over a
    worker count fixed at its start, hybrid all-reduces among them, bounded staleness
    compares a fixed set of workers' steps and heter maps trainers to heter workers at the
    start, so they run with the workers they were launched with (and do not set
    ``elastic/accepts_workers``: ``sparseps scale --workers`` refuses)."""
    mode = config.job.training_mode
    return mode.name == "async" and getattr(mode, "max_staleness", None) is None


def _newcomer(config) -> bool:
    """A worker started for a scale-up (before ``sps.init()``, which it must not let join
    the launch's group: it gets a group of one, replaced when it joins)."""
    from sparseps import env as sps_env

    role = sps_env.from_environ()
    if role is None or role.role is not sps_env.Role.WORKER or not follows_workers(config):
        return False
    # only now: membership brings the workers' group and with it torch, which a server
    # never needs (seconds of CPU to import and again to tear down at exit)
    from sparseps.online import membership

    timeout = sps_env.settings().rendezvous_timeout_s
    if not membership.is_newcomer(role, timeout_s=timeout):
        return False
    log.info("worker %d: started for a scale-up; joins at the next pass boundary", role.rank)
    membership.single_group()
    return True


def _members(config, rank: int, newcomer: bool):
    """The worker's membership (None: the workers are fixed)."""
    import sparseps as sps
    from sparseps.core import worker_store
    from sparseps.online.leaving import FIXED_KEY
    from sparseps.online.membership import Membership

    store = worker_store.current()
    if store is None or not follows_workers(config):
        if rank == 0 and store is not None:
            log.info("job.mode %s: workers are fixed for the run (scaling workers needs "
                     "async mode); sparseps scale --workers is refused", config.job.mode_name)  # fmt: skip
            # what the launcher says when one of them dies (sparseps.online.leaving)
            store.set(FIXED_KEY, f"job.mode {config.job.mode_name} trains with a fixed set of "
                      "workers, so a worker's death fails the job (a worker that dies leaves "
                      "only an async job with data.split: steal and data.lease_s); rerun it to "
                      "resume from its newest checkpoint")  # fmt: skip
        return None
    data, job = config.data, config.job
    world = 0 if newcomer else sps.worker_num()
    return Membership(store, rank, version=0, world=world,
                      collective_timeout_s=job.collective_timeout_s,
                      wait_s=data.wait_timeout_s + job.collective_timeout_s)  # fmt: skip


def main(argv: list[str] | None = None, *, on_phase=None, save_hooks=None) -> int:
    """Run this process's role of the job of ``argv == [CONFIG.yaml]``; the exit code.

    ``on_phase`` and ``save_hooks`` go to the :class:`~sparseps.online.driver.OnlineDriver`
    (tests use them to crash the job at an exact point).
    """
    import sparseps as sps
    from sparseps.online.config import load_config

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: job.py CONFIG.yaml", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = load_config(argv[0])
    newcomer = _newcomer(config)
    sps.init()
    if sps.is_server():
        sps.run_server()
        return 0
    if sps.is_heter_worker():  # its Trainer serves the dense network until the job stops
        build_trainer(config)
        return 0
    # after the server's return: the driver brings torch (about 4 s of CPU a process)
    from sparseps.online.driver import OnlineDriver
    from sparseps.online.model_dir import ModelDir

    rank = sps.worker_index()
    try:
        trainer = build_trainer(config)
        OnlineDriver(
            config, trainer, rank=rank, world=sps.worker_num(), on_phase=on_phase,
            save_hooks=save_hooks, members=_members(config, rank, newcomer), newcomer=newcomer,
        ).run()  # fmt: skip
    except SparsePSError as exc:
        log.error("online job stopped: %s", exc)
        if rank == 0:
            ModelDir(config.model_dir).write_status("failed", error=str(exc))
        print(f"sparseps online: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # a bug: its traceback goes to the log, status.json says it
        if rank == 0:
            ModelDir(config.model_dir).write_status(
                "failed", error=f"worker 0 stopped on an internal error, {type(exc).__name__}: "
                f"{exc} (its traceback is in worker 0's log)",
            )  # fmt: skip
        raise
    trainer.stop()
    sps.stop()
    return 0


if __name__ == "__main__":
    # launched, so sparseps.observe.child freezes the heap once this exits (the
    # interpreter's last collections then skip torch's modules)
    sys.exit(main())
