"""A module built in Python with a net object saves that net the way a config gives it, so ``load_from_checkpoint``
rebuilds the very net it was trained with (before, the checkpoint kept only the weights, and a net whose shapes
matched the default's was silently rebuilt with the default's settings: another model)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import lightning
import pytest
import torch
from torch import nn

from lit_icl.coqe import CoQEClassificationModule, CoQEClassifier, CoQERegressionModule, CoQERegressor, Lasso
from lit_icl.core.errors import ConfigError
from lit_icl.core.module import ICLModule
from lit_icl.core.nets import net_config
from lit_icl.icssl import GDICLHead, ICSSLModule, InContextEigenmap, SemiSupervisedICL
from lit_icl.mmca import AVMNISTModule, DeepCrossAttention, LatentFactorICLModule, MultimodalCrossAttention

#: One module of each paper with nets that differ from the defaults in settings that leave the weights' shapes alone
#: (IC-SSL's kernel) or not (the widths), as a user would build them in a notebook.
BUILT_IN_PYTHON: dict[str, Callable[[], ICLModule]] = {
    "icssl": lambda: ICSSLModule(net=SemiSupervisedICL(InContextEigenmap(n_points=20),
                                                       GDICLHead(kernel="linear", normalize_kernel=False))),
    "coqe_omniglot": lambda: CoQEClassificationModule(CoQEClassifier(12, resnet_channels=(8, 8, 8, 16), depth=1)),
    "coqe_regression": lambda: CoQERegressionModule(CoQERegressor(4, width=16, depth=1, heads=2, max_points=8),
                                                    baselines=[Lasso(alpha=0.5)]),
    "mmca_avmnist": lambda: AVMNISTModule(MultimodalCrossAttention(cross_attention=False, depth=1, dropout=0.0)),
    "mmca_synthetic": lambda: LatentFactorICLModule(DeepCrossAttention(d=4, depth=2, injection=False)),
}


def _save(module: ICLModule, path: Path) -> Path:
    """The parts of a Lightning checkpoint that ``load_from_checkpoint`` reads."""
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": lightning.__version__}, path)
    return path


@pytest.mark.parametrize("paper", BUILT_IN_PYTHON)
def test_a_net_built_in_python_is_rebuilt_by_load_from_checkpoint(tmp_path, paper: str) -> None:
    torch.manual_seed(0)
    module = BUILT_IN_PYTHON[paper]()
    path = _save(module, tmp_path / "python.ckpt")
    # The checkpoint holds plain data only (Lightning's weights_only loading reads it).
    assert torch.load(path, weights_only=True)["hyper_parameters"]["net"]["class_path"].startswith("lit_icl.")
    for loader in (type(module), lightning.pytorch.LightningModule):  # the module's own loader and Lightning's
        loaded = loader.load_from_checkpoint(path)
        assert type(loaded) is type(module)
        assert net_config(loaded.net) == net_config(module.net)
        assert loaded.state_dict().keys() == module.state_dict().keys()
        assert all(torch.equal(v, module.state_dict()[k]) for k, v in loaded.state_dict().items())
    if paper == "coqe_regression":
        assert [net_config(b) for b in loaded.baselines] == [
            {"class_path": "lit_icl.coqe.Lasso", "init_args": {"alpha": 0.5, "max_iter": 1000, "tol": 1e-10}}]


def test_the_rebuilt_icssl_net_computes_what_the_trained_one_does(tmp_path) -> None:
    """The default net has the same weight shapes as this linear-kernel one: rebuilt with the default's settings it
    loaded without a word and answered differently."""
    torch.manual_seed(0)
    module = BUILT_IN_PYTHON["icssl"]().eval()
    loaded = ICSSLModule.load_from_checkpoint(_save(module, tmp_path / "python.ckpt")).eval()
    assert loaded.net.head.kernel == "linear"
    x, y = torch.randn(2, 20, 3), torch.randint(0, 2, (2, 20))
    labeled = torch.zeros(2, 20, dtype=torch.bool)
    labeled[:, :5] = True
    assert torch.equal(loaded(x, y, labeled), module(x, y, labeled))


class _OwnNet(nn.Module):
    """A user's own net: its class records nothing, so no checkpoint can rebuild it."""

    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.layer = nn.Linear(4, width)


