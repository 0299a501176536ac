"""Inference models: filtered embeddings + the dense head exported with ``torch.export``.

An inference model directory is a chain of saves, each a folder with its own manifest::

    DIR/base-00003/   MANIFEST.json, head.pt2, {table}.base-RRRRR-of-SSSSS.arrow ...
    DIR/delta-00004/  MANIFEST.json, head.pt2, {table}.delta-..., {table}.tombstones.arrow
    DIR/delta-00005/  ...

Sequence numbers increase across bases and deltas. Each save is written into a hidden
staging folder and renamed into place once its manifest is written (see
:mod:`.staging`), so a crash never leaves a ``base-``/``delta-`` folder without a
manifest. A reader takes the newest complete base and applies, in order, every complete
delta after it (stopping at the first missing or incomplete one). Embedding files hold ``key: uint64`` and
``embedding: fixed_size_list<float32>[dim]``; tombstone files hold ``key`` (keys that
shrink deleted: they fall back to what a pull of an unknown key gives in training).
``head.pt2`` is ``torch.export.save`` of the model's ``head(dense, *pooled)``, exported
with a dynamic batch dimension (:func:`load_head` reads it); the manifest's
``embeddings`` section lists, in head argument order, each embedding module's table,
dim, slots and pooling, ``head`` the file, the example input shapes and the outputs per
row, and ``input`` the data the model was trained on (:mod:`.model_input`; null when the
trainer did not learn it).

Saves made before ``torch.export`` (sparseps up to issue 19) hold ``head.pt``, a
TorchScript module: :func:`load_head` still loads it through ``torch.jit.load`` (logging
that the format is deprecated) and names the folder and the fix if that fails.
"""

from __future__ import annotations

import copy
import inspect
import logging
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from ..files import manifest as mf
from . import staging
from .checkpoint import write_tombstones
from .hooks import NO_HOOKS, SaveHooks

__all__ = [
    "HEAD_FILE",
    "LEGACY_HEAD_FILE",
    "chain",
    "chains",
    "example_inputs",
    "export_head",
    "export_problem",
    "load_head",
    "saves",
    "write_inference",
]

log = logging.getLogger(__name__)

HEAD_FILE = "head.pt2"  # torch.export
LEGACY_HEAD_FILE = "head.pt"  # TorchScript, saves made before torch.export
_MAX_DENSE_PROBE = 4096  # the widest dense input _dense_width tries
_FOLDER = re.compile(r"^(base|delta)-(\d{5})$")


def saves(directory: Path) -> list[tuple[int, str, Path]]:
    """Inference save folders ``(sequence, kind, path)`` in ``directory``, complete or not,
    oldest first."""
    found = []
    if directory.is_dir():
        for child in directory.iterdir():
            match = _FOLDER.fullmatch(child.name)
            if match and child.is_dir():
                found.append((int(match.group(2)), match.group(1), child))
    return sorted(found)


def chains(directory: str | Path) -> list[list[Path]]:
    """Every chain of ``directory``, newest first: each complete base, then the complete
    deltas after it, up to the first incomplete save or the next base.

    An older base's chain ends where the next base begins: a delta holds what changed
    since the save before it, so the deltas after a newer base cannot apply to an older
    one. A reader that cannot load the newest chain falls back to the next one.
    """
    found = saves(Path(directory))
    complete = [(kind, path, (path / mf.MANIFEST).is_file()) for _, kind, path in found]
    result = []
    for i, (kind, path, whole) in enumerate(complete):
        if kind != "base" or not whole:
            continue
        folders = [path]
        for later_kind, later, later_whole in complete[i + 1 :]:
            if later_kind != "delta" or not later_whole:
                break
            folders.append(later)
        result.append(folders)
    return result[::-1]


def chain(directory: str | Path, *, warn: bool = True) -> list[Path]:
    """The folders to load, in order: newest complete base, then its complete deltas.

    ``warn=False``: do not log where the chain stops (a watcher polling the folder logs
    each stop once itself).

    Raises:
        CheckpointError: no complete base save in ``directory``.
    """
    directory = Path(directory)
    found = chains(directory)
    if not found:
        raise CheckpointError(
            f"{directory}: no complete base inference model (base-NNNNN with a {mf.MANIFEST})"
        )
    result = found[0]
    every = [path for _, _, path in saves(directory)]
    after = every[every.index(result[-1]) + 1 :]
    if warn and after:
        log.warning(
            "%s: stopping at %s (incomplete or unexpected); later saves are ignored",
            directory,
            after[0].name,
        )
    return result


def _head_of(model) -> torch.nn.Module:
    head = getattr(model, "head", None)
    if head is None or not hasattr(model, "embeddings"):
        raise CheckpointError(
            f"save_inference_model needs a sparseps.nn.SparseModel, and {type(model).__name__} "
            "is not one: subclass sparseps.nn.SparseModel, put the SparseEmbedding modules in "
            "self.embeddings (each with slots= and a pooling) and the dense part in "
            "self.head(dense, *pooled) -> logits (a worked port: docs/migrating-from-paddle.md, "
            '"Porting a static-graph model")'
        )
    return head


