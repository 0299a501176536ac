"""Progress bars of the long commands (``sparseps inspect``, ``sparseps demo``): shown
when forced on (``--progress``), never when stderr is not a terminal by default (the
captured stderr of these tests): no carriage return, no escape code. The demo's bar is
tested on its real runs in ``tests/test_demo.py``."""

from __future__ import annotations

import os

from sparseps.cli import main as sparseps_main
from sparseps.files import manifest as mf


def _model_dir(folder, sizes: dict[str, int]):
    """A checkpoint-format folder holding files of the given sizes, with its manifest."""
    folder.mkdir()
    files = {}
    for name, size in sizes.items():
        (folder / name).write_bytes(os.urandom(size))
        files[name] = mf.file_record(folder / name)
    mf.write_manifest(folder, "sparseps-checkpoint", files, state={"pass": 0})
    return folder


def test_inspect_counts_the_bytes_it_verifies_only_when_asked(tmp_path, capsys):
    model = _model_dir(tmp_path / "model", {"a.arrow": 300_000, "b.arrow": 700_000})
    assert sparseps_main(["inspect", str(model)]) == 0
    out, quiet = capsys.readouterr()
    assert "verified: 2 files match" in out
    assert "inspect:" not in quiet and "\r" not in quiet and "\x1b" not in quiet, quiet
    assert sparseps_main(["inspect", str(model), "--progress"]) == 0
    out, shown = capsys.readouterr()
    assert "verified: 2 files match" in out and "inspect: 100%" in shown, shown
    assert "977k/977k" in shown, shown  # 1,000,000 bytes in KiB
    # an altered file: the bar stops short, the error names the file, exit 1
    data = bytearray((model / "b.arrow").read_bytes())
    data[10] ^= 0xFF
    (model / "b.arrow").write_bytes(bytes(data))
    assert sparseps_main(["inspect", str(model), "--progress"]) == 1
    out, shown = capsys.readouterr()
    assert "INVALID" in out and "b.arrow: checksum mismatch" in out, out
    assert "inspect:  30%" in shown and "293k/977k" in shown and "100%" not in shown, shown
    assert sparseps_main(["inspect", str(model), "--no-progress"]) == 1
    assert "inspect:" not in capsys.readouterr().err