def test_a_net_whose_construction_is_unknown_is_asked_for_by_name(tmp_path) -> None:
    module = LatentFactorICLModule(_OwnNet(width=5))
    path = _save(module, tmp_path / "own.ckpt")
    with pytest.raises(ConfigError) as refused:
        LatentFactorICLModule.load_from_checkpoint(path)
    assert str(refused.value) == (
        f"{path}: its net ({__name__}._OwnNet) was built in Python from a class that does not record its arguments, "
        "so the checkpoint cannot rebuild it; pass it: LatentFactorICLModule.load_from_checkpoint(path, "
        "net=<the _OwnNet it was trained with>)")
    loaded = LatentFactorICLModule.load_from_checkpoint(path, net=_OwnNet(width=5))
    assert torch.equal(loaded.net.layer.weight, module.net.layer.weight)


@pytest.mark.parametrize(("class_path", "cause", "fix"), [
    ("my_own_nets.Net", "(No module named 'my_own_nets')",
     "put the folder that holds my_own_nets on sys.path (PYTHONPATH), or pass it"),
    ("__main__.Net", "(module '__main__' has no attribute 'Net')",
     "it was defined in the script that trained it; move it into a file of its own and import it from there"),
], ids=["not-on-path", "in-a-script"])
def test_a_recorded_net_whose_class_cannot_be_imported_is_one_line(tmp_path, class_path, cause, fix) -> None:
    """A recorded net of the user's own class, loaded where its file is not importable (another folder, another
    script): jsonargparse failed with five chained tracebacks, the last saying only that ``module.net`` "does not
    validate against any of the Union subtypes". One line names the class and why; the net given in Python loads."""
    module = CoQERegressionModule(CoQERegressor(4, width=16, depth=1, heads=2, max_points=8))
    path = _save(module, tmp_path / "own.ckpt")
    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"]["net"]["class_path"] = class_path
    torch.save(ckpt, path)
    with pytest.raises(ConfigError) as refused:
        CoQERegressionModule.load_from_checkpoint(path)
    assert str(refused.value).startswith(f"{path}: its net is {class_path}, which cannot be imported here {cause}; ")
    assert fix in str(refused.value)
    assert str(refused.value).endswith(
        "CoQERegressionModule.load_from_checkpoint(path, net=<the net it was trained with>)")
    net = CoQERegressor(4, width=16, depth=1, heads=2, max_points=8)
    loaded = CoQERegressionModule.load_from_checkpoint(path, net=net)
    assert loaded.net is net and all(torch.equal(v, module.state_dict()[k]) for k, v in loaded.state_dict().items())


def test_recorded_nets_keep_their_own_signature() -> None:
    """The recording is a metaclass's ``__call__``; ``inspect.signature`` (help, IDEs, the CLI's parser) still shows
    each class's ``__init__``."""
    assert list(inspect.signature(GDICLHead).parameters)[:2] == ["num_classes", "embed_dim"]
    assert "resnet_channels" in inspect.signature(CoQEClassifier).parameters


def test_the_cli_asks_for_a_net_built_in_python_by_name_before_writing_anything(tmp_path, capsys) -> None:
    """`test --ckpt_path` of such a checkpoint built the config's net instead, failed to load the weights with a
    traceback, and left a run folder behind each time."""
    from badinput import assert_rejected
    from conftest import quiet_run_args

    module = LatentFactorICLModule(_OwnNet(width=5), lr=0.001, optimizer="adam")
    path = _save(module, tmp_path / "own.ckpt")  # the config's settings, but its own net
    args = ["test", *quiet_run_args(tmp_path, "configs/mmca/synthetic.yaml"), "--model.init_args.test_depths", "null",
            "--ckpt_path", str(path)]
    line = assert_rejected(tmp_path, capsys, args, "was built in Python")
    assert line == (
        f"lit_icl: error: --ckpt_path {path}: its net ({__name__}._OwnNet) was built in Python from a class that does "
        "not record its arguments, so the checkpoint cannot rebuild it, and the config gives "
        "lit_icl.mmca.DeepCrossAttention; pass --model.init_args.net "
        f"{__name__}._OwnNet (with the init_args it was trained with)")
