"""The IC-SSL experiment drivers: the paper tables (experiments/icssl_paper_tables.py), the dataset-size sweep
(experiments/icssl_fig3_sweep.py) and the sweep's report (experiments/icssl_sweep.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "icssl_paper_tables.py"


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("icssl_paper_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def _args(tables, tmp_path: Path):
    return tables.parse_args(["report", "--out", str(tmp_path), "--seeds", "0", "1"])


def _load(grid: Path) -> dict:
    """A grid's records (``experiments/tidy.py``, importable once a driver has been loaded)."""
    import tidy

    return tidy.load(grid)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_grid_holds_out_the_test_manifold_and_tests_every_model(tables, tmp_path) -> None:
    args = _args(tables, tmp_path)
    fits = tables.fit_jobs(args)
    assert len({j.folder for j in fits}) == len(fits)
    # 2 kernels x 4 models x (5 ID alone + 1 ID on all five + 5 OOD) x 2 seeds, + Table 6 (3 models) and
    # image ID (4 models) per seed.
    assert len(fits) == 2 * 4 * 11 * 2 + (3 + 4) * 2
    tests = tables.test_jobs(args)
    for fit in fits:
        name = fit.folder.parent.name
        mine = [t for t in tests if t.after == [fit.folder]]
        assert mine, f"{name} is never tested"
        if "_no_" in name:
            held_out = name.rsplit("_no_", 1)[1]
            train = _flag(fit.argv, "--data.init_args.train_manifolds")
            assert held_out not in train and held_out in tables.MANIFOLDS
            synthetic = next(t for t in mine if t.folder.name.endswith("_manifolds"))
            assert _flag(synthetic.argv, "--data.init_args.test_manifolds") == str([held_out])
            # Table 5's OOD: every RBF leave-one-out model is also tested on the image manifolds.
            assert any(t.folder.name.endswith("_images") for t in mine) == ("_rbf_" in name)
        elif "_only_" in name:  # the paper's ID: trained and tested on one manifold
            alone = name.rsplit("_only_", 1)[1]
            assert _flag(fit.argv, "--data.init_args.train_manifolds") == str([alone])
            assert _flag(mine[0].argv, "--data.init_args.test_manifolds") == str([alone])
        elif name.endswith("_five"):
            assert _flag(fit.argv, "--data.init_args.train_manifolds") == str(list(tables.MANIFOLDS))


def test_the_image_models_merged_config_is_written_by_a_stage_that_trains_only(tables, tmp_path) -> None:
    """A dry run or a report names ``_models/<config>.yaml`` in its commands but writes nothing; ``fit`` writes it
    once the runner has checked the grid and claimed its folder (``grid_claimed``)."""
    for stage, extra, written in (("fit", ["--dry-run"], False), ("report", [], False), ("all", ["--dry-run"], False),
                                  ("fit", [], False), ("fit", [], True)):
        args = tables.parse_args([stage, "--out", str(tmp_path / "grid"), "--seeds", "0", *extra])
        args.grid_claimed = written
        image_fit = next(j for j in tables.fit_jobs(args) if j.folder.parent.name == "tuned_rbf_images")
        section = Path(_flag(image_fit.argv, "--model"))
        assert section.parent == tmp_path / "grid" / "_models"
        assert section.is_file() == written and (tmp_path / "grid").exists() == written, (stage, extra)
    assert "net" in yaml.safe_load(section.read_text())["init_args"]  # the model section of the manifolds config


