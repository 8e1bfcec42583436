"""core.legacy: the one registry of moved modules, applied to a checkpoint's recorded class paths."""

from __future__ import annotations

import importlib

import pytest

from lit_icl.core.legacy import (
    MOVED_MODULES,
    current_class_path,
    upgrade_checkpoint,
    upgrade_class_paths,
    upgrade_hparams,
)


def test_an_old_class_path_names_the_same_class_where_it_lives_now() -> None:
    assert current_class_path("lit_icl.mmca.nets.DeepCrossAttention") == "lit_icl.mmca.synthetic.nets.DeepCrossAttention"
    for path in ("lit_icl.mmca.DeepCrossAttention", "my_package.nets.Net", "nets", None, 3):
        assert current_class_path(path) == path  # current, foreign or not a path: unchanged


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_every_move_points_at_a_module_that_exists_and_the_old_name_is_gone(old: str, new: str) -> None:
    importlib.import_module(new)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_a_checkpoints_nested_class_paths_are_upgraded_and_nothing_else() -> None:
    hparams = {"_class_path": "lit_icl.mmca.module.LatentFactorICLModule", "lr": 1e-3,
               "net": {"class_path": "lit_icl.mmca.nets.DeepCrossAttention", "init_args": {"depth": 3}},
               "baselines": [{"class_path": "lit_icl.coqe.regression_nets.LeastSquares"},
                             {"class_path": "lit_icl.coqe.LeastSquares"}],
               "note": "lit_icl.mmca.nets.DeepCrossAttention"}  # a string under another key is data, not a path
    checkpoint = {"hyper_parameters": hparams, "datamodule_hyper_parameters": {
        "_class_path": "lit_icl.mmca.data.LatentFactorDataModule"}, "state_dict": {}}
    assert upgrade_checkpoint(checkpoint)
    up = checkpoint["hyper_parameters"]
    assert up["_class_path"] == "lit_icl.mmca.synthetic.module.LatentFactorICLModule"
    assert up["net"] == {"class_path": "lit_icl.mmca.synthetic.nets.DeepCrossAttention", "init_args": {"depth": 3}}
    assert [b["class_path"] for b in up["baselines"]] == ["lit_icl.coqe.regression.nets.LeastSquares",
                                                          "lit_icl.coqe.LeastSquares"]
    assert up["note"] == "lit_icl.mmca.nets.DeepCrossAttention" and up["lr"] == 1e-3
    assert checkpoint["datamodule_hyper_parameters"]["_class_path"] == "lit_icl.mmca.synthetic.data.LatentFactorDataModule"
    assert hparams["net"]["class_path"] == "lit_icl.mmca.nets.DeepCrossAttention"  # the input is not changed
    assert not upgrade_checkpoint(checkpoint)  # already current
    assert upgrade_class_paths([1, "x"]) == ([1, "x"], False)


def test_coqes_loose_noise_arguments_become_one_schedule() -> None:
    old = {"_class_path": "lit_icl.coqe.module.CoQEClassificationModule", "lr": 1e-4, "noise_mean0": 3.0,
           "noise_std0": 1.0, "noise_increment": 1.0, "noise_interval": 1000, "noise_delay": 0, "noise_seed": 2}
    checkpoint = {"hyper_parameters": old, "state_dict": {}}
    assert upgrade_checkpoint(checkpoint)
    assert checkpoint["hyper_parameters"] == {
        "_class_path": "lit_icl.coqe.omniglot.module.CoQEClassificationModule", "lr": 1e-4, "noise_seed": 2,
        "noise": {"mean0": 3.0, "std0": 1.0, "increment": 1.0, "interval": 1000, "delay": 0}}
    assert "noise_mean0" in old  # the input is not changed
    assert not upgrade_checkpoint(checkpoint)  # already current
    free, renamed = upgrade_hparams({"_class_path": "lit_icl.coqe.CoQEClassificationModule", "noise_mean0": None,
                                     "noise_std0": 1.0})
    assert renamed and free == {"_class_path": "lit_icl.coqe.CoQEClassificationModule", "noise": None}
    # The same key names on another class are that class's own.
    other = {"_class_path": "my_package.Module", "noise_mean0": 1.0}
    assert upgrade_hparams(other) == (other, False)


def test_icssl_modules_label_ratios_are_dropped_for_the_data_modules() -> None:
    hparams = {"_class_path": "lit_icl.icssl.ICSSLModule", "label_ratios": None, "lr": 0.003}
    assert upgrade_hparams(hparams) == ({"_class_path": "lit_icl.icssl.ICSSLModule", "lr": 0.003}, True)
    assert upgrade_hparams({"_class_path": "lit_icl.icssl.ICSSLModule", "lr": 0.003})[1] is False
