"""``ModelWatcher``: follow an inference chain while serving it.

The served model is one :class:`ServedModel` (an immutable
:class:`~sparseps.checkpoint.predictor.Predictor` plus when it was loaded) behind one
reference. A poll (every ``poll_s``, on the watcher's own thread) compares the chain on
disk (:func:`sparseps.checkpoint.inference.chain`) with the served one:

- new deltas after the served chain: each is verified and applied to a *new* predictor
  (:meth:`Predictor.then`); then the reference is swapped, in one assignment;
- a new base (or a chain that was rewritten, e.g. a restarted job deleted saves newer
  than its checkpoint): the new chain is loaded on the side and swapped in the same way;
  the old model is freed once the requests that hold it finish;
- a save that does not verify, load or answer a one-row warm-up request (corrupt,
  truncated, a head that fails) is refused:
  one log line per save, ``reloads{outcome="refused"}``, and the previous model keeps
  serving; deltas after it wait for the next base. A ``base-``/``delta-`` folder without a
  manifest is an incomplete save: logged once, ignored until its manifest appears.

At start it serves the newest chain that verifies (and answers the warm-up request):
a save skipped there (:attr:`Predictor.skipped`) is counted and logged as refused, so a
restart after a corrupt save serves the chain before it, and polls leave the save alone
until it is rewritten.

A request reads the reference once (:attr:`ModelWatcher.current`) and uses that model to
the end, so it never sees a half-applied model.
"""

from __future__ import annotations

import calendar
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import inference
from ..checkpoint.predictor import Predictor
from ..errors import CheckpointError
from ..files import manifest as mf
from .memory import memory_report