def _results(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    path.joinpath("results.json").write_text(json.dumps({"meta": {}, "rows": rows}))


def test_overlay_reaches_every_tables_2_4_model_after_its_own_config(tables, tmp_path) -> None:
    overlay = Path(__file__).resolve().parents[2] / "configs" / "icssl" / "manifolds" / "few_labels.yaml"
    args = tables.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--overlay", str(overlay)])
    for fit in tables.fit_jobs(args):
        configs = [fit.argv[i + 1] for i, a in enumerate(fit.argv) if a == "--config"]
        name = fit.folder.parent.name
        if not (name.startswith("product") or name.endswith("_images")):  # base config(s) first: the overlay wins
            assert configs[-1] == str(overlay) and len(configs) >= 2
        else:  # Table 6 and the image models keep their own configs
            assert str(overlay) not in configs
    with pytest.raises(SystemExit):
        tables.parse_args(["fit", "--out", str(tmp_path), "--overlay", str(tmp_path / "missing.yaml")])


def test_report_gives_mean_and_sample_sd_over_seeds_next_to_the_paper(tables, tmp_path) -> None:
    def row(value, method="ORIG+E2E-ICL", **coords):
        return {"metric": "accuracy", "value": value, "method": method, "split": "test", **coords}

    for seed, value in ((0, 0.80), (1, 0.90)):
        _results(tmp_path / "tuned_rbf_no_cone" / f"s{seed}_test_manifolds",
                 [row(value, n_labeled=3), row(0.6, "class_prior", n_labeled=3)])
        _results(tmp_path / "eig_rbf_no_cone" / f"s{seed}_test_manifolds", [row(value - 0.1, "EIG+ICL", n_labeled=3)])
        _results(tmp_path / "product_ours" / f"s{seed}_test_product", [row(value, n_labeled=80)])
    _results(tmp_path / "tuned_rbf_five" / "s0_test_manifolds", [row(0.5, manifold="cone", n_labeled=3)])
    text = tables.report(_args(tables, tmp_path))
    # The same report from the grid's tidy CSV alone (what experiments/results/grids/ keeps): identical.
    csv = tmp_path.parent / "grid.csv"
    args = _args(tables, tmp_path)
    args.csv = csv
    assert tables.report(args) == text and csv.is_file()
    args.out, args.csv = csv, None
    assert tables.report(args) == text
    line = next(x for x in text.splitlines() if x.startswith("| rbf-cone |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    # sd of (0.8, 0.9) with n - 1 = 0.0707; a cell with fewer seeds than asked says how many.
    # Columns: EIG+ICL ID (alone), ID (five), OOD; E2E the same; class prior. "five" has no paper value.
    assert cells[1:] == ["-- (0.731)", "--", "0.750 ± 0.071 (0.826)", "-- (0.790)", "0.500 ± 0.000 (n=1)",
                         "0.850 ± 0.071 (0.753)", "0.600 ± 0.000"]
    assert "| 80 | -- (0.619) | 0.850 ± 0.071 (0.744) | -- (0.555) |" in text
    # What was not run is left out: no linear rows, no faithful tables, no Table 5, no unmeasured Table 6 rows.
    assert "| linear-" not in text and "faithful configuration" not in text and "### Table 5" not in text
    assert "| rbf-sphere |" not in text and "| 40 |" not in text
    assert text.count("### Tables 2-4,") == 1  # only the 3-label table of the tuned configuration has a value
    # OOD margin at 3 labels on the one manifold with both: 0.85 - 0.75 = +10 points (paper 0.753 - 0.826).
    assert "| tuned | rbf | OOD | +10.0 ± 0.0 (-7.3) | -- | -- |" in text
    verdict = next(x for x in text.splitlines() if x.startswith("| tuned | rbf | OOD | 3 |"))
    assert verdict.endswith("| opposite sign |")
    # ... and per manifold (the OOD cone row), with the paper's spread: sqrt(0.017^2 + 0.013^2) = 2.1 points.
    assert "| tuned | OOD | rbf-cone | 3 | +10.0 ± 0.0 | -7.3 ± 2.1 | opposite sign |" in text


def test_zero_shot_image_test_uses_the_fits_own_model(tables, tmp_path) -> None:
    args = tables.parse_args(["test", "--out", str(tmp_path), "--seeds", "0", "1"])
    args.grid_claimed = True  # a test stage that runs its tests writes the fits' model sections
    fit = next(j for j in tables.fit_jobs(args) if j.folder.parent.name == "eig_rbf_no_cone")
    fit.folder.mkdir(parents=True)
    model = {"class_path": "lit_icl.icssl.ICSSLModule", "init_args": {"net": {"init_args": {"representation": {
        "class_path": "lit_icl.icssl.LaplacianEigenmap", "init_args": {"n_neighbors": 6}}}}}}
    (fit.folder / "config.yaml").write_text(json.dumps({"model": model, "data": {"class_path": "x"}}))
    test = next(t for t in tables.test_jobs(args) if t.after == [fit.folder] and t.folder.name.endswith("_images"))
    section = Path(_flag(test.argv, "--model"))
    import yaml

    assert yaml.safe_load(section.read_text()) == model  # the checkpoint's own eigenmap, not the image config's
    assert _flag(test.argv, "--config").endswith("icssl/image_manifolds.yaml")


@pytest.mark.parametrize(("ours", "sd", "paper", "spread", "expected"), [
    (1.0, 0.3, 1.5, 1.0, "reproduced"),
    (4.0, 0.3, 1.0, 0.5, "same sign, outside the paper's spread"),
    (-0.2, 0.5, 1.0, 0.5, "not resolved (|margin| <= sd over seeds)"),
    (-2.0, 0.5, 1.0, 0.5, "opposite sign"),
    # Same sign as the paper's and within its spread, but our own sd over seeds does not exclude zero.
    (0.4, 0.4, 1.6, 1.4, "not resolved (|margin| <= sd over seeds), within the paper's spread"),
    # The paper's own margin is within its spread of zero (0.970 vs 0.970): no sign to match.
    (0.2, 0.3, 0.0, 0.4, ("reproduced: no margin (the paper's is within its spread of zero, and ours within that "
                          "spread)")),
    (1.1, 0.2, 0.0, 0.4, "the paper's margin is within its spread of zero; ours is outside that spread"),
])
def test_margin_verdicts(tables, ours, sd, paper, spread, expected) -> None:
    assert tables.verdict(ours, sd, 3, paper, spread) == expected
    assert tables.verdict(ours, sd, 1, paper, spread) == "one seed: no sd"


def test_convergence_budget_stops_early_under_a_step_cap_and_tests_the_best_round(tables, tmp_path) -> None:
    args = tables.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--steps", "4000", "--patience", "5",
                              "--val-every", "100"])
    fit = next(j for j in tables.fit_jobs(args) if j.folder.parent.name == "tuned_rbf_only_spiral")
    assert _flag(fit.argv, "--trainer.max_steps") == "4000"
    assert _flag(fit.argv, "--trainer.max_epochs") == "40"
    assert _flag(fit.argv, "--data.init_args.train_batches_per_epoch") == "100"
    assert _flag(fit.argv, "--early_stopping.patience") == "5"
    ckpts = fit.folder / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "last.ckpt").touch()
    assert tables.tested_checkpoint(fit.folder, args) == ckpts / "last.ckpt"  # no best round recorded yet
    (ckpts / "best-epoch=7-step=800.ckpt").touch()
    test = next(t for t in tables.test_jobs(args) if t.after == [fit.folder])
    assert _flag(test.argv, "--ckpt_path") == str(ckpts / "best-epoch=7-step=800.ckpt")
    fixed = tables.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--steps", "300"])
    fit = next(j for j in tables.fit_jobs(fixed) if j.folder.parent.name == "tuned_rbf_only_spiral")
    assert "--early_stopping.patience" not in fit.argv and "--trainer.max_steps" not in fit.argv
    assert tables.tested_checkpoint(fit.folder, fixed) == ckpts / "last.ckpt"  # fixed length: the last step


