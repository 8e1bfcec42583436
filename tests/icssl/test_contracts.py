"""The shipped IC-SSL data modules and nets satisfy lit_icl.icssl.contracts (what ICSSLModule reads and expects),
and the module refuses objects that do not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.protocols import implements
from lit_icl.icssl import (
    FeatureEpisodeDataModule,
    GDICLHead,
    ICLTransformerBaseline,
    ICSSLDataModule,
    ICSSLModule,
    ICSSLNet,
    ImageManifoldDataModule,
    InContextEigenmap,
    KernelLogisticRegressionHead,
    LaplacianEigenmap,
    LogisticRegressionHead,
    ManifoldDataModule,
    RawCoordinates,
    SemiSupervisedICL,
    TwoStageNet,
)


def test_data_modules_satisfy_the_data_contract(tmp_path) -> None:
    # Built tiny; the image and feature modules read their files only in check_config / setup.
    for dm in (
        ManifoldDataModule(n_points=20, batch_size=16, chunk_size=8, eval_batch_size=16, val_episodes=16,
                           test_episodes=16, train_label_ratio=(0.1, 0.5), eval_label_ratios=[0.1, 0.5]),
        ManifoldDataModule(test_manifolds=["cylinder", "sphere"], n_points=20, chunk_size=8, batch_size=16,
                           eval_batch_size=16, val_episodes=16, test_episodes=16, train_label_ratio=(0.1, 0.5),
                           eval_label_ratios=[0.1, 0.5]),
        ImageManifoldDataModule(root=str(tmp_path / "none"), n_points=10, eval_label_ratios=[0.2, 0.5],
                                train_label_ratio=(0.2, 0.5)),
        FeatureEpisodeDataModule(features=str(tmp_path / "none.pt"), per_class=10, eval_label_ratios=[0.1, 0.4],
                                 train_label_ratio=(0.1, 0.4)),
    ):
        assert implements(dm, ICSSLDataModule), type(dm).__name__
        assert dm.labeled_subset in ("random", "stratified") and dm.n_points >= 2 and dm.eval_label_ratios
    assert isinstance(FeatureEpisodeDataModule(features="x.pt", per_class=10).train_episodes, int)


@pytest.mark.parametrize(
    "net",
    [
        SemiSupervisedICL(InContextEigenmap(n_points=20, stack_repeats=1), GDICLHead()),
        SemiSupervisedICL(LaplacianEigenmap(), LogisticRegressionHead()),
        SemiSupervisedICL(RawCoordinates(), KernelLogisticRegressionHead()),
        ICLTransformerBaseline(d_model=16, num_heads=2, dim_feedforward=16),
    ],
    ids=["e2e", "eig_lr", "rbf_lr", "transformer"],
)
def test_nets_satisfy_the_net_contract(net: nn.Module) -> None:
    assert implements(net, ICSSLNet)
    two_stage = implements(net, TwoStageNet)
    assert two_stage == isinstance(net, SemiSupervisedICL)
    assert two_stage or isinstance(net.method, str)  # a one-stage net names itself
    x = torch.randn(2, 20, 3)
    y = torch.randint(0, 2, (2, 20))
    labeled = torch.arange(20).expand(2, 20) < 5
    out = net(x, y, labeled)
    assert out.logits.shape == (2, 20, net.num_classes) and out.features.shape[:2] == (2, 20)


def test_module_refuses_a_net_or_data_module_outside_the_contract() -> None:
    with pytest.raises(ConfigError, match="is not an IC-SSL net: no attribute n_points; no attribute num_classes"):
        ICSSLModule(net=nn.Linear(3, 2))
    with pytest.raises(ConfigError, match="lit_icl.icssl.contracts.ICSSLDataModule"):
        ICSSLModule().bind_datamodule(object())
    # A data module of one's own that lacks one member is told which (the message once listed the first few only).
    from types import SimpleNamespace

    almost = SimpleNamespace(n_points=20, eval_label_ratios=[0.1], test_set_names=None, train_episodes=None)
    with pytest.raises(ConfigError) as refused:
        ICSSLModule().bind_datamodule(almost)
    assert str(refused.value).startswith("SimpleNamespace lacks what ICSSLModule reads: no attribute labeled_subset (a "
                                         "data module of your own needs eval_label_ratios: Sequence[float], ")
    assert str(refused.value).endswith("lit_icl.icssl.contracts.ICSSLDataModule); or use lit_icl.icssl.ManifoldDataModule")
