"""CoQE's data modules and nets satisfy the contracts their modules check (lit_icl.coqe.contracts), and a data
module or net that does not is refused with one ConfigError naming what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
from coqe.omniglot.helpers import write_omniglot_fixture
from lightning.pytorch import LightningDataModule
from torch import nn

from lit_icl.coqe import (
    Averaging,
    CoQEClassificationModule,
    CoQEClassifier,
    CoQERegressionModule,
    CoQERegressor,
    LeastSquares,
    OmniglotSequenceDataModule,
    RegressionDataModule,
    RegressionTransformer,
    SequenceTransformer,
)
from lit_icl.coqe.contracts import PromptData, PromptNet, SequenceData, SequenceNet, SizedPromptNet
from lit_icl.core.errors import ConfigError
from lit_icl.core.protocols import implements

TINY = (8, 8, 8, 16)


def test_omniglot_side(tmp_path: Path) -> None:
    folder = write_omniglot_fixture(tmp_path / "omniglot-py")
    dm = OmniglotSequenceDataModule(source="omniglot", folder=str(folder), image_size=16, n_holdout=4, n_common=2,
                                    batch_size=8, chunk_size=4)
    assert implements(dm, SequenceData)
    for net in (CoQEClassifier(resnet_channels=TINY), SequenceTransformer(resnet_channels=TINY)):
        assert implements(net, SequenceNet)
    module = CoQEClassificationModule(CoQEClassifier(resnet_channels=TINY, depth=1))
    module.bind_datamodule(dm)
    assert module.net.n_classes == dm.n_labels == 20
    with pytest.raises(ConfigError, match=r"^LightningDataModule lacks what CoQEClassificationModule reads: no "
                                          r"attribute n_labels; no attribute source \(a data module of your own"):
        module.bind_datamodule(LightningDataModule())
    with pytest.raises(ConfigError, match="Linear is not a sequence classifier"):
        CoQEClassificationModule(nn.Linear(2, 2))


def test_regression_side() -> None:
    dm = RegressionDataModule(function_class="linear", n_dims=4, n_points=6, batch_size=8, chunk_size=4)
    assert implements(dm, PromptData)
    for net in (CoQERegressor(4, width=16, depth=1, heads=2, max_points=8), RegressionTransformer(4, width=16, depth=1, heads=2, max_points=8)):
        assert implements(net, SizedPromptNet)
    assert implements(LeastSquares(), PromptNet) and not implements(LeastSquares(), SizedPromptNet)
    module = CoQERegressionModule(CoQERegressor(4, width=16, depth=1, heads=2, max_points=8), baselines=[Averaging()])
    module.bind_datamodule(dm)
    assert module.n_dims == 4 and module.shift_names == dm.shift_names
    with pytest.raises(ConfigError, match="n_dims=5 but the data has 4"):
        CoQERegressionModule(CoQERegressor(5, width=16, depth=1, heads=2, max_points=8)).bind_datamodule(dm)
    with pytest.raises(ConfigError, match="max_points=4 < the data's n_points=6"):
        CoQERegressionModule(CoQERegressor(4, width=16, depth=1, heads=2, max_points=4)).bind_datamodule(dm)
    with pytest.raises(ConfigError, match=r"lacks what CoQERegressionModule reads: no attribute function_class; no "
                                          r"attribute n_dims; no attribute n_points; no attribute shift_names; no "
                                          r"method features \(a data module of your own needs function_class: str"):
        module.bind_datamodule(LightningDataModule())
    with pytest.raises(ConfigError, match="Linear is not a regression net: no attribute method; forward"):
        CoQERegressionModule(nn.Linear(2, 2))

    class OtherNames(nn.Module):  # a user's net: the right members, the arguments named otherwise
        method = "mine"

        def forward(self, x, y, x_query=None):
            return y

    with pytest.raises(ConfigError, match=r"OtherNames is not a regression net: forward\(x, y, x_query=None\) does "
                                          r"not take xs, ys, xq \(a net of your own needs method: str, "
                                          r"forward\(xs, ys, xq=None\)"):
        CoQERegressionModule(OtherNames())