def test_step_floor_reaches_every_run_capped_at_its_own_cap(tables, tmp_path) -> None:
    args = tables.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--steps", "4000", "--eig-steps", "2000",
                              "--patience", "5", "--min-steps", "3000"])
    jobs = {j.folder.parent.name: j for j in tables.fit_jobs(args)}
    assert _flag(jobs["tuned_linear_no_spiral"].argv, "--trainer.min_steps") == "3000"
    assert _flag(jobs["eig_linear_no_spiral"].argv, "--trainer.min_steps") == "2000"  # never above the cap
    plain = tables.parse_args(["fit", "--out", str(tmp_path), "--seeds", "0", "--steps", "4000", "--patience", "5"])
    assert all("--trainer.min_steps" not in j.argv for j in tables.fit_jobs(plain))
    with pytest.raises(SystemExit):
        tables.parse_args(["fit", "--out", str(tmp_path), "--patience", "5", "--min-steps", "0"])


def test_steps_table_reads_the_stopping_records_of_the_tests(tables, tmp_path) -> None:
    for seed, (best, stopped, early) in enumerate(((800, 1300, True), (1200, 1700, True), (3900, 4000, False))):
        folder = tmp_path / "tuned_rbf_only_spiral" / f"s{seed}_test_manifolds"
        folder.mkdir(parents=True)
        stopping = {"best_step": best, "stopped_step": stopped, "stopped_early": early, "patience": 5,
                    "max_steps": 4000}
        folder.joinpath("results.json").write_text(json.dumps({"meta": {"stopping": stopping, "trained_steps": best},
                                                               "rows": []}))
    text = tables.steps_table(_load(tmp_path), [0, 1, 2])
    assert "| tuned_rbf_only | 3 | 1200 (800-3900) | 1700 (1300-4000) | 1 of 3 | 5 | 4000 |" in text


# The dataset-size sweep of Sec. 4.2 (Fig. 3, Table 1): experiments/icssl_fig3_sweep.py.
SWEEP = SCRIPT.with_name("icssl_fig3_sweep.py")


@pytest.fixture(scope="module")
def sweep(tables):  # the sweep imports the tables script's runner, loaded above under its own name
    spec = importlib.util.spec_from_file_location("icssl_fig3_sweep", SWEEP)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_sweep_trains_every_method_at_every_size_and_aligns_at_the_largest(sweep, tmp_path) -> None:
    args = sweep.parse_args(["fit", "--out", str(tmp_path), "--sizes", "30", "10", "--seeds", "0", "1"])
    args.input_dim = 1280
    fits = sweep.fit_jobs(args)
    # 2 sizes x 2 seeds x 3 methods, each in its own folder; the size is the data module's train_episodes.
    assert len({j.folder for j in fits}) == len(fits) == 12
    for fit in fits:
        method, size = fit.folder.parent.name.rsplit("_size", 1)
        assert _flag(fit.argv, "--data.init_args.train_episodes") == size
        assert _flag(fit.argv, "--seed_everything") == _flag(fit.argv, "--data.init_args.data_seed") == fit.folder.name[1:]
        if method == "transformer":
            assert _flag(fit.argv, "--model.init_args.net") == "lit_icl.icssl.ICLTransformerBaseline"
            assert _flag(fit.argv, "--model.init_args.net.init_args.input_dim") == "1280"
            assert _flag(fit.argv, "--model.init_args.net.init_args.input_norm") == "true"
        # Every method sees the same episodes (Table 1 embeds them with two models at once).
        assert not any(a.startswith("--data.init_args.feature_scale") for a in fit.argv)
    tests = sweep.test_jobs(args)
    for fit in fits:  # every model tested once with separation rows
        mine = [t for t in tests if t.after == [fit.folder]]
        assert len(mine) == 1
        callbacks = json.loads(_flag(mine[0].argv, "--trainer.callbacks"))
        assert callbacks[0]["init_args"]["rows"] is True
    # Table 1 only at the largest size, per seed: our model with the same seed's Transformer beside it.
    table1 = [t for t in tests if t.folder.name.endswith("_table1")]
    assert [t.folder.parent.name for t in table1] == ["e2e_size30", "e2e_size30"]
    for t in table1:
        other = tmp_path / "transformer_size30" / t.folder.name.split("_")[0]
        assert t.after == [tmp_path / "e2e_size30" / other.name, other]
        compare = json.loads(_flag(t.argv, "--trainer.callbacks"))[0]["init_args"]["compare_checkpoints"]
        assert compare == {"transformer": str(other / "checkpoints" / "last.ckpt")}


