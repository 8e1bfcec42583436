"""The report command: averages runs that differ only in seed, pools a seed coordinate."""

from __future__ import annotations

import statistics

import pytest

from lit_icl.core.results import load_results, result_row, write_results
from lit_icl.report import experiment_fingerprint, label_runs
from lit_icl.report import main as report


def _fake_run(path, seed: int, name: str, accs: list[float], lr: float = 0.003) -> None:
    rows = [result_row("accuracy", a, method="E2E", label_ratio=r, n_labeled=round(100 * r))
            for r, a in zip([0.03, 0.25], accs)]
    rows.append(result_row("parameters", 11433, method="E2E"))
    config = {
        "seed_everything": seed,
        "model": {"class_path": "M", "init_args": {"lr": lr}},
        "data": {"class_path": "D", "init_args": {"data_seed": seed}},
        "trainer": {"max_epochs": 1, "logger": {"class_path": "TB", "init_args": {"name": name, "version": seed}}},
    }
    write_results(path, rows, {"config": config})


def test_report_averages_runs_that_differ_only_in_seed(tmp_path, capsys) -> None:
    _fake_run(tmp_path / "s0", 0, "exp", [0.70, 0.90])
    _fake_run(tmp_path / "s1", 1, "exp", [0.80, 0.92])
    _fake_run(tmp_path / "other", 0, "exp2", [0.5, 0.6], lr=0.1)
    runs = [load_results(tmp_path / p) for p in ("s0", "s1", "other")]
    assert experiment_fingerprint(runs[0]["meta"]) == experiment_fingerprint(runs[1]["meta"])
    assert experiment_fingerprint(runs[0]["meta"]) != experiment_fingerprint(runs[2]["meta"])
    assert label_runs(runs) == ["exp", "exp", "exp2"]
    out = tmp_path / "cmp.png"
    report([str(tmp_path / p) for p in ("s0", "s1", "other")] + ["--out", str(out)])
    table = capsys.readouterr().out.splitlines()
    assert table[2] == "| experiment | method | label_ratio=0.03 | label_ratio=0.25 |"
    sd = statistics.stdev([0.70, 0.80])
    assert table[4] == f"| exp | E2E | 0.750 ± {sd:.3f} | 0.910 ± {statistics.stdev([0.90, 0.92]):.3f} |"
    assert table[5] == "| exp2 | E2E | 0.500 | 0.600 |"  # n_labeled follows label_ratio: no column of its own
    assert "| exp | E2E | 11433 |" in table  # a count, identical over seeds
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        report([str(tmp_path / "missing")])


def test_report_pools_a_seed_coordinate_like_runs(tmp_path, capsys) -> None:
    """I2CL's rows carry ``seed``: the report's cells are mean ± sd over it (Table 1's "over 5 seeds"), and
    ``--x seed`` still gives one column per seed."""
    accs = {"i2cl": [0.70, 0.75, 0.80], "zero_shot": [0.77, 0.77, 0.77]}
    for s in range(3):
        rows = [result_row("accuracy", accs[m][s], method=m, task="sst2", seed=s) for m in accs]
        config = {"data": {"init_args": {"data_seed": s}}, "trainer": {"logger": {"init_args": {"name": f"s{s}"}}}}
        write_results(tmp_path / f"s{s}", rows, {"config": config})
    runs = [str(tmp_path / f"s{s}") for s in range(3)]
    report(runs + ["--metric", "accuracy"])
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "**accuracy** (n = 3 runs per cell)"
    assert table[2] == "| method | accuracy |"  # one task: no column coordinate
    assert table[4] == f"| i2cl | 0.750 ± {statistics.stdev(accs['i2cl']):.3f} |"
    assert table[5] == "| zero_shot | 0.770 ± 0.000 |"
    report(runs + ["--metric", "accuracy", "--x", "seed"])
    table = capsys.readouterr().out.splitlines()
    assert table[2] == "| method | seed=0 | seed=1 | seed=2 |"
    assert table[4] == "| i2cl | 0.700 | 0.750 | 0.800 |"


def _shift_run(path, seed: int) -> None:
    """CoQE regression's test rows: error against context length, per distribution shift."""
    rows = [result_row("mse", 0.1 * k + shift_error + seed, method="coqe", n_context=k, shift=shift)
            for shift, shift_error in (("id", 0.0), ("noisy", 3.0)) for k in (2, 4)]
    config = {"seed_everything": seed, "trainer": {"logger": {"init_args": {"name": "coqe_regression"}}}}
    write_results(path, rows, {"config": config})