def _dense_width(head: torch.nn.Module, pooled: list[torch.Tensor]) -> int:
    """The dense input width ``head`` accepts, found by calling a copy of it (in eval mode,
    as it is exported) on zeros of a few rows, one width after the other: the model does
    not record it anywhere.

    CPU tensors, not meta ones: a process's first meta op imports torch's meta kernels
    (~1.5 CPU-s), and every trainer probes when it is made. Here a width that does not fit
    fails at the first layer's shape check, and the one that fits costs one small forward.
    """
    probe = copy.deepcopy(head).to("cpu").eval()
    rows = pooled[0].shape[0] if pooled else 2
    with torch.no_grad():
        for width in range(_MAX_DENSE_PROBE + 1):
            try:
                probe(torch.zeros(rows, width), *pooled)
            except (RuntimeError, ValueError, IndexError, TypeError):
                continue
            return width
    raise CheckpointError(
        f"cannot export {type(head).__name__}: no dense width up to {_MAX_DENSE_PROBE} fits it; "
        "give the head an example_inputs(batch_size) method returning (dense, *pooled)"
    )


def example_inputs(model, batch_size: int = 2) -> tuple[torch.Tensor, ...]:
    """Zero tensors shaped like one call of ``model.head(dense, *pooled)``.

    A head that defines ``example_inputs(batch_size)`` gives them itself; otherwise the
    pooled shapes come from the embedding modules (``[B, len(slots), dim]``) and the dense
    width is probed (:func:`_dense_width`).

    Raises:
        CheckpointError: an embedding module without ``slots`` or pooling (its shape is
            set by the data, not the model) and no ``example_inputs`` on the head.
    """
    head = _head_of(model)
    own: Callable[[int], tuple[torch.Tensor, ...]] | None = getattr(head, "example_inputs", None)
    if own is not None:
        return tuple(own(batch_size))
    pooled = []
    for e in model.embeddings:
        if e.slots is None or e.pooling is None:
            raise CheckpointError(
                f"cannot export the head: embedding of table {e.table!r} has "
                f"slots={e.slots!r}, pooling={e.pooling!r}, so its shape depends on the data; "
                "give it slots= and a pooling, or give the head an example_inputs(batch_size) method"
            )
        pooled.append(torch.zeros(batch_size, len(e.slots), e.output_dim))
    width = _dense_width(head, pooled)
    return (torch.zeros(batch_size, width), *pooled)


def export_problem(model) -> str | None:
    """Why ``save_inference_model`` could not export ``model`` (None: it can, as far as can
    be told without exporting: a head, embeddings with fixed shapes, a dense width).

    Cheap (the dense width is probed on zeros of two rows), so a trainer checks it when made.
    """
    try:
        example_inputs(model)
    except CheckpointError as exc:
        return str(exc)
    return None


def export_head(model) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model.head`` in eval mode, every input's dim 0 dynamic."""
    head = _head_of(model)
    inputs = example_inputs(model)
    batch = torch.export.Dim("batch", min=1)
    was_training = head.training
    head.eval()
    try:
        return torch.export.export(
            head, inputs, dynamic_shapes=_dynamic_shapes(head, inputs, batch)
        )
    except Exception as exc:  # torch raises many kinds; the save must name the head
        raise CheckpointError(
            f"torch.export of {type(head).__name__} failed ({type(exc).__name__}: {exc}); "
            "the head must be exportable (no data-dependent Python control flow)"
        ) from exc
    finally:
        head.train(was_training)