def test_sweep_table1_averages_alignment_over_seeds(sweep, tmp_path) -> None:
    args = sweep.parse_args(["report", "--out", str(tmp_path), "--sizes", "10", "--seeds", "0", "1"])
    for seed, value in ((0, 0.2), (1, 0.4)):
        _results(tmp_path / "e2e_size10" / f"s{seed}_test_table1", [
            {"metric": "mnn", "value": value, "method": "ORIG+E2E-ICL", "embeddings": "model~transformer"},
            {"metric": "separation", "value": 0.9, "method": "ORIG+E2E-ICL", "embeddings": "model"},
        ])
    text = sweep.table1(args, _load(tmp_path))
    assert "| model~transformer | 0.300 ± 0.141 | -- | -- |" in text
    assert "separation" not in text and "| model |" not in text


def test_sweep_training_length_reads_each_runs_stopping_record(sweep, tmp_path) -> None:
    args = sweep.parse_args(["report", "--out", str(tmp_path), "--sizes", "10", "--seeds", "0", "1", "2"])
    for seed, (best, stopped, early) in enumerate(((300, 800, True), (900, 1400, True), (1500, 1500, False))):
        folder = tmp_path / "e2e_size10" / f"s{seed}"
        folder.mkdir(parents=True)
        folder.joinpath("stopping.json").write_text(json.dumps({
            "best_step": best, "stopped_step": stopped, "stopped_early": early, "patience": 5, "max_steps": 1500}))
    text = sweep.training_length(args, _load(tmp_path))
    # Medians and ranges over the three seeds; one run ran to its cap. Methods without records are left out.
    assert "| e2e_size10 | 3 | 900 (300-1500) | 1400 (800-1500) | 1 of 3 | 5 | 1500 |" in text
    assert "transformer" not in text


def test_sweep_overlay_follows_the_features_config_in_every_run(sweep, tmp_path) -> None:
    overlay = Path(__file__).resolve().parents[2] / "configs" / "icssl" / "features" / "few_labels.yaml"
    args = sweep.parse_args(["fit", "--out", str(tmp_path), "--sizes", "10", "--overlay", str(overlay)])
    args.input_dim = 8
    for fit in sweep.fit_jobs(args):
        configs = [fit.argv[i + 1] for i, a in enumerate(fit.argv) if a == "--config"]
        assert configs == [str(sweep.CONFIG), str(overlay)]
    with pytest.raises(SystemExit):
        sweep.parse_args(["fit", "--out", str(tmp_path), "--overlay", str(tmp_path / "missing.yaml")])


def test_sweep_rejects_an_empty_dataset_size(sweep) -> None:
    with pytest.raises(SystemExit):
        sweep.parse_args(["fit", "--sizes", "0"])


