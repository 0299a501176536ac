"""``data.split: none`` in an online config: every worker reads every file (issue 58).

The datasets took ``split="none"`` (Paddle's reading of an unsplit file list); the online
config refused it. It is accepted, handed to the datasets as it is, and the accepted
values are exactly the datasets' ``Split`` values.
"""

from __future__ import annotations

import pytest

from sparseps.data.steal import Split
from sparseps.errors import ConfigError
from sparseps.online.config_data import DataConfig


def test_split_none_is_accepted_and_reaches_the_datasets():
    config = DataConfig(root="/stream", split="none")
    assert config.split == "none"
    assert config.dataset_options()["split"] == "none"


def test_the_accepted_splits_are_the_datasets():
    from sparseps.online.config_data import SPLITS

    assert set(SPLITS) == {s.value for s in Split}
    with pytest.raises(ConfigError, match="data.split") as caught:
        DataConfig(root="/stream", split="everywhere")
    assert "none" in str(caught.value)


def test_a_lease_still_needs_steal():
    with pytest.raises(ConfigError, match="data.lease_s: needs data.split: steal"):
        DataConfig(root="/stream", split="none", lease_s=5.0)
