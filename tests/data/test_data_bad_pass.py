"""No silent data loss: a pass of all-bad lines, or more than max_bad_ratio bad, fails.

The InputError names the format, the file and the first bad lines, and the format the
lines do parse in when there is one (the issue-27 case: Paddle generator output read as
slot text).
"""

from __future__ import annotations

import re
import sys

import pytest

from sparseps.data import CRITEO, MAX_BAD_RATIO, InMemoryDataset, QueueDataset
from sparseps.errors import ConfigError, InputError

GOOD = "\t".join(["1", *["2"] * 13, *["abc"] * 26])
MULTISLOT = " ".join(["1 1", *["1 2"] * 13, *["1 7"] * 26])  # what MultiSlotDataGenerator prints


def test_the_default_is_well_under_one_in_ten():
    assert MAX_BAD_RATIO == 0.01


def test_generator_output_read_as_slot_text_fails_and_names_multislot(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text(f"{MULTISLOT}\n" * 500)
    ds = QueueDataset(str(raw), CRITEO, 64, pipe_command="cat")  # default: slot_text
    with pytest.raises(InputError) as info:
        list(ds)
    text = str(info.value)
    assert "every line read as format='slot_text' was bad" in text
    assert f"{raw}:1: " in text and f"{raw}:5: " in text  # the file and first bad lines
    assert text.endswith('look like multislot; pass format="multislot"'), text
    # told so, the same pass reads every line
    fixed = QueueDataset(str(raw), CRITEO, 64, pipe_command="cat", format="multislot")
    assert sum(len(b) for b in fixed) == 500


def test_all_bad_tsv_read_as_multislot_points_back_to_criteo_tsv(tmp_path):
    path = tmp_path / "part-0.tsv"
    path.write_text(f"{GOOD}\n" * 20)
    with pytest.raises(InputError, match=r"format='multislot'.*pass format=\"criteo_tsv\""):
        list(QueueDataset(str(path), CRITEO, 8, format="multislot"))


def test_five_percent_bad_lines_fail_the_pass_naming_the_format(tmp_path):
    lines = [GOOD] * 200
    for n in range(0, 200, 20):  # 10 of 200 = 5%
        lines[n] = "1\t2\t3"
    path = tmp_path / "part-0.tsv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as info:
        list(QueueDataset(str(path), CRITEO, 32))
    text = str(info.value)
    assert "10 of 200 lines read as format='criteo_tsv' were bad (5.0%; max_bad_ratio=0.01)" in text
    assert f"{path}:1: expected 40 fields, got 3" in text and f"{path}:21: " in text
    assert "raise max_bad_ratio=" in text
    ds = InMemoryDataset(str(path), CRITEO, 32)  # loading fails the same way
    with pytest.raises(InputError, match=re.escape("format='criteo_tsv'")):
        ds.load_into_memory()
    assert len(ds) == 0
    # a ratio above the share skips them, as before
    ok = QueueDataset(str(path), CRITEO, 32, max_bad_ratio=0.06)
    assert sum(len(b) for b in ok) == 190 and ok.stats().bad_lines == 10


def test_a_bad_share_at_the_limit_passes(tmp_path):
    lines = [GOOD] * 100
    lines[50] = "short"
    path = tmp_path / "part-0.tsv"
    path.write_text("\n".join(lines) + "\n")
    ds = QueueDataset(str(path), CRITEO, 32)  # 1 of 100 = exactly 0.01: allowed
    assert sum(len(b) for b in ds) == 99
    with pytest.raises(InputError, match="every line"):  # even with a ratio of 1
        path.write_text("short\n")
        list(QueueDataset(str(path), CRITEO, 32, max_bad_ratio=1.0))


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "0.1", True])
def test_max_bad_ratio_is_checked(tmp_path, value):
    (tmp_path / "a.tsv").write_text(GOOD + "\n")
    with pytest.raises(ConfigError, match="max_bad_ratio"):
        QueueDataset(str(tmp_path / "a.tsv"), CRITEO, 4, max_bad_ratio=value)


def test_a_generator_script_that_drops_every_line_is_not_silent(tmp_path):
    """A generator whose every sample has the wrong slots: the pass fails loudly."""
    script = tmp_path / "gen.py"
    script.write_text(
        "import sparseps.data as fleet\n"
        "class G(fleet.MultiSlotDataGenerator):\n"
        "    def generate_sample(self, line):\n"
        "        def it():\n"
        "            yield [('label', [1]), ('C1', [5])]\n"
        "        return it\n"
        "G().run_from_stdin()\n"
    )
    raw = tmp_path / "raw.txt"
    raw.write_text("x\n" * 50)
    ds = QueueDataset(str(raw), CRITEO, 8, pipe_command=f"{sys.executable} {script}",
                      format="multislot")  # fmt: skip
    with pytest.raises(InputError, match=r"every line read as format='multislot' was bad.*:1: "):
        list(ds)
