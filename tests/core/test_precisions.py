"""A paper module refuses, before the run starts, a ``--trainer.precision`` it does not run in
(``ICLModule.precisions``): CoQE's steps build float32 tensors that met bf16 or float64 weights in a traceback,
IC-SSL's loss is NaN at the first fp16 step, and I2CL's coefficients lost their float32 precision."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_icl.coqe import CoQEClassificationModule, CoQERegressionModule
from lit_icl.core.errors import ConfigError
from lit_icl.i2cl import I2CLModule
from lit_icl.icssl import ICSSLModule
from lit_icl.mmca import AVMNISTModule, LatentFactorICLModule


@pytest.mark.parametrize(("module", "refused"), [
    (CoQEClassificationModule, ["bf16-true", "64-true", "16-true"]),
    (CoQERegressionModule, ["bf16-true", "64-true", "16-true"]),
    (I2CLModule, ["bf16-true", "16-true", "64-true"]),
    (ICSSLModule, ["16-true"]),
])
def test_each_paper_module_names_what_it_runs_in_and_why(module, refused) -> None:
    for precision in ("32-true", "bf16-mixed", "16-mixed"):  # every module runs in these
        assert precision in module.precisions
    assert module.precisions_why and not set(refused) & set(module.precisions)


def test_a_precision_outside_the_modules_list_is_one_line_naming_the_fix() -> None:
    module = ICSSLModule()
    module.check_config(trainer=SimpleNamespace(precision="bf16-true"))  # runs
    with pytest.raises(ConfigError) as refused:
        module.check_config(trainer=SimpleNamespace(precision="16-true"))
    assert str(refused.value) == (
        "--trainer.precision 16-true: ICSSLModule runs in 32-true, 64-true, bf16-true, bf16-mixed, 16-mixed (in fp16 its "
        "training loss is NaN at the first step); use bf16-mixed for speed, 32-true for exact float32")


def test_the_multimodal_modules_are_not_restricted() -> None:
    assert AVMNISTModule.precisions is None and LatentFactorICLModule.precisions is None
