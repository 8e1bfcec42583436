"""Checkpoints written before the one-folder-per-experiment move still load (tests/data/legacy/README.md)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from coqe.omniglot.helpers import coqe_args
from coqe.regression.helpers import reg_args

from lit_icl.cli import main
from lit_icl.coqe import CoQEClassificationModule, CoQEClassifier, CoQERegressionModule, CoQERegressor
from lit_icl.core.legacy import current_class_path

LEGACY = Path(__file__).parents[1] / "data/legacy"
TINY_OMNIGLOT = (
    "--model.init_args.net.init_args.emb_dim", "16", "--model.init_args.net.init_args.heads", "2",
    "--model.init_args.net.init_args.stem_channels", "8", "--data.init_args.max_classes", "24",
)


@pytest.mark.parametrize(
    ("name", "module_cls", "net_cls"),
    [("coqe_omniglot", CoQEClassificationModule, CoQEClassifier), ("coqe_regression", CoQERegressionModule, CoQERegressor)],
)
def test_legacy_checkpoint_loads_with_its_weights(name: str, module_cls: type, net_cls: type) -> None:
    path = LEGACY / f"{name}.ckpt"
    stored = torch.load(path, map_location="cpu", weights_only=False)
    module = module_cls.load_from_checkpoint(path, map_location="cpu")
    assert isinstance(module.net, net_cls)
    state = module.state_dict()
    assert state.keys() == stored["state_dict"].keys()
    for key, value in stored["state_dict"].items():
        assert torch.equal(state[key], value), key


@pytest.mark.parametrize("name", ["coqe_omniglot", "coqe_regression"])
def test_legacy_checkpoint_is_tested_through_the_cli(tmp_path: Path, name: str) -> None:
    if name == "coqe_omniglot":
        args = coqe_args(tmp_path, *TINY_OMNIGLOT)
    else:
        args = reg_args(tmp_path)
    main(["test", *args, "--ckpt_path", str(LEGACY / f"{name}.ckpt")])
    results = sorted((tmp_path / "runs/tiny").glob("version_*/results.json"))
    assert results, "test wrote no results.json"
    rows = json.loads(results[-1].read_text())["rows"]
    assert rows and all(r["value"] == r["value"] for r in rows if isinstance(r["value"], float))  # no NaN


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("lit_icl.coqe.nets", "lit_icl.coqe.omniglot.nets", "CoQEClassifier"),
        ("lit_icl.coqe.nets", "lit_icl.coqe.layers", "CausalTransformer"),
        ("lit_icl.coqe.data", "lit_icl.coqe.omniglot.data", "OmniglotSequenceDataModule"),
        ("lit_icl.coqe.module", "lit_icl.coqe.omniglot.module", "CoQEClassificationModule"),
        ("lit_icl.coqe.glyphs", "lit_icl.coqe.omniglot.glyphs", "build_glyphs"),
        ("lit_icl.coqe.regression_nets", "lit_icl.coqe.regression.nets", "CoQERegressor"),
        ("lit_icl.coqe.regression_data", "lit_icl.coqe.regression.data", "RegressionDataModule"),
        ("lit_icl.coqe.regression_module", "lit_icl.coqe.regression.module", "CoQERegressionModule"),
    ],
)
def test_class_paths_before_the_move_name_todays_classes(old: str, new: str, name: str) -> None:
    """A checkpoint that names ``lit_icl.coqe.nets.CoQEClassifier`` gets today's class when it is loaded."""
    module, _, leaf = current_class_path(f"{old}.{name}").rpartition(".")
    assert getattr(importlib.import_module(module), leaf) is getattr(importlib.import_module(new), name)
