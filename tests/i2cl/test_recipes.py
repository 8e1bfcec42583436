"""experiments/i2cl_recipes.py: each recipe sets what its name says, and the report reads finished runs right."""

from __future__ import annotations

import importlib.util
import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from lit_icl.cli import main as cli_main

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "i2cl_recipes.py"


@pytest.fixture(scope="module")
def recipes():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("i2cl_recipes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


#: recipe -> (noise_norm, hook_point, lr_schedule, lr_min, warmup_fraction, calibration_batches, gamma)
EXPECTED = {
    "paper": ("stream", "write", "cosine", 1e-5, 0.0, "epoch", 0.001),
    "public_code": ("sublayer", "module", "public_code", 0.0, 0.05, "replacement", 0.001),
    "public_code_write": ("sublayer", "write", "public_code", 0.0, 0.05, "replacement", 0.001),
    "public_code_schedule": ("sublayer", "module", "cosine", 1e-5, 0.0, "epoch", 0.001),
    "sublayer_noise": ("sublayer", "write", "cosine", 1e-5, 0.0, "epoch", 0.001),
    "no_noise": ("sublayer", "module", "public_code", 0.0, 0.05, "replacement", 0.0),
    "public_code_add": ("sublayer", "module", "public_code", 0.0, 0.05, "replacement", 0.001),
    "public_code_gamma_0.003": ("sublayer", "module", "public_code", 0.0, 0.05, "replacement", 0.003),
    "public_code_gamma_0.01": ("sublayer", "module", "public_code", 0.0, 0.05, "replacement", 0.01),
    "fixed_beta": ("sublayer", "write", "cosine", 1e-5, 0.0, "epoch", 0.001),
}


@pytest.mark.parametrize("recipe", list(EXPECTED))
def test_each_recipe_sets_what_its_name_says(recipes, recipe, capsys, monkeypatch) -> None:
    import yaml

    monkeypatch.chdir(SCRIPT.parents[1])
    job = next(j for j in recipes.fit_jobs(Namespace(seeds=[3], models=["gemma"], recipes=[recipe], out=Path("out")))
               if recipe in j.name)
    with pytest.raises(SystemExit) as info:
        cli_main([*job.argv, "--print_config"])
    assert info.value.code in (0, None)
    merged = yaml.safe_load(capsys.readouterr().out)
    model, data = merged["model"]["init_args"], merged["data"]["init_args"]
    got = (model["noise_norm"], model["net"]["init_args"]["hook_point"], model["lr_schedule"], model["lr_min"],
           model["warmup_fraction"], data["calibration_batches"], model["gamma"])
    assert got == EXPECTED[recipe]
    assert model["inject_method"] == {"public_code_add": "add", "fixed_beta": "fixed_beta"}.get(recipe, "linear")
    assert model["methods"] == ["i2cl"] and data["data_seed"] == 3 and merged["seed_everything"] == 3
    assert model["net"]["init_args"]["model_name_or_path"] == "data/i2cl/gemma-3-270m"


def _write(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"meta": {}, "rows": rows}))


def _log_losses(folder: Path, losses: list[float]) -> None:
    from runner import write_done
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step, loss in enumerate(losses):
        writer.add_scalar("train/loss/i2cl", loss, step)
    writer.close()
    write_done(folder, 1.0, 1.0)


def test_report_counts_one_label_seeds_and_seeds_at_least_zero_shot(recipes, tmp_path) -> None:
    for seed, (acc, f1) in enumerate([(0.70, 0.69), (0.50, 0.34), (0.62, 0.60)]):
        _write(tmp_path / "gemma" / "public_code" / f"s{seed}_test",
               [{"metric": "accuracy", "method": "i2cl", "value": acc}, {"metric": "macro_f1", "method": "i2cl", "value": f1}])
        _write(tmp_path / "gemma" / "few_shot" / f"s{seed}_test",
               [{"metric": "accuracy", "method": "zero_shot", "value": 0.6},
                {"metric": "accuracy", "method": "few_shot", "value": 0.8 + seed / 100}])
        # 15 logged losses; the report's final loss is the mean of the last 10: 10 + seed + 0.45
        _log_losses(tmp_path / "gemma" / "public_code" / f"s{seed}_fit", [10 + seed + k / 10 for k in range(15)])
    grid = {"models": ["gemma"], "recipes": ["public_code", "few_shot"], "seeds": [0, 1, 2]}
    text = recipes.report(Namespace(**grid, out=tmp_path, csv=tmp_path / "grid.csv"))
    row = next(line for line in text.splitlines() if line.startswith("| public_code"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["public_code", "0, 1, 2", "0.607 ± 0.101", "0.700, 0.500, 0.620", "0.690, 0.340, 0.600",
                     "1", "2 of 3", "0.600 ± 0.000", "10.95, 11.95, 12.95"]
    assert "Few-shot reference (single newline): 0.810 ± 0.010 over seeds 0, 1, 2" in text
    # The tidy CSV holds what the report read, the fits' last 10 losses included, and gives the same report alone.
    import csv

    with open(tmp_path / "grid.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert {"run": "gemma/public_code/s1_test", "metric": "macro_f1", "method": "i2cl", "value": "0.34"}.items() <= \
        next(r for r in written if r["run"] == "gemma/public_code/s1_test" and r["metric"] == "macro_f1").items()
    losses = [r for r in written if r["run"] == "gemma/public_code/s0_fit" and r["metric"] == "logged.train/loss/i2cl"]
    assert [int(r["steps"]) for r in losses] == list(range(5, 15))
    assert recipes.report(Namespace(**grid, out=tmp_path / "grid.csv", csv=None)) == text


def test_report_takes_zero_shot_from_any_seed_when_only_one_was_run(recipes, tmp_path) -> None:
    for seed, acc in enumerate([0.70, 0.75]):
        _write(tmp_path / "m" / "public_code" / f"s{seed}_test",
               [{"metric": "accuracy", "method": "i2cl", "value": acc}, {"metric": "macro_f1", "method": "i2cl", "value": acc}])
    _write(tmp_path / "m" / "zero_shot" / "s1_test", [{"metric": "accuracy", "method": "zero_shot", "value": 0.72}])
    text = recipes.report(Namespace(models=["m"], recipes=["public_code"], seeds=[0, 1], out=tmp_path, csv=None))
    row = next(line for line in text.splitlines() if line.startswith("| public_code"))
    assert "| 1 of 2 | 0.720 ± 0.000 |" in row


def test_a_report_without_the_grids_options_reads_every_tested_model_recipe_and_seed(recipes, tmp_path) -> None:
    """`report --out GRID` without `--models`/`--seeds` read Gemma's seeds 0-4 only (the options' defaults), so a
    SmolLM2 grid, or seeds 5 and 6, gave "no tested runs" or empty tables; it now reads every tested cell."""
    for seed, acc in ((5, 0.6), (6, 0.8)):
        _write(tmp_path / "smollm2" / "paper" / f"s{seed}_test",
               [{"metric": "accuracy", "method": "i2cl", "value": acc}, {"metric": "macro_f1", "method": "i2cl", "value": acc}])
    text = recipes.report(recipes.parse_args(["report", "--out", str(tmp_path)]))
    assert "### smollm2" in text and "### gemma" not in text
    row = next(line for line in text.splitlines() if line.startswith("| paper"))
    assert [c.strip() for c in row.strip("|").split("|")][:3] == ["paper", "5, 6", "0.700 ± 0.141"]
    chosen = recipes.report(recipes.parse_args(["report", "--out", str(tmp_path), "--seeds", "6"]))
    assert "| paper | 6 | 0.800 |" in chosen