__all__ = ["ModelWatcher", "ServedModel"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """What one request uses: the model and when it was loaded (``time.time()``)."""

    predictor: Predictor
    loaded_at: float

    @property
    def created_at(self) -> float:
        """When the last applied save was written (its manifest's ``created``)."""
        created = str(self.predictor.manifest.get("created"))
        try:
            return float(calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")))
        except (TypeError, ValueError):
            return self.loaded_at

    def describe(self) -> dict:
        """The ``GET /model`` answer."""
        p = self.predictor
        now = time.time()
        return {
            "directory": str(p.directory),
            "base": p.saves[0].name,
            "deltas": [f.name for f in p.saves[1:]],
            "sequence": p.sequence,
            "outputs": p.outputs,
            "passes": p.passes,
            "created": p.manifest.get("created"),
            "age_s": round(max(0.0, now - self.created_at), 3),
            "loaded_s_ago": round(now - self.loaded_at, 3),
            "rows": p.rows(),
            "bytes": p.nbytes(),
            "memory": memory_report(p.mapped_files()),
        }


# listener(outcome, folder name, error or None): "applied" or "refused"
ReloadListener = Callable[[str, str, str | None], None]


class ModelWatcher:
    """Serve the newest chain of ``directory`` and follow it (see the module docstring).

    Args:
        directory: the inference model folder.
        poll_s: seconds between polls of the folder (the watcher thread).
        on_reload: called after each applied or refused save (metrics).
        warmup: called with each model before it is served (a first call of a new head,
            or of the compiled hashing, costs far more than the next ones).
        on_swap: called on the watcher's thread after a poll swapped the model or
            refused a save (``--workers``' board, :mod:`.board`).
        index_dir: where the bases' row indexes are shared between processes
            (:class:`Predictor`'s ``index_dir``).

    Raises:
        CheckpointError: the folder holds no chain that loads and answers the warm-up
            (nothing to serve yet).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        poll_s: float = 1.0,
        on_reload: ReloadListener | None = None,
        warmup: Callable[[Predictor], object] | None = None,
        on_swap: Callable[[ServedModel], object] | None = None,
        index_dir: Path | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.index_dir = index_dir
        self.poll_s = poll_s
        self._on_reload = on_reload or (lambda outcome, name, error: None)
        self._refused: dict[str, tuple] = {}  # folder name -> the manifest stat refused
        self._incomplete: set[str] = set()
        self.last_refusal: str | None = None
        self.applied = 0
        self.refused = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warmup = warmup or (lambda predictor: None)
        self._on_swap = on_swap or (lambda served: None)
        first = Predictor(self.directory, check=self._warm, index_dir=index_dir)
        self._current = ServedModel(first, time.time())
        log.info("serving %s: %s", self.directory, self._summary(self._current.predictor))
        for folder, reason in first.skipped:
            self._refuse_once(folder.name, _stamp(folder), reason)

    @property
    def current(self) -> ServedModel:
        """The model to use for one request (read once, use to the end)."""
        return self._current

    def start(self) -> ModelWatcher:
        """Start polling on a daemon thread (stopped by :meth:`close`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="model-watcher", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop polling; waits up to ``timeout`` s for a load in progress to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ModelWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        refused = self.refused
        while not self._stop.wait(self.poll_s):
            try:
                changed = self.poll()
                if changed or self.refused != refused:
                    self._on_swap(self._current)
                refused = self.refused
            except Exception:  # a bug here must not stop the service from serving
                log.exception("%s: poll of the inference chain failed", self.directory)

    def poll(self) -> bool:
        """Check the chain once and apply what is new; True if the model changed."""
        try:
            wanted = inference.chain(self.directory, warn=False)
        except CheckpointError as exc:
            self._refuse_once("<chain>", (), str(exc))
            return False
        self._note_incomplete(wanted)
        served = self._current.predictor
        if list(served.saves) == wanted:
            return False
        extends = wanted[: len(served.saves)] == list(served.saves)
        model = served if extends else None
        todo = wanted[len(served.saves) :] if extends else wanted
        if self._refused.get(todo[0].name) == _stamp(todo[0]):
            return False  # refused before and unchanged: what follows it waits for a new base
        if not extends:
            log.info(
                "%s: the chain is now %s (was %s); loading it",
                self.directory,
                [f.name for f in wanted],
                [f.name for f in served.saves],
            )
        for folder in todo:
            stamp = _stamp(folder)
            if self._refused.get(folder.name) == stamp:
                break  # refused before and unchanged: deltas after it wait for a new base
            try:
                following = (
                    model.then(folder)
                    if model is not None
                    else Predictor(folder.parent, [folder], index_dir=self.index_dir)
                )
                self._warm(following)
            except CheckpointError as exc:
                self._refuse_once(folder.name, stamp, str(exc))
                break
            model = following
            self.applied += 1
            self._on_reload("applied", folder.name, None)
        if model is None or model is served:
            return False
        self._current = ServedModel(model, time.time())  # the swap: one assignment
        log.info("%s: now serving %s", self.directory, self._summary(model))
        return True

    def _warm(self, model: Predictor) -> None:
        """One prediction before serving; a model that fails it is not served."""
        try:
            self._warmup(model)
        except CheckpointError:  # the warm-up's own verdict, already naming the save
            raise
        except Exception as exc:  # whatever the head raises, the save is what is wrong
            raise CheckpointError(
                f"{model.saves[-1]}: the model fails on a one-row request of the service's "
                f"schema ({type(exc).__name__}: {exc}); was it trained on another schema?"
            ) from exc

    def _refuse_once(self, name: str, stamp: tuple, error: str) -> None:
        if self._refused.get(name) == stamp:
            return
        self._refused[name] = stamp
        self.refused += 1
        self.last_refusal = f"{name}: {error}"
        self._on_reload("refused", name, error)
        log.error(
            "refusing %s: %s; still serving %s",
            name,
            error,
            self._summary(self._current.predictor),
        )

    def _note_incomplete(self, wanted: list[Path]) -> None:
        """Log once each save folder after the chain that has no manifest yet."""
        found = inference.saves(self.directory)
        last = max((seq for seq, _, folder in found if folder in wanted), default=-1)
        for seq, _, folder in found:
            incomplete = seq > last and not (folder / mf.MANIFEST).is_file()
            if incomplete and folder.name not in self._incomplete:
                self._incomplete.add(folder.name)
                log.warning(
                    "%s: no %s (an incomplete save); waiting for it, serving %s",
                    folder,
                    mf.MANIFEST,
                    self._summary(self._current.predictor),
                )

    @staticmethod
    def _summary(p: Predictor) -> str:
        return f"{p.saves[0].name} + {len(p.saves) - 1} deltas (sequence {p.sequence})"


def _stamp(folder: Path) -> tuple:
    """What identifies one version of a save: its manifest's file (inode, change time) and
    size and mtime. A copy of the save made again (``cp -a`` and ``rsync -a`` keep mtimes)
    is a new file, so a refused save that is delivered again is tried again."""
    try:
        stat = (folder / mf.MANIFEST).stat()
    except OSError:
        return ()
    return (stat.st_ino, stat.st_ctime_ns, stat.st_size, stat.st_mtime_ns)
