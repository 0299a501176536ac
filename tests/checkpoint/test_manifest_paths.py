"""A manifest names files inside its folder only: ``..``, absolute paths, NULs and
symlinks that resolve outside are refused on read and verify, naming manifest and entry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparseps.errors import CheckpointError
from sparseps.files import manifest as mf


def _folder(tmp_path: Path) -> tuple[Path, Path]:
    """A model folder with one good file, and a secret file next to (outside) it."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "good.arrow").write_bytes(b"rows")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not yours")
    return folder, secret


def _write(folder: Path, files: dict, **sections) -> None:
    """A manifest as an attacker (or a bug) would write it: bypasses write_manifest."""
    manifest = {"format": "sparseps-checkpoint", "version": mf.VERSION, "files": files, **sections}
    (folder / mf.MANIFEST).write_text(json.dumps(manifest))


def _record(path: Path) -> dict:
    return mf.file_record(path)


def _refused(folder: Path, entry: str, problem: str) -> None:
    for call in (lambda: mf.read_manifest(folder), lambda: mf.verify(folder)):
        with pytest.raises(CheckpointError) as err:
            call()
        text = str(err.value)
        assert str(folder / mf.MANIFEST) in text and repr(entry) in text and problem in text, text


def test_a_good_manifest_still_reads_and_verifies(tmp_path):
    folder, _ = _folder(tmp_path)
    (folder / "sub").mkdir()
    (folder / "sub" / "x.arrow").write_bytes(b"x")
    os.symlink("good.arrow", folder / "alias.arrow")  # a symlink inside the folder is fine
    files = {n: _record(folder / n) for n in ("good.arrow", "sub/x.arrow", "alias.arrow")}
    _write(folder, files, dense={"file": "good.arrow"})
    assert set(mf.verify(folder)["files"]) == set(files)


def test_dot_dot_is_refused(tmp_path):
    folder, secret = _folder(tmp_path)
    _write(folder, {"../secret.txt": _record(secret)})
    _refused(folder, "../secret.txt", "'..' part")


def test_an_absolute_path_is_refused(tmp_path):
    folder, secret = _folder(tmp_path)
    _write(folder, {str(secret): _record(secret)})
    _refused(folder, str(secret), "absolute path")


def test_a_nul_is_refused(tmp_path):
    folder, secret = _folder(tmp_path)
    _write(folder, {"good.arrow\x00../../secret.txt": _record(secret)})
    _refused(folder, "good.arrow\x00../../secret.txt", "NUL")


def test_a_symlink_resolving_outside_is_refused(tmp_path):
    folder, secret = _folder(tmp_path)
    os.symlink(secret, folder / "link.arrow")
    _write(folder, {"link.arrow": _record(secret)})  # size and checksum would match
    _refused(folder, "link.arrow", "outside the folder")
    # a symlinked sub-folder too
    os.remove(folder / "link.arrow")
    os.symlink(tmp_path, folder / "up")
    _write(folder, {"up/secret.txt": _record(secret)})
    _refused(folder, "up/secret.txt", "outside the folder")


@pytest.mark.parametrize(
    ("section", "entry"),
    [
        ({"dense": {"file": "../secret.txt"}}, "../secret.txt"),
        ({"tables": {"emb": {"files": ["good.arrow", "/etc/passwd"]}}}, "/etc/passwd"),
        ({"tables": {"emb": {"files": [], "tombstones": {"file": "../t.arrow"}}}}, "../t.arrow"),
    ],
    ids=["dense", "table-files", "tombstones"],
)
def test_names_in_other_sections_are_checked_too(tmp_path, section, entry):
    folder, _ = _folder(tmp_path)
    _write(folder, {"good.arrow": _record(folder / "good.arrow")}, **section)
    _refused(folder, entry, "")


def test_verify_of_a_manifest_passed_in_checks_names(tmp_path):
    folder, secret = _folder(tmp_path)
    manifest = {"format": "sparseps-checkpoint", "version": mf.VERSION,
                "files": {"../secret.txt": _record(secret)}}  # fmt: skip
    with pytest.raises(CheckpointError, match=r"'\.\./secret\.txt'"):
        mf.verify(folder, manifest)
