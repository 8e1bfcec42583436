"""lit_icl.core.hparams: every module and data module records the arguments Lightning's own lookup records, and
building one keeps nothing of the function that built it alive once that function returns."""

from __future__ import annotations

import ast
import gc
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.core.mixins import HyperparametersMixin
from mmca.avmnist.helpers import write_layout
from torch import nn

import lit_icl
from lit_icl.coqe import CoQEClassificationModule, CoQEClassifier, CoQERegressionModule, CoQERegressor
from lit_icl.coqe.omniglot.data import OmniglotSequenceDataModule
from lit_icl.coqe.regression.data import RegressionDataModule
from lit_icl.i2cl.data import I2CLDataModule
from lit_icl.icssl import ICSSLModule
from lit_icl.icssl.data import ManifoldDataModule
from lit_icl.mmca.avmnist.data import AVMNISTDataModule
from lit_icl.mmca.synthetic.data import LatentFactorDataModule

#: Each paper's data module, and modules of two papers (every module records through one ICLModule method), built
#: small; the module whose ``save_init_hparams`` name the class calls.
BUILDERS: dict[str, tuple[str, Callable[[Path], HyperparametersMixin]]] = {
    "icssl_data": ("lit_icl.icssl.data",
                   lambda tmp: ManifoldDataModule(n_points=20, batch_size=16, chunk_size=16)),
    "coqe_omniglot_data": ("lit_icl.coqe.omniglot.data", lambda tmp: OmniglotSequenceDataModule(root=tmp)),
    "coqe_regression_data": ("lit_icl.coqe.regression.data", lambda tmp: RegressionDataModule()),
    "i2cl_data": ("lit_icl.i2cl.data", lambda tmp: I2CLDataModule()),
    "mmca_synthetic_data": ("lit_icl.mmca.synthetic.data", lambda tmp: LatentFactorDataModule()),
    "mmca_avmnist_data": ("lit_icl.mmca.avmnist.data", lambda tmp: _avmnist(tmp / "avmnist")),
    "icssl_module": ("lit_icl.core.module", lambda tmp: ICSSLModule()),
    "coqe_module": ("lit_icl.core.module",
                    lambda tmp: CoQEClassificationModule(CoQEClassifier(resnet_channels=(8, 8, 8, 16), depth=1))),
    "coqe_regression_module": ("lit_icl.core.module", lambda tmp: CoQERegressionModule(
        CoQERegressor(4, width=16, depth=1, heads=2, max_points=8))),
}


def _avmnist(root: Path) -> AVMNISTDataModule:
    write_layout(root)  # 40 training rows
    return AVMNISTDataModule(root=root, val_size=8, batch_size=8)


class _Marker:
    """A local variable of the building function, watched through a weak reference."""


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counting frees objects: what the cyclic garbage collector would free later stays."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("case", sorted(BUILDERS))
def test_building_one_keeps_no_local_of_the_function_that_built_it(tmp_path, case, no_collector) -> None:
    """Lightning's ``save_hyperparameters()`` without a frame leaves a frame that refers to itself, and through it
    the builder's frame with every local variable in it, until a garbage collection: here, never."""
    _, build = BUILDERS[case]

    def builder() -> tuple[weakref.ref, HyperparametersMixin]:
        marker = _Marker()
        return weakref.ref(marker), build(tmp_path)

    watched, obj = builder()
    assert watched() is None, f"{type(obj).__name__}(...) kept the local variables of the function that built it"


@pytest.mark.parametrize("case", sorted(BUILDERS))
def test_the_arguments_recorded_are_those_of_lightnings_own_lookup(tmp_path, case, monkeypatch) -> None:
    """``save_init_hparams`` hands Lightning the constructor's frame; Lightning's own lookup, from the frame that
    calls it, walks up to the same constructor and records the same arguments."""
    where, build = BUILDERS[case]
    ours = build(tmp_path)
    lightnings_lookup = lambda obj, up=1: HyperparametersMixin.save_hyperparameters(obj)
    monkeypatch.setattr(f"{where}.save_init_hparams", lightnings_lookup)
    lightnings = build(tmp_path)
    assert _comparable(ours.hparams) == _comparable(lightnings.hparams) and len(ours.hparams) > 0
    assert _comparable(ours.hparams_initial) == _comparable(lightnings.hparams_initial)


def _comparable(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The hyper-parameters with each net object (two builds make two) as its class and layers."""
    return {k: (type(v), repr(v)) if isinstance(v, nn.Module) else v for k, v in hparams.items()}


def test_no_class_of_the_package_calls_save_hyperparameters_itself() -> None:
    """Every constructor records through :func:`lit_icl.core.hparams.save_init_hparams` (or ICLModule's method that
    calls it), the one call that names the frame."""
    package = Path(lit_icl.__file__).parent
    callers = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "save_hyperparameters" and path.name != "hparams.py"):
                callers.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert not callers, callers
