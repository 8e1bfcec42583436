"""The avMNIST Table 1 driver (experiments/mmca_avmnist_table1.py): its grid, its tests and its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "mmca_avmnist_table1.py"


@pytest.fixture(scope="module")
def table1():
    return load_script(SCRIPT)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_grid_trains_each_model_per_seed_with_its_overlay_and_the_stopping_rule(table1, tmp_path) -> None:
    args = table1.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "1", "--patience", "10",
                              "--max-epochs", "200"])
    fits = table1.fit_jobs(args)
    assert len({j.folder for j in fits}) == len(fits) == 2 * 5
    for fit in fits:
        model, seed = fit.folder.parent.name, fit.folder.name[1:]
        overlays = [a for a in fit.argv if a.startswith(str(table1.CONFIG.parent / "avmnist") + "/")]
        assert overlays == ([] if model == "full" else [str(table1.CONFIG.parent / "avmnist" / f"{model}.yaml")])
        assert _flag(fit.argv, "--seed_everything") == _flag(fit.argv, "--data.init_args.data_seed") == seed
        assert _flag(fit.argv, "--data.init_args.noise_std") == "1.0"
        assert _flag(fit.argv, "--trainer.max_epochs") == "200"
        assert _flag(fit.argv, "--early_stopping.patience") == "10"
        assert _flag(fit.argv, "--early_stopping.monitor") == "val/acc"  # the validation split, never test
    assert "--trainer.min_epochs" not in fits[0].argv
    floor = table1.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--patience", "20", "--min-epochs",
                               "100", "--max-epochs", "300"])
    assert all(_flag(j.argv, "--trainer.min_epochs") == "100" for j in table1.fit_jobs(floor))
    assert "--early_stopping.wait_for_score" not in fits[0].argv
    wait = table1.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--patience", "20", "--wait-for-score",
                              "0.2"])
    assert all(_flag(j.argv, "--early_stopping.wait_for_score") == "0.2" for j in table1.fit_jobs(wait))
    assert _flag(fits[0].argv, "--early_stopping.min_delta") == "0.0"
    fixed = table1.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0"])
    assert not any(a.startswith("--early_stopping") for j in table1.fit_jobs(fixed) for a in j.argv)
    # Tests: the last checkpoint always; the best validation epoch's once it exists.
    best = fits[0].folder / "checkpoints" / "best-epoch=41-step=9156.ckpt"
    best.parent.mkdir(parents=True)
    best.touch()
    tests = [t for t in table1.test_jobs(args) if t.after == [fits[0].folder]]
    assert sorted(t.folder.name for t in tests) == ["s0_test_best", "s0_test_last"]
    assert _flag(next(t for t in tests if t.folder.name.endswith("best")).argv, "--ckpt_path") == str(best)


def test_overlays_stack_after_each_models_own_config_in_fit_and_test_and_a_missing_one_is_refused(table1, tmp_path, capsys) -> None:
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("trainer:\n  accelerator: gpu\n")
    args = table1.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--overlay", str(gpu)])
    for fit in table1.fit_jobs(args):
        configs = [fit.argv[i + 1] for i, a in enumerate(fit.argv) if a == "--config"]
        assert configs[0] == str(table1.CONFIG) and configs[-1] == str(gpu.resolve())
        assert len(configs) == (2 if fit.folder.parent.name == "full" else 3)
    # A test reads the run's saved config (the trainer of its last sitting), then the overlays given to `test`:
    # a run whose last sitting was on a GPU is tested on a CPU with an overlay that names the CPU.
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text("trainer:\n  accelerator: cpu\n")
    tested = table1.parse_args(["test", "--out", str(tmp_path), "--seeds", "0", "--overlay", str(cpu)])
    for test in table1.test_jobs(tested):
        configs = [test.argv[i + 1] for i, a in enumerate(test.argv) if a == "--config"]
        assert configs == [str(test.after[0] / "config.yaml"), str(cpu.resolve())]
    with pytest.raises(SystemExit):
        table1.parse_args(["fit", "--out", str(tmp_path), "--overlay", str(tmp_path / "missing.yaml")])
    assert "no such config file" in capsys.readouterr().err


def test_a_minimum_above_the_cap_is_refused(table1, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        table1.parse_args(["fit", "--out", str(tmp_path), "--min-epochs", "150", "--max-epochs", "100"])
    assert stop.value.code == 2
    assert "--min-epochs 150 must lie in [1, --max-epochs 100]" in capsys.readouterr().err


def _write(folder: Path, accuracy: float, history: list[float], stopped_early: bool) -> None:
    rows = [{"metric": "accuracy", "value": accuracy, "method": "m", "split": "test"},
            {"metric": "params", "value": 43754, "method": "m", "split": "test"}]
    rows += [{"metric": "test_accuracy", "value": v, "method": "m", "split": "test", "epoch": e}
             for e, v in enumerate(history, start=1)]
    folder.mkdir(parents=True)
    meta = {"stopping": {"stopped_early": stopped_early}}
    folder.joinpath("results.json").write_text(json.dumps({"meta": meta, "rows": rows}))


def test_report_pairs_seeds_and_judges_the_full_models_margins(table1, tmp_path) -> None:
    args = table1.parse_args(["report", "--out", str(tmp_path), "--seeds", "0", "1", "--patience", "5"])
    for seed, (full, other) in enumerate(((0.70, 0.60), (0.72, 0.64))):
        for model, acc in (("full", full), ("no_injection_no_cross_attention", other)):
            history = [0.10, 0.15, 0.25, acc, acc - 0.01]
            _write(tmp_path / model / f"s{seed}_test_last", acc - 0.01, history, stopped_early=True)
            _write(tmp_path / model / f"s{seed}_test_best", acc - 0.02, history[:4], stopped_early=True)
    text = table1.report(args)
    # The same report from the grid's tidy CSV alone: identical.
    args.csv = tmp_path.parent / "grid.csv"
    assert table1.report(args) == text
    args.out, args.csv = tmp_path.parent / "grid.csv", None
    assert table1.report(args) == text
    full_row = next(x for x in text.splitlines() if x.startswith("| full |"))
    # Test acc. at the best val epoch 68.0 / 70.0; best test acc 70 / 72; the chance plateau left at epoch 3.
    assert "| 69.0 ± 1.4 | 71.0 ± 1.4 | 71.0 ± 1.4 | 70.0 / 72.0 | 5, 5 | 2 of 2 | 3, 3 | 63.85 |" in full_row
    margin = [x for x in text.splitlines() if x.startswith("| no_injection_no_cross_attention |")][-1]
    # Paired differences 10 and 8 points (sd 1.4): same sign as the paper's +3.06.
    assert margin == ("| no_injection_no_cross_attention | +3.06 | +9.0 ± 1.4 (2 of 2 ahead) | same sign "
                      "| +9.0 ± 1.4 (2 of 2 ahead) | same sign | +9.0 ± 1.4 (2 of 2 ahead) | same sign |")
    # The ordering, ours from the means and the paper's with its tie (62.72 twice) kept.
    assert ("- paper (best test acc.): full > no_injection = bi_cross_attention > no_cross_attention > "
            "no_injection_no_cross_attention") in text
    assert "- ours, best test acc. (mean over seeds 0, 1): full > no_injection_no_cross_attention" in text
    assert "- ours, test acc. at best val epoch (mean over seeds 0, 1): full > no_injection_no_cross_attention" in text
    # A model with a seed the others lack is ranked on the shared seeds only: a seed-2 run of the full model at
    # 0.10 would put it last on the means over all its seeds.
    _write(tmp_path / "full" / "s2_test_last", 0.10, [0.10, 0.10], stopped_early=True)
    three = table1.report(table1.parse_args(["report", "--out", str(tmp_path), "--seeds", "0", "1", "2"]))
    assert "| full | 43,754 | 3 |" in three
    # Seed 2 never left the chance plateau: its cell says so (the column used to drop it, or be empty).
    assert "| 3 of 3 | 3, 3, never |" in next(x for x in three.splitlines() if x.startswith("| full |"))
    assert "- ours, best test acc. (mean over seeds 0, 1): full > no_injection_no_cross_attention" in three
    # One seed has a sign but no spread: the verdict says so instead of claiming the paper's sign.
    one = table1.report(table1.parse_args(["report", "--out", str(tmp_path), "--seeds", "1", "--patience", "5"]))
    assert "| full | 43,754 | 1 | 70.0 | 72.0 | 72.0 |" in one
    assert ("| no_injection_no_cross_attention | +3.06 | +8.0 (1 of 1 ahead) | same sign, one seed "
            "| +8.0 (1 of 1 ahead) | same sign, one seed |") in one


def test_runs_longer_than_the_paper_are_also_read_at_its_100_epochs(table1, tmp_path) -> None:
    # 150 epochs: the full model peaks at epoch 140 (0.80), the other at epoch 60 (0.75) and stays there; by
    # epoch 100 the full model had only reached 0.70, so the paper-length reading reverses the margin.
    full = [0.1] * 20 + [0.70] * 100 + [0.80] * 30
    other = [0.1] * 20 + [0.75] * 130
    args = table1.parse_args(["report", "--out", str(tmp_path), "--seeds", "0", "--patience", "20"])
    _write(tmp_path / "full" / "s0_test_last", 0.80, full, stopped_early=True)
    _write(tmp_path / "no_injection" / "s0_test_last", 0.75, other, stopped_early=True)
    found = table1._measured(args)[0]
    assert (found["full"][0]["best_test"], found["full"][0]["best_test_paper"]) == pytest.approx((80.0, 70.0))
    assert found["no_injection"][0]["best_test_paper"] == pytest.approx(75.0)
    text = table1.report(args)
    assert "| no_injection | +1.13 | -- | -- | +5.0 (1 of 1 ahead) | same sign, one seed " \
           "| -5.0 (0 of 1 ahead) | opposite sign, one seed |" in text
    assert "- ours, best test acc. in epochs 1-100 (mean over seeds 0): no_injection > full" in text


@pytest.mark.parametrize("argv, problem", [
    # These wrote grid.json, job_state.json and fit.log, then every fit failed alike (FAILED rc=2, exit 1).
    (["--noise-std", "-1"], "--noise-std -1.0: a noise sd is 0 or more"),
    (["--patience", "-2"], "--patience -2: give 1 or more epochs without a rise of val/acc"),
    (["--root", "{tmp}/nonexist"], "--root {tmp}/nonexist: no such folder"),
    # These --dry-run accepted.
    (["--max-epochs", "0"], "argument --max-epochs: 0 must be at least 1"),
    (["--patience", "3", "--min-delta", "-1"],
     "--min-delta -1.0: the smallest rise of val/acc that counts as an improvement is 0 or more (default 0.0)"),
    (["--patience", "3", "--wait-for-score", "2"], "--wait-for-score 2.0: val/acc is a fraction"),
    (["--wait-for-score", "0.2"], "--wait-for-score 0.2 holds off early stopping, which only --patience turns on"),
    # Without --patience fit_jobs passes no --min-delta, so it was silently ignored (as the step drivers refuse it).
    (["--min-delta", "0.002"], ("--min-delta 0.002 is the smallest rise early stopping counts, which only --patience "
                                "turns on (a fixed-length run trains all its --max-epochs)")),
    # Likewise --min-epochs: without the rule every run trains all its --max-epochs, so the floor did nothing.
    (["--min-epochs", "1"], ("--min-epochs 1 is a floor under early stopping, which only --patience turns on (a "
                             "fixed-length run trains all its --max-epochs); add --patience P or drop --min-epochs")),
])
@pytest.mark.parametrize("dry", [True, False])
def test_a_grid_that_cannot_run_as_meant_is_refused_in_one_line_before_anything_is_written(
        table1, tmp_path, capsys, argv: list[str], problem: str, dry: bool) -> None:
    out = tmp_path / "grid"
    argv = ["fit", "--seeds", "0", "--only", "full", "--jobs", "1", "--out", str(out), "--max-epochs", "1",
            *(a.format(tmp=tmp_path) for a in argv), *(["--dry-run"] if dry else [])]
    with pytest.raises(SystemExit) as stop:
        table1.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: " + problem.format(tmp=tmp_path) in err[0], err
    assert not out.exists()


def test_the_stand_in_root_may_be_missing_since_a_run_builds_it(table1, tmp_path) -> None:
    args = table1.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--root", "data/avmnist_lite"])
    assert args.root == (table1.REPO / "data" / "avmnist_lite").resolve()  # where the runs (started in REPO) look


def test_report_header_and_seeds_are_the_runs_not_the_commands_defaults(table1, tmp_path, capsys) -> None:
    """A 1-epoch, 2-seed grid reported from its CSV said `Noise sd 1.0; 100 epochs; seeds [0, 1, 2].`, the
    defaults; a seed given to report but never run was listed as if it counted."""
    grid = tmp_path / "grid"
    for seed in (0, 1):
        for model, acc in (("full", 0.3), ("no_injection", 0.2)):
            folder = grid / model / f"s{seed}_test_last"
            folder.mkdir(parents=True)
            rows = [{"metric": "accuracy", "value": acc, "method": "m", "split": "test", "noise_std": 0.5},
                    {"metric": "test_accuracy", "value": acc, "method": "m", "split": "test", "epoch": 1}]
            folder.joinpath("results.json").write_text(json.dumps({"meta": {"stopping": None}, "rows": rows}))
    csv = tmp_path / "grid.csv"
    table1.main(["report", "--out", str(grid), "--csv", str(csv)])
    assert capsys.readouterr().out.splitlines()[0] == "Noise sd 0.5; 1 epoch; seeds [0, 1]."
    table1.main(["report", "--out", str(csv)])
    assert capsys.readouterr().out.splitlines()[0] == "Noise sd 0.5; 1 epoch; seeds [0, 1]."
    table1.main(["report", "--out", str(csv), "--seeds", "1", "2", "--max-epochs", "100"])
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("Noise sd 0.5; 1 epoch; seeds [1] (chosen with --seeds; the runs also have seed 0; "
                             "seed 2, asked for with --seeds, has no finished run).")
    assert "This report was given --max-epochs 100 (the runs: 1)" in header


def test_the_converged_table_regenerates_from_its_committed_csv_alone(table1, capsys) -> None:
    """experiments/results/mmca_avmnist_converged_cpu.md: `report --out <its CSV>` with or without the grid's
    options gives the page's report (five seeds, the rule of the runs), not the defaults' three seeds."""
    page = (SCRIPT.parent / "results" / "mmca_avmnist_converged_cpu.md").read_text()
    csv = SCRIPT.parent / "results" / "grids" / "mmca_avmnist_converged.csv"
    table1.main(["report", "--out", str(csv)])
    text = capsys.readouterr().out
    assert text.strip() in page
    assert text.startswith("Noise sd 1.0; trained until val/acc had not risen by more than 0.002 for 20 epochs "
                           "(at least 100 or 200, cap 300); seeds [0, 1, 2, 3, 4].")
    table1.main(["report", "--out", str(csv), "--seeds", "0", "1", "2", "3", "4", "--noise-std", "1.0",
                 "--patience", "20", "--min-epochs", "100", "--max-epochs", "300", "--min-delta", "0.002"])
    assert capsys.readouterr().out == text