def test_sweep_names_the_stand_in_when_the_feature_file_is_missing(sweep, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit, match="lit_icl.icssl.build features-standin"):
        sweep.feature_dim(tmp_path / "missing.pt")
    # The driver's refusal: one `error:` line and exit 2, as every driver's (it exited 1 without the prefix).
    with pytest.raises(SystemExit) as stop:
        sweep.main(["fit", "--sizes", "100", "--seeds", "0", "--out", str(tmp_path / "grid"),
                    "--features", str(tmp_path / "missing.pt")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"error: --features {tmp_path / 'missing.pt'}: no feature file" in err[0]
    assert not (tmp_path / "grid").exists()


def test_a_sweep_rerun_with_its_own_command_is_not_refused_as_a_change_of_settings(sweep, tmp_path, capsys) -> None:
    """The feature dimension is read from ``--features`` after parsing, so the grid's record, parsed without
    reading the file, had none: every ``fit`` or ``all`` into a grid with a started run, the very command that
    started it included, was refused as "--input-dim 6, but the grid ... has runs made with --input-dim None"."""
    import runner
    import torch

    features = tmp_path / "features.pt"
    torch.save({"features": torch.zeros(8, 6), "labels": torch.arange(2).repeat_interleave(4)}, features)
    out = tmp_path / "grid"
    argv = ["fit", "--features", str(features), "--sizes", "10", "--seeds", "0", "--steps", "2", "--epochs", "1",
            "--out", str(out)]
    runner.record_grid(sweep.parse_args(argv))  # what the first sitting recorded, with one run finished
    (out / "e2e_size10" / "s0").mkdir(parents=True)
    (out / "e2e_size10" / "s0" / "done").write_text("1.0 s\n")
    with pytest.raises(SystemExit) as stop:
        sweep.main([*argv, "--dry-run"])
    printed, err = capsys.readouterr()
    assert stop.value.code == 0 and "error" not in err, err
    assert "--model.init_args.net.init_args.input_dim 6" in printed  # the transformer still gets the file's
    # A real change of settings is still refused, naming it alone.
    with pytest.raises(SystemExit) as stop:
        sweep.main([*argv, "--steps", "4", "--dry-run"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "this fit takes --steps 4, but the grid" in err and "input-dim" not in err, err


@pytest.mark.parametrize("argv, problem", [
    (["--epochs", "0"], "argument --epochs: 0 must be at least 1"),  # was a ZeroDivisionError
    (["--patience", "2", "--val-every", "0"], "--val-every 0: validate every 1 or more steps"),
    (["--min-steps", "5"], "--min-steps 5 is a floor under early stopping"),
    (["--min-delta", "0.01"], "--min-delta 0.01 is the smallest rise early stopping counts"),
])
def test_sweep_refuses_a_budget_no_run_could_train(sweep, tmp_path, capsys, argv, problem) -> None:
    with pytest.raises(SystemExit) as stop:
        sweep.parse_args(["fit", "--out", str(tmp_path / "grid"), *argv])
    assert stop.value.code == 2 and problem in capsys.readouterr().err


# The sweep's curves and phase transitions (experiments/icssl_sweep.py, which the driver's report calls).
@pytest.fixture(scope="module")
def sweep_script():
    return load_script(SCRIPT.with_name("icssl_sweep.py"))


def test_dataset_size_sweep_finds_the_largest_rise(sweep_script, tmp_path, capsys) -> None:
    """Fig. 3's sweep from results files: curves per method and the size after the steepest accuracy rise."""
    from lit_icl.core.results import result_row, write_results

    sweep_main, phase_transition = sweep_script.main, sweep_script.phase_transition

    # A baseline with a jump between 1000 and 1200 episodes, our model rising smoothly; two seeds each.
    acc = {"Transformer": {200: 0.52, 1000: 0.55, 1200: 0.80, 5000: 0.85},
           "ORIG+E2E-ICL": {200: 0.70, 1000: 0.76, 1200: 0.78, 5000: 0.84}}
    runs = []
    for method, curve in acc.items():
        for size, value in curve.items():
            for seed in (0, 1):
                run = tmp_path / f"{method}-{size}-{seed}"
                rows = [result_row("accuracy", value + 0.01 * seed, method=method, label_ratio=0.03,
                                   n_labeled=3, dataset_size=size),
                        result_row("separation", value - 0.5, method=method, embeddings="model", k=10)]
                write_results(run, rows, {"seed": seed})
                runs.append(str(run))
    assert sweep_main([*runs, "--out", str(tmp_path / "sweep")]) == 0
    out = json.loads((tmp_path / "sweep/results.json").read_text())["rows"]
    transitions = {r["method"]: r["value"] for r in out if r["metric"] == "phase_transition"}
    assert transitions == {"Transformer": 1200, "ORIG+E2E-ICL": 1000}
    sep = [r for r in out if r["metric"] == "separation" and r["method"] == "Transformer"]
    assert [r["dataset_size"] for r in sep] == [200, 1000, 1200, 5000]
    assert sep[2]["value"] == pytest.approx(0.30) and sep[2]["n"] == 2
    assert (tmp_path / "sweep/sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "| Transformer | accuracy |" in capsys.readouterr().out
    assert phase_transition([(5, 0.1, 0.0, 1)]) is None
    assert phase_transition([(5, 0.6, 0.0, 1), (50, 0.6, 0.0, 1), (500, 0.5, 0.0, 1)]) is None  # never rises


def test_the_sweep_a_report_writes_into_its_grid_is_no_run_of_the_grids_table(sweep, sweep_script, tmp_path) -> None:
    """The Fig. 3 driver's report writes the pooled sweep into ``<grid>/sweep``; its results.json made it a run
    named ``sweep`` in the grid's tidy table (``report --csv``, ``runner.py tidy``), its means beside the runs they
    pool, and it recorded neither the command, the commit, the machine nor the date, as a test's results.json does."""
    # (the sweep fixture puts the drivers' modules, tidy among them, on the import path)
    import tidy

    from lit_icl.core.results import result_row

    grid = tmp_path / "grid"
    runs = []
    for method, value in (("ORIG+E2E-ICL", 0.7), ("ORIG+ICL", 0.6)):
        run = grid / method / "s0_test"
        _results(run, [result_row("accuracy", value, method=method, label_ratio=0.03, dataset_size=10),
                       result_row("separation", value - 0.5, method=method, embeddings="model", dataset_size=10)])
        runs.append(run)
    rows = sweep_script.pooled_rows(runs)
    assert sweep_script.sweep_report(rows, 0.03, grid / "sweep", [str(r) for r in runs]) is not None
    meta = json.loads((grid / "sweep" / "results.json").read_text())["meta"]
    assert meta["summary_of"] == [str(r) for r in runs]
    assert {"command", "commit", "machine", "created", "versions"} <= set(meta)
    assert sorted(tidy.read_folders(grid)) == ["ORIG+E2E-ICL/s0_test", "ORIG+ICL/s0_test"]


@pytest.mark.parametrize("argv, problem", [
    (["fit", "--seeds", "0", "0"], "--seeds 0 0: give each seed once, as an integer >= 0"),
    (["all", "--seeds", "-1"], "--seeds -1: give each seed once, as an integer >= 0"),
    (["fit", "--out", "{tmp}/a_file"], "--out {tmp}/a_file is a file; fit writes the grid's run folders into a folder"),
    (["fit", "--only", "tuned_rbf_only_sphre"], "--only 'tuned_rbf_only_sphre' matches none of the grid's 630 jobs (e.g. 'fit tuned_rbf_only_cone s0')"),
    (["report", "--out", "{tmp}/nowhere"], "--out {tmp}/nowhere: no such grid folder or results CSV"),
    # These printed "no finished tests" and exited 0; wrote a tidy CSV under another extension.
    (["report", "--out", "{tmp}/a_list.yaml"], "--out {tmp}/a_list.yaml is a file but not a grid's tidy CSV"),
    (["report", "--csv", "{tmp}/tables.txt"], "--csv {tmp}/tables.txt: a tidy CSV's name ends in .csv"),
    (["fit", "--steps", "5", "--epochs", "2"], "--steps 5 is not a multiple of --epochs 2"),
    (["fit", "--stesp", "5"], "error: unrecognized arguments: --stesp 5"),
    # These made every job fail alike, one after the other, each after writing its folder.
    (["all", "--val-episodes", "8"], "--val-episodes 8: the episodes come in chunks of 16 (the configs' chunk_size)"),
    (["test", "--test-episodes", "0"], "--test-episodes 0: the episodes come in chunks of 16"),
    (["fit", "--image-root", "{tmp}/no_images"], "--image-root {tmp}/no_images: no such folder; point it at the"),
    (["fit", "--overlay", "{tmp}/broken.yaml"], "{tmp}/broken.yaml is not valid YAML at line 3"),
    (["fit", "--overlay", "{tmp}/a_list.yaml"], "{tmp}/a_list.yaml holds a YAML sequence at its top level, not a mapping of keys"),
    # These raised ZeroDivisionError (the second after writing grid.json) or became 1 batch per epoch silently.
    (["fit", "--epochs", "0"], "argument --epochs: 0 must be at least 1"),
    (["fit", "--patience", "2", "--val-every", "0"], "--val-every 0: validate every 1 or more steps"),
    (["fit", "--steps", "0"], "argument --steps: 0 must be at least 1"),
    (["fit", "--eig-steps", "-6"], "argument --eig-steps: -6 must be at least 1"),
    (["fit", "--eig-steps", "-5"], "argument --eig-steps: -5 must be at least 1"),  # suggested "e.g. -6"
    # These were passed on to every run, or ignored without a word.
    (["fit", "--patience", "0"], "--patience 0: give 1 or more validation rounds without improvement"),
    (["fit", "--patience", "3", "--min-delta", "-0.1"], "--min-delta -0.1: the smallest rise that counts"),
    (["fit", "--min-steps", "5"], "--min-steps 5 is a floor under early stopping, which only --patience turns on"),
    (["fit", "--min-delta", "0.01"], "--min-delta 0.01 is the smallest rise early stopping counts, which only"),
])
def test_a_grid_that_cannot_run_as_meant_is_refused_in_one_line_before_anything_is_written(
        tables, tmp_path, capsys, argv: list[str], problem: str) -> None:
    (tmp_path / "a_file").write_text("")
    (tmp_path / "broken.yaml").write_text("trainer:\n max_steps: 3\n  model: [\n")
    (tmp_path / "a_list.yaml").write_text("- trainer\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "grid")]
    with pytest.raises(SystemExit) as stop:
        tables.main([*argv, *out, "--dry-run"] if argv[0] != "report" else [*argv, *out])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and problem.format(tmp=tmp_path) in err[0], err  # one line (argparse's usage was printed too)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "a_list.yaml", "broken.yaml"]  # nothing written


def test_a_grid_refused_after_parsing_writes_nothing(tables, tmp_path, capsys) -> None:
    """``all`` with an ``--only`` that names no job was refused, but only after building the jobs had written the
    merged model sections into ``<out>/_models``; so did every refusal after parsing (executor, cluster)."""
    with pytest.raises(SystemExit) as stop:
        tables.main(["all", "--out", str(tmp_path / "grid"), "--seeds", "0", "--only", "no_such_model"])
    assert stop.value.code == 2 and "--only 'no_such_model' matches none" in capsys.readouterr().err
    assert not (tmp_path / "grid").exists()


def test_the_drivers_chunk_size_is_the_data_modules(tables) -> None:
    """The driver checks episode counts against the chunk size without importing the data module (it parses without
    torch); the two must agree."""
    import inspect

    from lit_icl.icssl.data import ManifoldDataModule

    assert inspect.signature(ManifoldDataModule).parameters["chunk_size"].default == tables.CHUNK_SIZE


def test_a_zero_validation_interval_is_refused_before_grid_json_is_written(tables, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:  # no --dry-run: this one used to write grid.json, then divide by zero
        tables.main(["fit", "--out", str(tmp_path / "grid"), "--patience", "2", "--val-every", "0"])
    assert stop.value.code == 2 and "--val-every 0" in capsys.readouterr().err
    assert not (tmp_path / "grid").exists()


def _test_run(folder: Path, value: float, steps: int, episodes: int | None, stopping: dict | None = None) -> None:
    """A finished test of the tables grid: its results (one accuracy at 3 labels) and the config it saved."""
    folder.mkdir(parents=True)
    row = {"metric": "accuracy", "value": value, "method": "m", "split": "test", "n_labeled": 3}
    folder.joinpath("results.json").write_text(json.dumps(
        {"meta": {"trained_steps": steps, "stopping": stopping}, "rows": [row]}))
    data = {} if episodes is None else {"test_episodes": episodes}
    folder.joinpath("config.yaml").write_text(yaml.safe_dump({"data": {"init_args": data}}))
    folder.joinpath("done").write_text("1.0 s\ncpu 1.0 s\n")


def _fixed_grid(grid: Path) -> None:
    """Seeds 0, 1 and 3 of two models trained 120 steps (heads 60) and tested on 64 episodes, and a fit whose
    saved config keeps the data module's own test_episodes (so the tidy CSV keeps the tests' value, which varies)."""
    for seed, value in ((0, 0.80), (1, 0.90), (3, 0.50)):
        _test_run(grid / "tuned_rbf_no_cone" / f"s{seed}_test_manifolds", value, 120, 64)
        _test_run(grid / "eig_rbf_no_cone" / f"s{seed}_test_manifolds", value - 0.1, 60, 64)
    fit = grid / "tuned_rbf_no_cone" / "s0"
    fit.mkdir()
    fit.joinpath("config.yaml").write_text(yaml.safe_dump({"data": {"init_args": {"test_episodes": 2048}}}))
    fit.joinpath("done").write_text("1.0 s\ncpu 1.0 s\n")


def test_report_header_and_seeds_are_the_runs_not_the_commands_defaults(tables, tmp_path, capsys) -> None:
    """The header used to print the command's defaults (seeds [0, 1, 2], 300 steps, 512 episodes) and the tables
    kept seeds 0-2 only; from a CSV, that is all a reader can check the tables against."""
    grid = tmp_path / "grid"
    _fixed_grid(grid)
    csv = tmp_path / "grid.csv"
    tables.main(["report", "--out", str(grid), "--csv", str(csv)])
    from_folders = capsys.readouterr().out
    tables.main(["report", "--out", str(csv)])
    text = capsys.readouterr().out
    assert text == from_folders
    assert text.startswith("Accuracy on the unlabeled points, mean ± sd over seeds [0, 1, 3] (paper's mean in "
                           "parentheses); E2E models trained 120 steps, EIG+ICL heads 60; 64 test episodes per "
                           "manifold.\n")
    row = next(x for x in text.splitlines() if x.startswith("| rbf-cone |"))
    assert "| 0.733 ± 0.208 (0.753) |" in row  # E2E OOD over all three seeds: 0.8, 0.9, 0.5


def test_report_states_a_seed_filter_and_options_the_runs_did_not_use(tables, tmp_path, capsys) -> None:
    _fixed_grid(tmp_path)
    tables.main(["report", "--out", str(tmp_path), "--seeds", "0", "1", "5", "--steps", "60",
                 "--test-episodes", "256"])
    text = capsys.readouterr().out
    header = text.splitlines()[0]
    assert "mean ± sd over seeds [0, 1] (chosen with --seeds; the runs also have seed 3; seed 5, asked for with " \
           "--seeds, has no finished run)" in header
    assert "E2E models trained 120 steps, EIG+ICL heads 60; 64 test episodes per manifold." in header
    assert "This report was given --steps 60 (the runs: 120), --test-episodes 256 (the runs: 64), which the runs " \
           "did not use" in header
    row = next(x for x in text.splitlines() if x.startswith("| rbf-cone |"))
    assert "| 0.850 ± 0.071 (0.753) |" in row  # seeds 0 and 1 only


def test_the_converged_tables_regenerate_from_their_committed_csv_alone(tables, capsys) -> None:
    """experiments/results/icssl_tables_converged_cpu.md: `report --out <its CSV>`, with or without the grid's
    options, prints its header and numbers (seeds 0-4, the 4,000/2,000-step caps), not the defaults'."""
    page = (SCRIPT.parent / "results" / "icssl_tables_converged_cpu.md").read_text()
    csv = SCRIPT.parent / "results" / "grids" / "icssl_converged.csv"
    tables.main(["report", "--out", str(csv)])
    text = capsys.readouterr().out
    assert text.splitlines()[0] in page.splitlines()
    assert text.splitlines()[0].startswith("Accuracy on the unlabeled points, mean ± sd over seeds [0, 1, 2, 3, 4] ")
    assert "| tuned | rbf | ID | +0.2 ± 0.3 (+1.6) | +1.2 ± 0.2 (+0.7) | +1.7 ± 0.3 (+1.1) |" in text
    tables.main(["report", "--out", str(csv), "--steps", "4000", "--eig-steps", "2000", "--patience", "5",
                 "--seeds", "0", "1", "2", "3", "4"])  # the page's own command
    assert capsys.readouterr().out == text


def test_a_test_with_other_settings_than_the_finished_tests_is_refused(tables, tmp_path, capsys) -> None:
    """`test --test-episodes 128` over tests run with 64 printed "0 to run" and recorded 128 in grid.json."""
    grid = tmp_path / "grid"
    _test_run(grid / "tuned_rbf_only_cone" / "s0_test_manifolds", 0.8, 120, 64)
    argv = ["test", "--out", str(grid), "--seeds", "0", "--only", "tuned_rbf_only_cone s0"]
    with pytest.raises(SystemExit) as stop:
        tables.main([*argv, "--test-episodes", "128"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: --test-episodes 128: the finished test tuned_rbf_only_cone/s0_test_manifolds " \
                             "ran with 64" in err[0] and "give --test-episodes 64" in err[0]
    assert not (grid / "grid.json").exists()
    with pytest.raises(SystemExit) as stop:  # the finished tests' own value: skipped as done, as before
        tables.main([*argv, "--test-episodes", "64", "--dry-run"])
    assert stop.value.code == 0 and "1 done, 0 to run" in capsys.readouterr().out


# The Swiss-roll ablation (experiments/icssl_swiss_roll_ablation.py), which trains and tests as the tables do.
@pytest.fixture(scope="module")
def swiss_roll(tables):  # imports the tables script, loaded above under its own name
    return load_script(SCRIPT.with_name("icssl_swiss_roll_ablation.py"))


def test_swiss_roll_refuses_test_settings_other_than_its_finished_tests_ran_with(swiss_roll, tmp_path, capsys) -> None:
    """A finished test is skipped, so `test --test-episodes 32` over tests run with 16 reported "0 to run", left the
    16-episode numbers and recorded 32; with `--seeds` for a part of the grid, the report mixed both. The tables
    driver refused this; the ablation, which shares its runs, now does too, in one line, writing nothing."""
    out = tmp_path / "grid"
    finished = out / "e2e_deeper" / "s0_test_manifolds"
    finished.mkdir(parents=True)
    (finished / "config.yaml").write_text(yaml.safe_dump({"data": {"init_args": {"test_episodes": 16}}}))
    (finished / "done").write_text("1.0 s\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as stop:
        swiss_roll.main(["test", "--out", str(out), "--seeds", "0", "--test-episodes", "32", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert "error: --test-episodes 32: the finished test e2e_deeper/s0_test_manifolds ran with 16" in err[0]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("argv, problem", [
    (["all", "--val-episodes", "8"], "--val-episodes 8: the episodes come in chunks of 16"),
    (["test", "--test-episodes", "100"], "--test-episodes 100: the episodes come in chunks of 16"),
])
def test_swiss_roll_refuses_episodes_no_run_could_make_before_anything_is_written(swiss_roll, tmp_path, capsys, argv,
                                                                                 problem) -> None:
    """Every fit (or test) of the ablation failed alike, each after writing its folder."""
    with pytest.raises(SystemExit) as stop:
        swiss_roll.main([*argv, "--out", str(tmp_path / "grid"), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and problem in err[0], err
    assert not (tmp_path / "grid").exists()


def test_the_model_sections_of_image_tests_are_written_only_by_a_stage_that_runs_the_tests(tables, tmp_path,
                                                                                          capsys) -> None:
    """Building the Table 5 tests wrote ``<fit>_model.yaml`` beside each finished leave-one-out fit whenever the
    jobs were listed: by `test --dry-run`, by `report` (listing the unfinished jobs) and by a command refused
    after that, each of which should write nothing."""
    out = tmp_path / "grid"
    fit = out / "tuned_rbf_no_sphere" / "s0"
    fit.mkdir(parents=True)
    (fit / "config.yaml").write_text(yaml.safe_dump({"model": {"class_path": "M", "init_args": {"lr": 0.1}}}))
    (fit / "done").write_text("1.0 s\n")
    written = fit.parent / "s0_model.yaml"
    argv = ["--out", str(out), "--seeds", "0", "--steps", "2", "--epochs", "1", "--only", "tuned_rbf_no_sphere"]
    with pytest.raises(SystemExit):
        tables.main(["test", *argv, "--dry-run"])
    with pytest.raises(SystemExit):
        tables.main(["report", *argv])
    capsys.readouterr()
    assert not written.exists()
    args = tables.parse_args(["test", *argv])
    args.grid_claimed = True  # what the runner sets once it has checked the grid and locked its folder
    image_test = next(j for j in tables.test_jobs(args) if j.folder == fit.parent / "s0_test_images")
    assert image_test.argv[image_test.argv.index("--model") + 1] == str(written)
    assert yaml.safe_load(written.read_text()) == {"class_path": "M", "init_args": {"lr": 0.1}}


def test_a_sweep_report_without_the_grids_options_reports_the_sizes_and_seeds_it_has(sweep, tmp_path, capsys) -> None:
    """`report --out GRID` without `--sizes` looked for the default sizes (100 ... 3000) only, and refused a grid
    swept at 10 and 30 episodes as one with "no tested runs under it; start them with `all`". Like the tables'
    report, it now reads every size and seed with a finished test unless told which."""
    from lit_icl.core.results import result_row

    grid = tmp_path / "grid"
    for size, seed in ((10, 0), (30, 0), (30, 4)):
        for method in sweep.METHODS:
            _results(grid / f"{method}_size{size}" / f"s{seed}_test", [
                result_row("accuracy", 0.5 + size / 100, method=method, label_ratio=0.03, dataset_size=size),
                result_row("separation", 0.1, method=method, embeddings="model", dataset_size=size)])
    assert sweep.report(sweep.parse_args(["report", "--out", str(grid)])) == 0
    printed = capsys.readouterr().out
    assert "| orig | accuracy | 10: 0.600 ± 0.000 (1), 30: 0.800 ± 0.000 (2) | 30 (+0.200) |" in printed, printed
    # Asked for, the cells are those given.
    assert sweep.report(sweep.parse_args(["report", "--out", str(grid), "--sizes", "30", "--seeds", "4"])) == 0
    assert "| orig | accuracy | 30: 0.800 ± 0.000 (1) |" in capsys.readouterr().out


def test_a_swiss_roll_report_without_seeds_averages_every_tested_seed_and_names_them(swiss_roll, tmp_path) -> None:
    """Without `--seeds` the report averaged seed 0 alone (the option's default) under a header saying "seeds [0]",
    whatever seeds the grid was tested with; like the tables' report it now reads every tested seed."""
    from lit_icl.core.results import result_row

    grid = tmp_path / "grid"
    for seed, value in ((0, 0.5), (3, 0.7)):
        _results(grid / "e2e_deeper" / f"s{seed}_test_manifolds",
                 [result_row("accuracy", value, method="model", n_labeled=3)])
    report = swiss_roll.report(swiss_roll.parse_args(["report", "--out", str(grid), "--tables-out", str(tmp_path / "t")]))
    assert "mean ± sd over seeds [0, 3]" in report
    assert "0.600 ± " in next(line for line in report.splitlines() if line.startswith("| e2e_deeper"))
    chosen = swiss_roll.report(swiss_roll.parse_args(["report", "--out", str(grid), "--tables-out",
                                                      str(tmp_path / "t"), "--seeds", "3"]))
    assert "seeds [3] (chosen with --seeds; the runs also have seed 0)" in chosen
    assert "0.700 ± " in next(line for line in chosen.splitlines() if line.startswith("| e2e_deeper"))