def _dynamic_shapes(head: torch.nn.Module, inputs: tuple, batch) -> list | dict:
    """Dim 0 of every input dynamic, in the structure of ``head.forward``'s signature:
    a head taking ``(dense, *pooled)`` gets its pooled inputs as one tuple argument."""
    dynamic = {0: batch}
    try:
        parameters = list(inspect.signature(head.forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read: one input per parameter
        return [dynamic for _ in inputs]
    shapes: dict = {}
    for i, parameter in enumerate(parameters):
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            shapes[parameter.name] = tuple(dynamic for _ in inputs[i:])
            return shapes
        if i < len(inputs):
            shapes[parameter.name] = dynamic
    return shapes


def load_head(folder: Path, manifest: dict) -> Callable[..., torch.Tensor]:
    """The dense head of one inference save, ready to call ``head(dense, *pooled)``.

    Raises:
        CheckpointError: the save has no head file, or it cannot be loaded (names the
            folder and what to do).
    """
    files = manifest.get("files", {})
    if HEAD_FILE in files:
        try:
            return torch.export.load(str(folder / HEAD_FILE)).module()
        except Exception as exc:  # a torch.export archive that does not load
            raise CheckpointError(
                f"{folder / HEAD_FILE}: cannot load the exported head "
                f"({type(exc).__name__}: {exc}); re-save the inference model"
            ) from exc
    if LEGACY_HEAD_FILE in files:
        return _load_legacy_head(folder / LEGACY_HEAD_FILE)
    raise CheckpointError(
        f"{folder}: the manifest lists no dense head ({HEAD_FILE} or {LEGACY_HEAD_FILE})"
    )


def _load_legacy_head(path: Path) -> Callable[..., torch.Tensor]:
    """A TorchScript head of a save made before ``torch.export``."""
    log.warning(
        "%s: TorchScript head (deprecated in torch); it still loads, but the next "
        "save_inference_model writes %s with torch.export",
        path,
        HEAD_FILE,
    )
    jit = getattr(torch, "jit", None)
    if jit is None or not hasattr(jit, "load"):
        raise CheckpointError(
            f"{path}: a TorchScript head, and this torch ({torch.__version__}) cannot load "
            "TorchScript; save the model again with this sparseps (it writes "
            f"{HEAD_FILE}), or load it with torch < 2.13"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # logged once above instead
            head = jit.load(str(path))
    except Exception as exc:  # what torch.jit raises on a bad archive varies
        raise CheckpointError(
            f"{path}: cannot load this TorchScript head ({type(exc).__name__}: {exc}); save "
            f"the inference model again with this sparseps (it writes {HEAD_FILE})"
        ) from exc
    head.eval()
    return head


def write_inference(trainer, directory: Path, mode: str, *, hooks: SaveHooks = NO_HOOKS) -> Path:
    """Worker 0's part of ``save_inference_model``: servers write rows, we write the rest.

    Everything goes into a hidden staging folder that is renamed to ``{mode}-NNNNN`` once
    its manifest is written, so a crash leaves no incomplete save in the chain. The
    servers' changed-rows marker is *not* reset here (see ``trainer_files``): a save that
    never lands must leave its rows for the next delta. ``hooks``: fault injection for
    tests (:mod:`.hooks`).
    """
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    found = saves(directory)
    if mode == "delta" and not any(kind == "base" for _, kind, _ in found):
        raise CheckpointError(
            f"{directory}: a delta needs a base inference model first (save mode='base')"
        )
    sequence = (found[-1][0] + 1) if found else 0
    target = directory / f"{mode}-{sequence:05d}"
    for other in ("base", "delta"):  # an interrupted save may have had the other kind
        staging.remove_stale(directory / f"{other}-{sequence:05d}")
    # a failed save leaves its hidden staging folder, out of the chain; the next save removes it
    folder = staging.new_staging(target)
    _write_save(trainer, folder, mode, sequence, hooks)
    staging.commit(folder, target, hooks=hooks)
    log.info("inference model (%s) saved to %s", mode, target)
    return target


def _write_save(trainer, folder: Path, mode: str, sequence: int, hooks: SaveHooks) -> None:
    recorded = trainer.inference.input  # what the trainer trained on (model_input)
    files: dict[str, dict] = {}
    tables: dict[str, dict] = {}
    for name, config in trainer.tables.items():
        records = trainer.state.client.save_inference(name, str(folder), mode)
        hooks.after_table_saved(name)
        tombstones = trainer.state.tombstones(name) if mode == "delta" else np.empty(0, np.uint64)
        if tombstones.size:
            records = [*records, write_tombstones(folder, name, tombstones)]
        for record in records:
            files[record["name"]] = mf.entry_of(record)
        tables[name] = {
            "config": config.to_dict(),
            "rows": sum(r["rows"] for r in records if r["kind"] == mode),
            "tombstones": int(tombstones.size),
            "files": sorted(r["name"] for r in records),
        }
    program = export_head(trainer.model)
    with warnings.catch_warnings():
        # A trained head's parameters are views of one flat vector (DenseParams.set hands
        # the pulled vector to torch.nn.utils.vector_to_parameters): torch.export saves that
        # whole storage once and warns that no single tensor covers it. Nothing is lost
        # (the predictor tests compare its outputs with the trainer's).
        warnings.filterwarnings("ignore", message="No complete tensor found in the group")
        torch.export.save(program, str(folder / HEAD_FILE))
    files[HEAD_FILE] = mf.file_record(folder / HEAD_FILE)
    head_inputs = [list(t.shape[1:]) for t in program.example_inputs[0]]
    with torch.no_grad():  # one call on the example inputs: how many outputs a row gets
        outputs = int(np.prod(program.module()(*program.example_inputs[0]).shape[1:]))
    embeddings = [
        {
            "table": e.table,
            "dim": e.dim,
            "slots": list(e.slots) if e.slots is not None else None,
            "pooling": e.pooling,
            "cvm": e.cvm,  # the slots' show/click features (the table config has the rest)
        }
        for e in trainer.model.embeddings
    ]
    mf.write_manifest(
        folder,
        "sparseps-inference",
        files,
        kind=mode,
        sequence=sequence,
        tables=tables,
        embeddings=embeddings,
        head={"format": "torch.export", "inputs": head_inputs, "outputs": outputs},
        input=None if recorded is None else recorded.to_dict(),
        state={"passes": trainer.state.passes},
    )
