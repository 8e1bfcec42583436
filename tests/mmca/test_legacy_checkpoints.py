"""Checkpoints written by the code before mmca's split into experiments (commit 93c16ee; how, in
tests/data/legacy/README.md) still load: with the module's ``load_from_checkpoint``, and through
``python -m lit_icl test --config <new config> --ckpt_path <old checkpoint>``, with the same weights and the same
test numbers the old code wrote."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from mmca.avmnist.helpers import avmnist_args, write_layout
from mmca.synthetic.helpers import mmca_args

from lit_icl.cli import main
from lit_icl.core.legacy import MOVED_MODULES
from lit_icl.mmca import (
    AVMNISTModule,
    DeepCrossAttention,
    LatentFactorICLModule,
    MultimodalCrossAttention,
)

LEGACY = Path(__file__).parents[1] / "data/legacy"
CASES = [
    ("mmca_synthetic", LatentFactorICLModule, DeepCrossAttention, "lit_icl.mmca.nets.DeepCrossAttention"),
    (
        "mmca_avmnist",
        AVMNISTModule,
        MultimodalCrossAttention,
        "lit_icl.mmca.avmnist_nets.MultimodalCrossAttention",
    ),
]


def stored(name: str) -> dict:
    return torch.load(LEGACY / f"{name}.ckpt", map_location="cpu", weights_only=False)


def assert_same_weights(state: dict, expected: dict) -> None:
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(state[key], value), key


@pytest.mark.parametrize(("name", "module_cls", "net_cls", "old_path"), CASES, ids=[c[0] for c in CASES])
def test_legacy_checkpoint_loads_with_its_weights(
    name: str, module_cls: type, net_cls: type, old_path: str
) -> None:
    ckpt = stored(name)
    # The checkpoint names the files of before the split, so loading it goes through the registry of moves.
    assert ckpt["hyper_parameters"]["net"]["class_path"] == old_path
    module = module_cls.load_from_checkpoint(LEGACY / f"{name}.ckpt", map_location="cpu")
    assert type(module.net) is net_cls
    assert_same_weights(module.state_dict(), ckpt["state_dict"])


def _rows(path: Path) -> dict[tuple, float]:
    rows = json.loads(path.read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    skip = {"value", "dataset"}  # the data folder's name differs (tmp_path), nothing else may
    return {tuple(sorted((k, v) for k, v in r.items() if k not in skip)): r["value"] for r in rows}


@pytest.mark.parametrize("name", ["mmca_synthetic", "mmca_avmnist"])
def test_legacy_checkpoint_is_tested_through_the_cli_with_the_old_numbers(tmp_path: Path, name: str) -> None:
    weights = tmp_path / "weights.pt"
    record = ["--trainer.callbacks+=mmca.helpers.SaveStateDict", f"--trainer.callbacks.path={weights}"]
    if name == "mmca_synthetic":
        args = mmca_args(
            tmp_path, *record
        )  # configs/mmca/synthetic.yaml, the sizes the checkpoint was fit with
    else:
        root = tmp_path / "data"
        write_layout(root, n_train=40, n_test=20, audio_side=28)
        args = avmnist_args(tmp_path, root, *record)  # configs/mmca/avmnist.yaml at depth 1
    main(["test", *args, "--ckpt_path", str(LEGACY / f"{name}.ckpt")])
    assert_same_weights(torch.load(weights, weights_only=True), stored(name)["state_dict"])
    results = sorted((tmp_path / "runs/tiny").glob("version_*/results.json"))
    new, old = _rows(results[-1]), _rows(LEGACY / f"{name}_test_rows.json")
    assert new.keys() == old.keys()
    for key, value in old.items():
        assert new[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize(("old", "new"), sorted((o, n) for o, n in MOVED_MODULES.items() if o.startswith("lit_icl.mmca.")))
def test_module_names_before_the_split_are_moves_to_existing_modules_and_import_no_more(old: str, new: str) -> None:
    importlib.import_module(new)
    with pytest.raises(ModuleNotFoundError):  # only checkpoint loading knows the old names
        importlib.import_module(old)
