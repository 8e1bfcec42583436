"""mmca's data modules and nets satisfy the Protocols of lit_icl.mmca.contracts that their modules check, and a
data module or net that does not is refused with one ConfigError."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from mmca.avmnist.helpers import write_layout
from torch import nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.protocols import implements
from lit_icl.mmca import (
    AVMNISTDataModule,
    AVMNISTModule,
    BayesOptimal,
    BidirectionalCrossAttention,
    DeepCrossAttention,
    LatentFactorDataModule,
    LatentFactorICLModule,
    MultimodalCrossAttention,
    SampleMean,
    SingleLayerLSA,
)
from lit_icl.mmca.contracts import (
    AVMNISTData,
    AVMNISTNet,
    CovariateNet,
    LatentFactorData,
    LayeredPromptNet,
    PromptNet,
)

TINY_NETS = {
    "lsa": lambda: SingleLayerLSA(d=4),
    "lca": lambda: DeepCrossAttention(d=4, depth=2),
    "lca_full": lambda: DeepCrossAttention(d=4, depth=2, parametrization="full"),
    "sample_mean": SampleMean,
    "bayes": BayesOptimal,
}
#: the Protocols each synthetic net satisfies (and the ones it does not)
LEVELS = {
    "lsa": (PromptNet, CovariateNet),
    "lca": (PromptNet, CovariateNet, LayeredPromptNet),
    "lca_full": (PromptNet, CovariateNet, LayeredPromptNet),
    "sample_mean": (PromptNet,),
    "bayes": (PromptNet,),
}


def test_latent_factor_data_module_satisfies_its_contract() -> None:
    dm = LatentFactorDataModule(d1=2, d2=2, batch_size=16, chunk_size=8, train_prompts=32, val_prompts=8,
                                test_prompts=8, eval_batch_size=8, test_context_lengths=[4, 8])  # fmt: skip
    assert implements(dm, LatentFactorData)
    assert not implements(SimpleNamespace(d=4, norm_range=(0.0, 5.0)), LatentFactorData)


@pytest.mark.parametrize("name", sorted(TINY_NETS))
def test_synthetic_nets_satisfy_their_contracts(name: str) -> None:
    net = TINY_NETS[name]()
    for protocol in (PromptNet, CovariateNet, LayeredPromptNet):
        assert implements(net, protocol) == (protocol in LEVELS[name]), protocol.__name__


@pytest.mark.parametrize(
    "net",
    [
        MultimodalCrossAttention(depth=1),
        MultimodalCrossAttention(False, False, depth=1),
        BidirectionalCrossAttention(depth=1),
    ],
    ids=["full", "neither", "bi"],
)
def test_avmnist_nets_satisfy_their_contract(net: nn.Module) -> None:
    # A contract check (implements) looks for the members, not their signatures.
    assert implements(net, AVMNISTNet) and not implements(net, LayeredPromptNet)


def test_avmnist_data_module_satisfies_its_contract(tmp_path: Path) -> None:
    write_layout(tmp_path, n_train=40, n_test=20, audio_side=28)
    dm = AVMNISTDataModule(root=str(tmp_path), val_size=8, batch_size=8, eval_batch_size=10)
    assert implements(dm, AVMNISTData) and not implements(dm, LatentFactorData)


def test_modules_refuse_what_breaks_the_contract() -> None:
    with pytest.raises(ConfigError, match="has no `represent` and `head`"):
        AVMNISTModule(net=nn.Linear(2, 2))
    module = LatentFactorICLModule(net=DeepCrossAttention(d=4, depth=2))
    with pytest.raises(ConfigError, match="lacks what LatentFactorICLModule reads: no attribute norm_range; no "
                                          "attribute test_context_lengths "):
        module.bind_datamodule(SimpleNamespace(d=4))
    with pytest.raises(ConfigError, match="lacks what AVMNISTModule reads: no attribute eval_splits; no attribute "
                                          "noise_std "):
        AVMNISTModule(net=MultimodalCrossAttention(depth=1)).bind_datamodule(SimpleNamespace(root="x"))
    # A net without `method` still gets rows, named after its class.
    plain = LatentFactorICLModule(net=nn.Linear(2, 2), test_depths=None)
    assert plain.method == "Linear" and plain.test_depths == [None]
