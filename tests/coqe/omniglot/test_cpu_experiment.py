"""The CPU-scale CoQE driver (experiments/coqe_omniglot_cpu.py): its Pareto check, table and figure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import load_script

SCRIPT = Path(__file__).parents[3] / "experiments/coqe_omniglot_cpu.py"


@pytest.fixture(scope="module")
def driver():
    return load_script(SCRIPT)


def test_pareto_dominance(driver) -> None:
    others = [(0.95, 0.20), (0.60, 0.90), (0.92, 0.70), (0.90, 0.65)]
    assert driver.dominated_by((0.91, 0.66), others) == [(0.92, 0.70)]
    assert driver.dominated_by((0.93, 0.71), others) == []
    assert driver.dominated_by((0.90, 0.65), others) == [(0.92, 0.70)]  # itself is not a dominator


def _fake_run(out: Path, arm: str, seed: int, acc: dict[str, float], fit_s: float) -> None:
    """A finished fit (``done`` marker with its wall time) and its test's ``results.json``, as the runner leaves
    them."""
    fit, test = out / arm / f"s{seed}", out / arm / f"s{seed}_test"
    for folder, wall in ((fit, fit_s), (test, 30.0)):
        folder.mkdir(parents=True)
        (folder / "done").write_text(f"{wall} s\ncpu {wall} s\n")
    rows = [{"metric": "accuracy", "evaluator": k, "value": v} for k, v in acc.items()]
    (test / "results.json").write_text(json.dumps({"rows": rows, "meta": {"trained_steps": 4000}}))


def test_collect_and_table_average_over_seeds_from_run_folders_and_from_their_csv(driver, tmp_path) -> None:
    out = tmp_path / "grid"
    _fake_run(out, "coqe", 0, {"icl": 0.9, "iwl": 0.6, "iwl_static": 0.8}, 600)
    _fake_run(out, "coqe", 1, {"icl": 0.8, "iwl": 0.7, "iwl_static": 0.9}, 700)
    _fake_run(out, "transformer_bursty", 0, {"icl": 0.95, "iwl": 0.65}, 500)
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out / "coqe" / "s0"))  # seed 0's validation ICL curve; seed 1 logged none
    for step, value in ((999, 0.5), (1999, 0.75)):
        writer.add_scalar("val/acc/icl", value, step)
    writer.close()
    args = driver.parse_args(["report", "--out", str(out), "--seeds", "0", "1", "--csv", str(tmp_path / "g.csv")])
    found = driver.collect(args)
    assert sorted(found) == ["coqe", "transformer_bursty"] and sorted(found["coqe"]) == [0, 1]
    text = driver.table(found)
    assert "| `coqe` | 0, 1 | 0.850 ± 0.071 | 0.650 ± 0.071 | 0.850 ± 0.071 | 4000 | 600-700 |" in text
    assert "| `transformer_bursty` | 0 | 0.950 | 0.650 | - |" in text
    assert "CoQE seed 0 (0.900, 0.600): dominated by (0.950, 0.650)" in text
    assert "CoQE seed 1 (0.800, 0.700): not dominated" in text
    assert found["coqe"][0]["curves"] == {"icl": [(999, pytest.approx(0.5)), (1999, pytest.approx(0.75))]}
    assert found["coqe"][1]["curves"] == {}
    driver.figure(found, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"
    # The tidy CSV that `report --csv` wrote gives the same table and curves with no run folders.
    again = driver.collect(driver.parse_args(["report", "--out", str(tmp_path / "g.csv"), "--seeds", "0", "1"]))
    assert driver.table(again) == text
    assert again["coqe"][0]["curves"] == found["coqe"][0]["curves"]


def test_grid_fits_every_arm_per_seed_and_tests_each_from_its_last_checkpoint(driver, tmp_path) -> None:
    args = driver.parse_args(["fit", "--out", str(tmp_path), "--arms", "coqe_noise_free", "transformer_iid",
                              "--seeds", "0", "1", "--", "--trainer.max_steps", "24000"])
    fits = driver.fit_jobs(args)
    assert [j.name for j in fits] == ["fit coqe_noise_free s0", "fit transformer_iid s0", "fit coqe_noise_free s1",
                                      "fit transformer_iid s1"]
    for fit in fits:
        arm, seed = fit.folder.parent.name, fit.folder.name[1:]
        configs = [fit.argv[i + 1] for i, a in enumerate(fit.argv) if a == "--config"]
        assert configs == [str(driver.REPO / c) for c in driver.ARMS[arm][0]]
        assert fit.argv[fit.argv.index("--seed_everything") + 1] == seed
        assert fit.argv[fit.argv.index("--data.init_args.data_seed") + 1] == seed
        # The arm's own overrides, then the user's after --, so the user's win.
        assert fit.argv.index("--trainer.max_steps") > max((fit.argv.index(a) for a in driver.ARMS[arm][1]
                                                             if a.startswith("--")), default=0)
    assert fits[0].argv[fits[0].argv.index("--model.init_args.noise") + 1] == "null"
    for test, fit in zip(driver.test_jobs(args), fits):
        assert test.after == [fit.folder] and test.folder == fit.folder.with_name(fit.folder.name + "_test")
        assert test.argv[:3] == ["test", "--config", str(fit.folder / "config.yaml")]
        assert test.argv[test.argv.index("--ckpt_path") + 1] == str(fit.folder / "checkpoints" / "last.ckpt")


def test_transformer_curves_reads_tensorboard_and_draws(tmp_path, capsys) -> None:
    from torch.utils.tensorboard import SummaryWriter

    spec = importlib.util.spec_from_file_location("coqe_transformer_curves", SCRIPT.with_name("coqe_transformer_curves.py"))
    curves = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(curves)
    run = tmp_path / "run"
    with SummaryWriter(run) as w:
        for step in (249, 499, 999, 1999):
            w.add_scalar("val/acc/icl", 0.5 + step / 10_000, step)
            w.add_scalar("val/acc/iwl", 0.1, step)
    got = curves.curves(run)
    assert [s for s, _ in got["val/acc/icl"]] == [249, 499, 999, 1999]
    assert abs(got["val/acc/icl"][-1][1] - 0.6999) < 1e-6
    curves.main([f"tiny={run}", "--every", "1000", "--fig", str(tmp_path / "f.png")])
    out = capsys.readouterr().out
    assert "999:0.600" in out and "1999:0.700" in out and "499:" not in out  # the last of each block of 1000
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_report_refuses_an_empty_grid_in_one_line_and_notes_a_figure_without_curves(driver, tmp_path, capsys) -> None:
    """An empty grid ended with a bare message and status 1; fits too short to validate drew three empty panels
    without a word."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as refused:
        driver.report(driver.parse_args(["report", "--out", str(tmp_path / "empty")]))
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith(f"coqe_omniglot_cpu.py: error: no tested runs under {tmp_path / 'empty'}")
    out = tmp_path / "grid"
    _fake_run(out, "coqe", 0, {"icl": 0.9, "iwl": 0.6, "iwl_static": 0.8}, 600)  # no validation curves
    driver.report(driver.parse_args(["report", "--out", str(out), "--seeds", "0", "--fig", str(tmp_path / "f.png")]))
    assert capsys.readouterr().err.startswith(f"note: {tmp_path / 'f.png'}: the fits logged no validation round")
    assert (tmp_path / "f.png").is_file()