def test_the_figure_draws_a_line_per_line_of_the_table(tmp_path, capsys, monkeypatch) -> None:
    """Coordinates besides --x (a test's shifts) keep their own lines in the figure, as in the table, rather than
    one line averaged over them with their spread drawn as a band."""
    import lit_icl.report as report_module

    drawn: list[dict] = []

    def spy(rows, x, **kwargs):
        drawn.extend(rows)
        return real(rows, x, **kwargs)

    real = report_module.line_figure
    monkeypatch.setattr(report_module, "line_figure", spy)
    for seed in (0, 1):
        _shift_run(tmp_path / f"s{seed}", seed)
    report([str(tmp_path / "s0"), str(tmp_path / "s1"), "--x", "n_context", "--out", str(tmp_path / "f.png")])
    table = capsys.readouterr().out.splitlines()
    assert table[2] == "| method | shift | n_context=2 | n_context=4 |"
    assert {r["series"] for r in drawn} == {"coqe, shift=id", "coqe, shift=noisy"}
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_an_x_no_row_has_is_refused_naming_the_coordinates(tmp_path, capsys) -> None:
    _shift_run(tmp_path / "s0", 0)
    with pytest.raises(SystemExit) as info:
        report([str(tmp_path / "s0"), "--x", "n_contxt", "--out", str(tmp_path / "f.png")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == ("lit_icl.report: error: --x n_contxt: no row of mse has that coordinate; use one of n_context, "
                   "shift")
    assert not (tmp_path / "f.png").exists()


@pytest.mark.parametrize("argv, problem", [
    (["--metric", "msee"], "no rows for metric(s) msee; use --metric with one of mse"),
    (["--split", "val"], "--split val: the runs have no rows of that split; use one of test"),
    (["--split", "test", "--metric", "acc"], "no rows for metric(s) acc in split test; use --metric with one of mse"),
    (["{tmp}/s0/results.csv"], "{tmp}/s0/results.csv is not a results.json (Expecting value"),
    (["--out", "{tmp}/f.pngg"], "--out {tmp}/f.pngg: matplotlib cannot write '.pngg' files; end the name in one of"),
    (["--out", "{tmp}/s0/results.json/f.png"], "--out {tmp}/s0/results.json/f.png: {tmp}/s0/results.json is a file"),
    (["--labels", "a", "b"], "--labels has 2 entries for 1 runs; give one label per run"),  # was argparse's usage
    (["--metrc", "mse"], "unrecognized arguments: --metrc mse"),  # so was this
])
def test_a_metric_or_figure_that_cannot_be_made_is_refused_in_one_line_naming_the_fix(tmp_path, capsys, argv,
                                                                                      problem) -> None:
    _shift_run(tmp_path / "s0", 0)
    (tmp_path / "s0" / "results.csv").write_text("metric,value\nmse,0.1\n")  # a tidy CSV is not a run's results
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as info:
        report([str(tmp_path / "s0"), *argv])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err  # nothing printed or drawn before the refusal
    assert err.startswith("lit_icl.report: error: " + problem.format(tmp=tmp_path)), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0"]


def test_a_figure_in_a_folder_that_does_not_exist_yet_is_drawn_there(tmp_path, capsys) -> None:
    _shift_run(tmp_path / "s0", 0)
    report([str(tmp_path / "s0"), "--out", str(tmp_path / "figures" / "new" / "f.pdf")])
    assert (tmp_path / "figures" / "new" / "f.pdf").read_bytes()[:4] == b"%PDF"


def test_a_figure_of_a_metric_without_coordinates_is_refused_before_the_tables(tmp_path, capsys) -> None:
    _fake_run(tmp_path / "s0", 0, "exp", [0.7, 0.9])
    with pytest.raises(SystemExit) as info:
        report([str(tmp_path / "s0"), "--metric", "parameters", "--out", str(tmp_path / "f.png")])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "the rows of parameters have no coordinate to draw against; report it as a table" in err
    assert not (tmp_path / "f.png").exists()


def test_tests_of_models_trained_differently_are_other_experiments_and_seeds_still_pool(tmp_path, capsys) -> None:
    """Two tests with the same test config, of checkpoints whose fits trained on other manifolds: before, the
    report averaged them as two seeds of one experiment ("n = 2"). The fit's config, recorded in each test's
    meta, now tells them apart; fits that differ only in seeds, folders and sitting budgets still pool."""
    def run(path, acc: float, manifolds: list[str], seed: int, max_time: str | None = None) -> str:
        test = {"model": {"init_args": {"lr": 0.003}}, "data": {"init_args": {"test_episodes": 16}},
                "trainer": {"logger": {"init_args": {"name": "T", "version": path.name}}}}
        fit = {"seed_everything": seed, "model": {"init_args": {"lr": 0.003}},
               "data": {"init_args": {"train_manifolds": manifolds, "data_seed": seed}},
               "trainer": {"max_steps": 9, "max_time": max_time,
                           "logger": {"init_args": {"name": "F", "version": f"s{seed}"}}}}
        write_results(path, [result_row("accuracy", acc, method="E2E")],
                      {"config": test, "fit_config": fit, "checkpoint": f"runs/F/s{seed}/checkpoints/last.ckpt"})
        return str(path)

    runs = [run(tmp_path / "a", 0.70, ["cylinder"], 0), run(tmp_path / "b", 0.80, ["sphere"], 0)]
    report(runs)
    table = capsys.readouterr().out
    assert "n = 1 runs per cell" in table and table.count("| E2E |") == 2
    runs = [run(tmp_path / "c", 0.70, ["sphere"], 1), run(tmp_path / "d", 0.80, ["sphere"], 2, "00:01:00:00")]
    report(runs)
    assert "n = 2 runs per cell" in capsys.readouterr().out


def test_a_tests_meta_records_the_config_of_the_fit_beside_its_checkpoint(tmp_path) -> None:
    from lit_icl.core.results import fit_config

    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("data:\n  init_args:\n    train_manifolds: [sphere]\n")
    assert fit_config(tmp_path / "run" / "checkpoints" / "last.ckpt") == {
        "data": {"init_args": {"train_manifolds": ["sphere"]}}}
    assert fit_config(tmp_path / "elsewhere.ckpt") is None and fit_config(None) is None


def test_a_figure_with_too_many_lines_for_one_panel_gets_a_panel_per_shift(tmp_path) -> None:
    """CoQE regression's test: methods x 7 shifts x context lengths. In one panel its 14 lines and their legend left
    no room for the plot; each shift now gets a panel of its own, with a line per method."""
    from lit_icl.report import report_figure

    def rows(shifts: int) -> list[dict]:
        return [{**result_row("mse", 1.0 / n + k, method=m, shift=f"s{k}", n_context=n), "experiment": "e"}
                for m in ("coqe", "least_squares") for k in range(shifts) for n in (5, 10, 20)]

    fig = report_figure(rows(7), "n_context", "mse")
    assert len(fig.axes) == 7
    assert [ax.get_title() for ax in fig.axes] == [f"shift=s{k}" for k in range(7)]
    assert all([t.get_text() for t in ax.get_legend().get_texts()] == ["coqe", "least_squares"] for ax in fig.axes)
    fig = report_figure(rows(2), "n_context", "mse")  # 4 lines: one panel will do
    assert len(fig.axes) == 1 and len(fig.axes[0].get_lines()) == 4


def test_a_repeated_test_of_one_checkpoint_counts_once_with_a_note(tmp_path, capsys) -> None:
    """Testing the same checkpoint twice with the same config and seeds gives the same numbers twice: averaged as
    two replicates they would narrow the sd to 0 and outweigh the other seeds."""
    def run(path, acc: float, seed: int, ckpt_seed: int) -> str:
        config = {"seed_everything": seed, "model": {"init_args": {"lr": 0.003}},
                  "data": {"init_args": {"data_seed": seed}},
                  "trainer": {"logger": {"init_args": {"name": "T", "version": path.name}}}}
        write_results(path, [result_row("accuracy", acc, method="E2E")],
                      {"config": config, "checkpoint": f"runs/F/s{ckpt_seed}/checkpoints/last.ckpt",
                       "trained_steps": 40})
        return str(path)

    runs = [run(tmp_path / "a", 0.70, 0, 0), run(tmp_path / "b", 0.90, 1, 1), run(tmp_path / "a_again", 0.70, 0, 0)]
    report(runs)
    out = capsys.readouterr()
    assert "n = 2 runs per cell" in out.out
    assert f"| E2E | 0.800 ± {statistics.stdev([0.70, 0.90]):.3f} |" in out.out
    assert out.err.strip() == (f"lit_icl.report: note: {runs[2]} repeats {runs[0]} (the same checkpoint, config "
                               "and seeds); counted once")
    # Another seed for the same checkpoint (other test data) is a replicate of its own.
    runs.append(run(tmp_path / "a_seed2", 0.60, 2, 0))
    report(runs)
    assert "n = 3 runs per cell" in capsys.readouterr().out


def test_seeds_logged_under_names_of_their_own_are_labelled_by_what_the_names_share(tmp_path, capsys) -> None:
    """The results pages name seed runs ``coqe_s0``, ``coqe_s1``: pooled, they were labelled ``coqe_s0``, as if the
    line were that one run's."""
    for s in range(2):
        config = {"seed_everything": s, "trainer": {"logger": {"init_args": {"name": f"coqe_s{s}"}}}}
        write_results(tmp_path / f"c{s}", [result_row("mse", 0.1 * (s + 1), method="coqe")], {"config": config})
    other = {"seed_everything": 0, "model": {"lr": 0.1}, "trainer": {"logger": {"init_args": {"name": "lr01"}}}}
    write_results(tmp_path / "o", [result_row("mse", 0.5, method="coqe")], {"config": other})
    runs = [load_results(tmp_path / name) for name in ("c0", "c1", "o")]
    assert label_runs(runs) == ["coqe_s*", "coqe_s*", "lr01"]
    report([str(tmp_path / name) for name in ("c0", "c1", "o")])
    table = capsys.readouterr().out
    assert "| coqe_s* | coqe | 0.150 ± 0.071 |" in table and "| lr01 | coqe | 0.500 |" in table


def _test_of(path, acc: float, seed: int, ckpt: str, **fit_sections) -> str:
    """A test of ``runs/F/s<seed>/checkpoints/<ckpt>``, whose fit's config has ``fit_sections`` besides its own."""
    test = {"seed_everything": seed, "data": {"init_args": {"data_seed": seed}},
            "trainer": {"logger": {"init_args": {"name": "T", "version": path.name}}}}
    fit = {"seed_everything": seed, "data": {"init_args": {"data_seed": seed}}, "trainer": {"max_steps": 9},
           "early_stopping": {"patience": None, "monitor": None}, "optimizer": None, **fit_sections}
    write_results(path, [result_row("accuracy", acc, method="E2E")],
                  {"config": test, "fit_config": fit, "checkpoint": f"runs/F/s{seed}/checkpoints/{ckpt}"})
    return str(path)


def test_tests_of_a_fits_last_and_best_checkpoints_are_two_experiments_not_two_seeds(tmp_path, capsys) -> None:
    """Testing each seed's ``last.ckpt`` and its ``best-*.ckpt``: the report averaged a seed's best and last as two
    runs of one experiment ("n = 4" over 2 seeds). Which checkpoint was tested now tells them apart; the best
    checkpoints of different seeds, at different steps, still pool."""
    runs = [_test_of(tmp_path / "l0", 0.70, 0, "last.ckpt"), _test_of(tmp_path / "l1", 0.80, 1, "last.ckpt"),
            _test_of(tmp_path / "b0", 0.90, 0, "best-epoch=3-step=120.ckpt"),
            _test_of(tmp_path / "b1", 0.95, 1, "best-epoch=5-step=200.ckpt")]
    report(runs)
    table = capsys.readouterr().out
    assert "n = 2 runs per cell" in table and table.count("| E2E |") == 2
    assert f"0.750 ± {statistics.stdev([0.70, 0.80]):.3f}" in table
    assert f"0.925 ± {statistics.stdev([0.90, 0.95]):.3f}" in table


def test_fits_with_another_early_stopping_rule_or_cli_optimizer_are_other_experiments(tmp_path, capsys) -> None:
    """Fits that differ only in ``--early_stopping.patience`` (or ``--optimizer``) trained differently; their tests
    were pooled as seeds because only the fit's model, data and trainer sections were compared."""
    stop = {"early_stopping": {"patience": 5, "monitor": "val/acc"}}
    runs = [_test_of(tmp_path / "a", 0.70, 0, "last.ckpt"), _test_of(tmp_path / "b", 0.80, 1, "last.ckpt", **stop),
            _test_of(tmp_path / "c", 0.60, 2, "last.ckpt", optimizer={"class_path": "torch.optim.SGD"})]
    report(runs)
    table = capsys.readouterr().out
    assert "n = 1 runs per cell" in table and table.count("| E2E |") == 3
    runs.append(_test_of(tmp_path / "d", 0.90, 3, "last.ckpt", **stop))  # another seed of the rule: pooled
    report(runs)
    assert f"0.850 ± {statistics.stdev([0.80, 0.90]):.3f}" in capsys.readouterr().out
